-- wrk script of `bench_leases`: every connection POSTs the grant request in a loop (closed loop)
-- and counts answers by status; done() prints one JSON line for leases/bench/leases.py.
-- The body and the token come from the environment (BENCH_BODY, BENCH_TOKEN).

wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("BENCH_TOKEN")

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  granted, refused, errors, conflicts, samples = 0, 0, 0, 0, ""
end

function response(status, headers, body)
  if status == 201 then
    granted = granted + 1
    local attempts = body:match('"attempts":%s*(%d+)')
    if attempts then
      conflicts = conflicts + tonumber(attempts) - 1
    end
  elseif status == 409 then
    refused = refused + 1
    local c = body:match('"conflicts":%s*(%d+)')
    if c then
      conflicts = conflicts + tonumber(c)
    end
  else
    errors = errors + 1
    if #samples < 600 then
      samples = samples .. status .. ": " .. body:sub(1, 200):gsub('[%c"\\]', " ") .. "|"
    end
  end
end

function done(summary, latency, requests)
  local g, r, e, c, s = 0, 0, 0, 0, ""
  for _, t in ipairs(threads) do
    g = g + t:get("granted")
    r = r + t:get("refused")
    e = e + t:get("errors")
    c = c + t:get("conflicts")
    s = s .. t:get("samples")
  end
  local se = summary.errors
  io.write(string.format(
    '\nBENCH_JSON {"granted": %d, "refused": %d, "errors": %d, "socket_errors": %d, '
      .. '"conflicts": %d, "requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, '
      .. '"max_us": %d, "samples": "%s"}\n',
    g, r, e, se.connect + se.read + se.write + se.timeout, c, summary.requests,
    summary.duration, latency:percentile(50), latency:percentile(99), latency.max, s
  ))
end
