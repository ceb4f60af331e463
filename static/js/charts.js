// The operators' time series (templates/ops/_timeseries.html): the point under the pointer, or
// the focused one, is shown in the chart's readout (aria-live) and marked by a cursor line.
// Arrow keys, Home and End move the focus between a chart's points (one tab stop per chart).
// Without this script the points keep their <title>s and every value is in the table.
(function () {
  "use strict";

  function show(chart, point) {
    var readout = chart.querySelector("[data-readout]");
    var cursor = chart.querySelector(".ts-cursor");
    chart.querySelectorAll(".ts-point.active").forEach(function (p) { p.classList.remove("active"); });
    point.classList.add("active");
    if (readout) readout.textContent = point.getAttribute("data-label");
    if (cursor) {
      var x = point.getAttribute("cx");
      cursor.setAttribute("x1", x);
      cursor.setAttribute("x2", x);
      cursor.setAttribute("visibility", "visible");
    }
  }

  function focusPoint(chart, points, i) {
    i = Math.max(0, Math.min(points.length - 1, i));
    points.forEach(function (p, j) { p.setAttribute("tabindex", j === i ? "0" : "-1"); });
    points[i].focus();
    show(chart, points[i]);
  }

  function bind(chart) {
    if (chart.dataset.chartBound) return;
    chart.dataset.chartBound = "1";
    var svg = chart.querySelector("svg");
    var points = Array.prototype.slice.call(chart.querySelectorAll(".ts-point"));
    if (!svg || !points.length) return;
    points.forEach(function (p, i) {
      p.addEventListener("focus", function () { show(chart, p); });
      p.addEventListener("keydown", function (e) {
        var moves = { ArrowRight: i + 1, ArrowUp: i + 1, ArrowLeft: i - 1, ArrowDown: i - 1,
                      Home: 0, End: points.length - 1, PageUp: i + 10, PageDown: i - 10 };
        if (e.key in moves) {
          e.preventDefault();
          focusPoint(chart, points, moves[e.key]);
        }
      });
    });
    svg.addEventListener("mousemove", function (e) {
      var box = svg.getBoundingClientRect();
      var scale = svg.viewBox.baseVal.width / box.width;
      var x = (e.clientX - box.left) * scale;
      var best = points[0], gap = Infinity;
      points.forEach(function (p) {
        var d = Math.abs(parseFloat(p.getAttribute("cx")) - x);
        if (d < gap) { gap = d; best = p; }
      });
      show(chart, best);
    });
  }

  function bindAll(root) {
    (root || document).querySelectorAll("[data-chart]").forEach(bind);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { bindAll(document); });
  } else {
    bindAll(document);
  }
  document.addEventListener("htmx:afterSettle", function () { bindAll(document); });
})();
