"""The marketplace validation probe, run for real (docs/nodes.md, "Validation probes").

The control plane sends a fresh challenge with each validation probe (heartbeat answer,
`probes[].challenge`): a seed, an iteration count, a number of parallel chains, a memory size,
the claimed GPU UUIDs and the image to run in (pinned by digest). The agent runs it through the
same execution path as a job — its runtime's pull, create, start, logs, wait and remove; the
Docker runtime puts it in a container with the lease-like limits below, the process runtime in a
subprocess — and answers with what the container printed and how long it took:

- chain i iterates sha256 over `<seed>-<i>` (`printf %s "$x" | sha256sum`, busybox), all chains
  in parallel with one CPU each (the container's CPU quota is the number of chains);
- `memory_mib` MiB are written into /scratch, a tmpfs of exactly that size (RAM counted against
  the container's memory limit; `Limits.scratch_in_memory`, the probes' own: a job's scratch is
  on disk) — under the process runtime a plain directory, which proves
  nothing about memory: that runtime is for trusted development pools only;
- the GPU UUIDs the container sees (nvidia-smi where the NVIDIA runtime injects it, else the
  driver's /proc entries); a node without GPUs lists none.

The script is built here from the challenge's numbers, each checked: nothing the control plane
(or anyone who forged an answer of it) sends is executed as text.

Recovery probes (a device taken out of scheduling after a health problem) are answered by
`recovery_result`: the device measured again through NVML and, under the Docker runtime, a short
container that requests exactly that device (docs/nodes.md, "Recovery probes").

Both kinds carry the GPU challenge where the control plane asks it (`challenge.gpu_kernel`,
docs/nodes.md "GPU challenge"): `run_gpu_kernel` runs worker_agent/gpu_kernel.py the way jobs
run — under a container runtime, a container of the GPU probe image with the challenged devices
as its device request and this package mounted read-only; where there is no container runtime
(the process runtime), directly in the agent's process — and answers in `result.gpu_kernel`.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pynvml

from worker_agent import gpu_kernel
from worker_agent.inventory import read_gpus
from worker_agent.runtime import disks
from worker_agent.runtime.base import Assignment, Limits, RuntimeFailure, VolumeMount
from worker_agent.runtime.protocol import Runtime

if TYPE_CHECKING:  # the recovery probe's container check needs the engine itself
    from worker_agent.runtime.docker import DockerRuntime

log = logging.getLogger(__name__)

SEED_RE = re.compile(r"^[0-9a-f]{8,64}$")
ITERATIONS_MAX = 1_000_000
WORKERS_MAX = 64
MEMORY_MAX_MIB = 1 << 20
MEMORY_MARGIN_MIB = 64  # the shell and busybox beside the filled tmpfs
PROBE_OUTPUT_MIB = 4  # a probe writes nothing to /outputs; the runtime bounds it anyway
UUID_RE = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]{1,76}$")
LINE_RE = re.compile(r"^(answer|memory|gpu) (\S+)(?: (\S+))?$")

SCRIPT = r"""
chain() {
  x="$1-$2"; i=0
  while [ $i -lt ITERATIONS ]; do x=$(printf %s "$x" | sha256sum | cut -c1-64); i=$((i+1)); done
  echo "answer $2 $x"
}
w=0
while [ $w -lt WORKERS ]; do chain SEED $w & w=$((w+1)); done
wait
if head -c $((MEMORY * 1048576)) /dev/zero > "$SCRATCH_DIR/fill"; then
  echo "memory $(( $(wc -c < "$SCRATCH_DIR/fill") / 1048576 ))"
fi
rm -f "$SCRATCH_DIR/fill"
if command -v nvidia-smi > /dev/null 2>&1; then
  nvidia-smi --query-gpu=uuid --format=csv,noheader | sed 's/^/gpu /'
else
  cat /proc/driver/nvidia/gpus/*/information 2> /dev/null | sed -n 's/^GPU UUID:[[:space:]]*/gpu /p'
fi
echo done
"""


class ChallengeInvalid(ValueError):
    """The challenge is not one this agent runs (out of range, unknown form)."""


def check_challenge(challenge: dict) -> dict:
    """The challenge's values, typed and bounded; ChallengeInvalid otherwise."""
    try:
        seed = str(challenge["seed"])
        iterations, workers = int(challenge["iterations"]), int(challenge["workers"])
        memory = int(challenge["memory_mib"])
        gpus = [str(uuid) for uuid in challenge.get("gpus") or ()]
        seconds_max = float(challenge.get("seconds_max") or 600)
    except (KeyError, TypeError, ValueError) as exc:
        raise ChallengeInvalid(f"unreadable challenge: {exc}") from exc
    if not SEED_RE.match(seed):
        raise ChallengeInvalid("the seed is not 8-64 lowercase hex characters")
    if not (0 < iterations <= ITERATIONS_MAX and 0 < workers <= WORKERS_MAX):
        raise ChallengeInvalid("iterations or workers out of range")
    if not 0 < memory <= MEMORY_MAX_MIB or not all(UUID_RE.match(g) for g in gpus):
        raise ChallengeInvalid("memory or GPU list out of range")
    return {
        "seed": seed,
        "iterations": iterations,
        "workers": workers,
        "memory_mib": memory,
        "gpus": gpus,
        "image": str(challenge.get("image") or ""),
        "seconds_max": max(1.0, min(seconds_max, 86400.0)),
    }


def probe_script(challenge: dict) -> str:
    numbers = {
        "ITERATIONS": challenge["iterations"],
        "WORKERS": challenge["workers"],
        "MEMORY": challenge["memory_mib"],
        "SEED": challenge["seed"],
    }
    return re.sub(r"\b(ITERATIONS|WORKERS|MEMORY|SEED)\b", lambda m: str(numbers[m[1]]), SCRIPT)


def probe_assignment(probe_id: int, challenge: dict) -> Assignment:
    """The probe as a run of the job path: no network, one CPU per chain, a tmpfs of the
    memory to fill, the claimed GPUs as the device request."""
    return Assignment(
        job=0,
        attempt=1,
        lease=int(probe_id),
        fencing_token="0",
        image=challenge["image"],
        command=("sh", "-c", probe_script(challenge)),
        name=f"probe-{int(probe_id)}",
        network_mode="none",
        max_runtime_s=int(challenge["seconds_max"] * 2) + 60,
        stop_grace_s=0,
        limits=Limits(
            cpu_millicores=challenge["workers"] * 1000,
            memory_mib=challenge["memory_mib"] + MEMORY_MARGIN_MIB,
            scratch_mib=challenge["memory_mib"],
            scratch_in_memory=True,
            output_limit_mib=PROBE_OUTPUT_MIB,
            pids=challenge["workers"] * 8 + 64,
            gpus=tuple(challenge["gpus"]),
        ),
    )


def parse_output(text: str) -> dict:
    answers: dict[int, str] = {}
    memory, gpus = 0, []
    for line in text.splitlines():
        match = LINE_RE.match(line.strip())
        if not match:
            continue
        kind, first, second = match.groups()
        if (
            kind == "answer"
            and second
            and first.isdigit()
            and re.fullmatch(r"[0-9a-f]{64}", second)
        ):
            answers[int(first)] = second
        elif kind == "memory" and first.isdigit():
            memory = int(first)
        elif kind == "gpu" and UUID_RE.match(first) and first not in gpus:
            gpus.append(first)
    ordered = [answers[i] for i in sorted(answers)]
    return {"answers": ordered[:WORKERS_MAX], "memory_mib": memory, "gpus": gpus[:512]}


def run_once(assignment: Assignment, *, runtime: Runtime, workdir: Path) -> tuple:
    """Run one probe container through the runtime's job path: (ended, output, seconds).
    Raises RuntimeFailure; `ended` is None when it ran past its maximum and was killed."""
    (workdir / "inputs").mkdir(parents=True, exist_ok=True)
    (workdir / "inputs").chmod(0o777)
    if not runtime.bounds_disks:  # asked for none (/scratch a folder)
        limits = replace(assignment.limits, output_limit_mib=0, scratch_mib=0)
        assignment = replace(assignment, limits=limits)
    handle = None
    try:
        runtime.pull(assignment)
        handle = runtime.create(assignment, workdir)
        started = time.monotonic()
        runtime.start(handle)
        follower = runtime.logs(handle)
        ended = runtime.wait(handle, timeout=assignment.max_runtime_s)
        seconds = round(time.monotonic() - started, 3)
        if ended is None:
            runtime.stop(handle, 0)
            return None, "", seconds
        follower.join(5)
        return ended, follower.take(), seconds
    finally:
        if handle is not None:
            runtime.remove(handle)
        disks.delete(workdir)


def run_challenge(probe_id: int, challenge: dict, *, runtime: Runtime, workdir: Path) -> dict:
    """The challenge's answer (`answers`, `seconds`, `memory_mib`, `gpus`), or `error` saying
    why it could not run."""
    try:
        challenge = check_challenge(challenge)
    except ChallengeInvalid as exc:
        return {"error": str(exc)}
    assignment = probe_assignment(probe_id, challenge)
    try:
        ended, text, seconds = run_once(assignment, runtime=runtime, workdir=workdir)
    except RuntimeFailure as exc:
        return {"error": f"{exc.reason}: {exc.message}"[:500]}
    if ended is None:
        return {"error": f"the probe ran past {assignment.max_runtime_s}s and was killed"}
    answer = parse_output(text)
    if ended.exit_code not in (0, None) and not answer["answers"]:
        return {"error": f"the probe exited with {ended.exit_code}: {ended.message}"[:500]}
    return answer | {"seconds": seconds}


def probe_result(
    probe: dict,
    *,
    runtime: Runtime,
    workdir: Path,
    inventory: dict,
    run_in_process: Kernel = gpu_kernel.run_challenge,
) -> dict:
    """The whole result of a validation probe: what this host measures of itself (compared with
    the claims) and the challenge's answer (checked by the control plane)."""
    answer = run_challenge(
        int(probe["id"]), probe.get("challenge") or {}, runtime=runtime, workdir=workdir
    )
    result = {
        "cpu_millicores": int(inventory.get("cpu_millicores") or 0),
        "memory_mib": int(inventory.get("memory_mib") or 0),
        "gpus": [
            {"uuid": g["uuid"], "model": g.get("model", ""), "memory_mib": g.get("memory_mib", 0)}
            for g in inventory.get("gpus") or []
        ],
        "challenge": answer,
    }
    rounds = len(answer.get("answers") or ()) * int(
        (probe.get("challenge") or {}).get("iterations") or 0
    )
    if rounds and answer.get("seconds"):
        result["benchmark"] = {"sha256_rounds_per_second": round(rounds / answer["seconds"], 1)}
    kernel = (probe.get("challenge") or {}).get("gpu_kernel")
    if isinstance(kernel, dict) and kernel.get("gpus"):
        result["gpu_kernel"] = run_gpu_kernel(
            int(probe["id"]),
            kernel,
            runtime=runtime,
            workdir=workdir,
            nvml_gpus=result["gpus"],
            run_in_process=run_in_process,
        )
    return result


# --------------------------------------------------------------------------- the GPU challenge

AGENT_MOUNT = "/opt/compute-pool-agent"  # this package, read-only, in the GPU probe container
AGENT_PACKAGE = Path(gpu_kernel.__file__).resolve().parent
GPU_KERNEL_SECONDS_MAX = 600  # the container's bound (the kernels themselves take seconds)
GPU_KERNEL_MEMORY_MIB = 2048  # host memory of the container: python, the driver, the context
GPU_ANSWER_MAX = 1 << 20  # characters of the answer line

Kernel = Callable[[list], dict]


def gpu_kernel_assignment(probe_id: int, gpus: list[dict], image: str) -> Assignment:
    """The GPU challenge as a run of the job path: the probe image (python3), no network, the
    challenged devices as its device request (as a job's leased GPUs), this package mounted
    read-only, `python3 -m worker_agent.gpu_kernel '<the checked challenge>'` as its command."""
    return Assignment(
        job=0,
        attempt=1,
        lease=int(probe_id),
        fencing_token="0",
        image=image,
        command=(
            "python3",
            "-B",
            "-m",
            "worker_agent.gpu_kernel",
            json.dumps(gpus, separators=(",", ":")),
        ),
        name=f"gpu-probe-{int(probe_id)}",
        network_mode="none",
        env={
            "PYTHONPATH": AGENT_MOUNT,
            "PYTHONDONTWRITEBYTECODE": "1",
            # the driver's compute libraries (libcuda) injected, not only nvidia-smi
            "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        },
        volumes=(
            VolumeMount(
                id=0,
                size_mib=0,
                path=f"{AGENT_MOUNT}/worker_agent",
                read_only=True,
                source=str(AGENT_PACKAGE),
            ),
        ),
        max_runtime_s=GPU_KERNEL_SECONDS_MAX,
        stop_grace_s=0,
        limits=Limits(
            cpu_millicores=1000,
            memory_mib=GPU_KERNEL_MEMORY_MIB,
            pids=256,
            gpus=tuple(gpu["uuid"] for gpu in gpus),
            gpu_isolation="exclusive",
            output_limit_mib=PROBE_OUTPUT_MIB,
        ),
    )


def parse_gpu_answer(text: str) -> dict:
    """The answer line the container printed, or why there is none."""
    for line in reversed(text.splitlines()):
        if line.startswith(gpu_kernel.ANSWER_PREFIX) and len(line) <= GPU_ANSWER_MAX:
            try:
                answer = json.loads(line[len(gpu_kernel.ANSWER_PREFIX) :])
            except ValueError:
                break
            if isinstance(answer, dict):
                return answer
            break
    tail = text.strip()[-200:]
    return {"error": f"the GPU probe container printed no answer: {tail}"[:500]}


def run_gpu_container(probe_id: int, kernel: dict, *, runtime: Runtime, workdir: Path) -> dict:
    image = str(kernel.get("image") or "")
    if not re.fullmatch(r"[^\s@]+@sha256:[0-9a-f]{64}", image):
        return {"error": "no GPU probe image (NODE_GPU_PROBE_IMAGE) to run the challenge in"}
    assignment = gpu_kernel_assignment(probe_id, kernel["gpus"], image)
    try:
        ended, text, _seconds = run_once(assignment, runtime=runtime, workdir=workdir)
    except RuntimeFailure as exc:
        return {"error": f"{exc.reason}: {exc.message}"[:500]}
    if ended is None:
        return {"error": f"the GPU probe ran past {GPU_KERNEL_SECONDS_MAX}s and was killed"}
    return parse_gpu_answer(text)


def run_gpu_kernel(
    probe_id: int,
    kernel: dict,
    *,
    runtime: Runtime | None,
    workdir: Path,
    nvml_gpus: list[dict],
    run_in_process: Kernel = gpu_kernel.run_challenge,
) -> dict:
    """The GPU challenge's answer: in a container through `runtime`, or in this process where
    there is no container runtime (None, or the process runtime). Each GPU's answer carries the
    model and memory NVML reports for it (`nvml_gpus`: the inventory's entries)."""
    try:
        kernel = dict(kernel) | {"gpus": gpu_kernel.check_gpu_challenge(kernel.get("gpus"))}
    except gpu_kernel.ChallengeInvalid as exc:
        return {"error": str(exc)[:500]}
    if runtime is None or runtime.name == "process":
        answer = run_in_process(kernel["gpus"])
    else:
        answer = run_gpu_container(probe_id, kernel, runtime=runtime, workdir=workdir)
    by_uuid = {g.get("uuid"): g for g in nvml_gpus}
    gpus = answer.get("gpus") if isinstance(answer.get("gpus"), list) else []
    for item in gpus:
        seen = by_uuid.get(item.get("uuid")) if isinstance(item, dict) else None
        if seen is not None:
            item["model"] = str(seen.get("model") or "")[:96]
            item["memory_mib"] = int(seen.get("memory_mib") or 0)
    return answer


# --------------------------------------------------------------------------- recovery probes
# A recovery probe names one device taken out of scheduling (nodes/services/health.py). The
# agent measures it again through NVML (the same reader as its inventory and heartbeats) and,
# under the Docker runtime, runs a short container with exactly that device requested. It
# reports what it saw; the control plane decides (nodes.health_rules.gpu_health_evaluate).

READING_KEYS = (
    "temperature_c",
    "slowdown_temperature_c",
    "pcie_link_width",
    "pcie_link_width_max",
    "ecc_errors_uncorrected",
    "nvlink_down",
)
ERROR_MAX = 200  # the result's `error` (nodes/api/serializers.py GpuReadingSerializer)
RECOVERY_SECONDS_MAX = 60
# The UUIDs the container sees: nvidia-smi where it can run (it needs a libc the scratch test
# image lacks), and the driver's /proc entries, which the NVIDIA runtime limits to the devices
# requested.
RECOVERY_SCRIPT = r"""
{ nvidia-smi --query-gpu=uuid --format=csv,noheader 2> /dev/null
  cat /proc/driver/nvidia/gpus/*/information 2> /dev/null | sed -n 's/^GPU UUID:[[:space:]]*//p'
} | sed 's/^/gpu /'
echo done
"""


def clip(prefix: str, detail: str) -> str:
    """prefix + detail within ERROR_MAX, keeping the detail's end (where the engine's own
    explanation is: "could not select device driver …")."""
    room = ERROR_MAX - len(prefix)
    return prefix + (detail if len(detail) <= room else "…" + detail[-(room - 1) :])


def recovery_device(probe: dict) -> str:
    """The probed device's UUID (the probe's `gpu`, else `expected.uuid`); "" if unreadable."""
    uuid = probe.get("gpu") or (probe.get("expected") or {}).get("uuid") or ""
    return uuid if isinstance(uuid, str) and UUID_RE.match(uuid) else ""


def not_visible(uuid: str, why: str) -> dict:
    return {"passed": False, "error": f"device {uuid or '?'} not visible: {why}"[:ERROR_MAX]}


def measure_device(nvml, uuid: str) -> dict | None:
    """The device's NVML readings and inventory (model, memory) as a probe result; None when
    NVML shows no device with that UUID. Raises pynvml.NVMLError when NVML fails."""
    reading = read_gpus(nvml)
    health = next((h for h in reading["health"] if h["uuid"] == uuid), None)
    gpu = next((g for g in reading["gpus"] if g["uuid"] == uuid), None)
    if health is None or gpu is None:
        return None
    result = {key: health[key] for key in READING_KEYS if health.get(key) is not None}
    result["gpus"] = [{"uuid": uuid, "model": gpu["model"][:60], "memory_mib": gpu["memory_mib"]}]
    return result


def recovery_assignment(probe_id: int, uuid: str, image: str) -> Assignment:
    """A small container holding exactly the probed device, no network."""
    return Assignment(
        job=0,
        attempt=1,
        lease=int(probe_id),
        fencing_token="0",
        image=image,
        command=("sh", "-c", RECOVERY_SCRIPT),
        name=f"recovery-{int(probe_id)}",
        network_mode="none",
        max_runtime_s=RECOVERY_SECONDS_MAX,
        stop_grace_s=0,
        limits=Limits(
            cpu_millicores=500,
            memory_mib=64,
            pids=32,
            gpus=(uuid,),
            gpu_isolation="exclusive",
            output_limit_mib=PROBE_OUTPUT_MIB,
        ),
    )


def recovery_image(probe: dict, runtime: DockerRuntime) -> str:
    """The image to run in: the probe's own when it names one by digest, else the runtime's
    pause image pinned by its digest (`--pause-image`, which every node has)."""
    image = str((probe.get("challenge") or {}).get("image") or "")
    if re.fullmatch(r"[^\s@]+@sha256:[0-9a-f]{64}", image):
        return image
    return runtime.helper_image()


def device_container_check(probe_id: int, uuid: str, image: str, *, runtime, workdir) -> dict:
    """`health_check` passed when the container ran with the device and saw it; else failed
    with the `error` saying why."""
    assignment = recovery_assignment(probe_id, uuid, image)
    try:
        ended, text, _seconds = run_once(assignment, runtime=runtime, workdir=workdir)
    except RuntimeFailure as exc:
        why = clip("a container with the device did not run: ", f"{exc.reason}: {exc.message}")
        return {"health_check": "failed", "error": why}
    if ended is None:
        why = f"the device container ran past {RECOVERY_SECONDS_MAX}s and was killed"
        return {"health_check": "failed", "error": why}
    if uuid not in parse_output(text)["gpus"]:
        why = f"the device is not visible in a container that requested it (exit {ended.exit_code})"
        return {"health_check": "failed", "error": why[:ERROR_MAX]}
    return {"health_check": "passed"}


def recovery_result(
    probe: dict,
    *,
    nvml,
    runtime: DockerRuntime | None = None,
    workdir: Path,
    run_in_process: Kernel = gpu_kernel.run_challenge,
) -> dict:
    """The answer to a recovery probe, in the form of the control plane's probe result
    (nodes/api/serializers.py ProbeMeasurementSerializer): the device's readings, `passed`
    when NVML shows it and (under Docker) a container that requested it saw it.

    `nvml` is None where no NVIDIA driver answers; `runtime` is the Docker runtime, or None
    where the node has no engine (the container check is then left out, and the GPU challenge,
    when the probe carries one, runs in this process)."""
    uuid = recovery_device(probe)
    if not uuid:
        return {"passed": False, "error": "the probe names no device"}
    if nvml is None:
        return not_visible(uuid, "NVML unavailable (no NVIDIA driver on this node)")
    try:
        result = measure_device(nvml, uuid)
    except pynvml.NVMLError as exc:
        return not_visible(uuid, f"NVML failed: {exc}")
    if result is None:
        return not_visible(uuid, "NVML lists no device with this UUID")
    result["passed"] = True
    if runtime is not None:
        try:
            image = recovery_image(probe, runtime)
        except RuntimeFailure as exc:
            check = {"health_check": "failed", "error": f"no image to run: {exc.message}"}
        else:
            check = device_container_check(
                int(probe["id"]), uuid, image, runtime=runtime, workdir=workdir
            )
        result |= check
        result["passed"] = check["health_check"] == "passed"
    kernel = (probe.get("challenge") or {}).get("gpu_kernel")
    if isinstance(kernel, dict) and kernel.get("gpus"):  # the same kernel as validation
        result["gpu_kernel"] = run_gpu_kernel(
            int(probe["id"]),
            kernel,
            runtime=runtime,
            workdir=workdir,
            nvml_gpus=result["gpus"],
            run_in_process=run_in_process,
        )
    return result
