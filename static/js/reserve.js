// The leases page's reservation form: says, as the window is typed, how long the reservation
// will hold its capacity — from now (data-now, the server's clock) until the window's end —
// and how much of that is the window itself. The inputs are UTC (datetime-local, no zone).
(function () {
  "use strict";

  function span(ms) {
    const minutes = Math.round(ms / 60000);
    const h = Math.floor(minutes / 60);
    const m = minutes % 60;
    return h ? `${h} h ${m} min` : `${m} min`;
  }

  function utc(value) {
    const date = new Date(value + "Z");
    return Number.isNaN(date.getTime()) ? null : date;
  }

  document.addEventListener("DOMContentLoaded", () => {
    const box = document.getElementById("reserve-holds");
    const out = document.getElementById("reserve-hold");
    const start = document.getElementById("f-start");
    const end = document.getElementById("f-end");
    if (!box || !out || !start || !end) return;
    const loaded = Date.now();
    const serverNow = new Date(box.dataset.now).getTime();

    function update() {
      const from = utc(start.value);
      const to = utc(end.value);
      if (!from || !to || to <= from) {
        out.textContent = "";
        return;
      }
      const now = serverNow + (Date.now() - loaded);
      const held = to.getTime() - now;
      if (held <= 0) {
        out.textContent = "";
        return;
      }
      const length = to - from;
      out.textContent =
        `This reservation would hold its capacity for ${span(held)}, from now until ` +
        `${to.toISOString().slice(0, 16).replace("T", " ")} UTC; the window itself is ${span(length)}` +
        (from.getTime() > now ? `, starting in ${span(from.getTime() - now)}.` : ".");
    }

    start.addEventListener("input", update);
    end.addEventListener("input", update);
    update();
  });
})();
