// A region that scrolls (a wide table on a phone, a long log) must be reachable by keyboard
// (WCAG 2.1.1; axe's scrollable-region-focusable): each one that overflows now gets
// tabindex="0" — and loses it when it no longer does — on load, on resize and after htmx swaps.
// Loaded by base.html and the admin's base_site.html.
(function () {
  "use strict";

  const CANDIDATES = "table, div, pre, section, .log";

  function scrolls(element) {
    const style = getComputedStyle(element);
    const x = /(auto|scroll)/.test(style.overflowX) && element.scrollWidth > element.clientWidth + 1;
    const y = /(auto|scroll)/.test(style.overflowY) && element.scrollHeight > element.clientHeight + 1;
    return x || y;
  }

  function mark() {
    document.querySelectorAll(CANDIDATES).forEach((element) => {
      if (scrolls(element)) {
        if (!element.hasAttribute("tabindex")) {
          element.setAttribute("tabindex", "0");
          element.dataset.scrollRegion = "";
        }
      } else if (element.dataset.scrollRegion !== undefined) {
        element.removeAttribute("tabindex");
        delete element.dataset.scrollRegion;
      }
    });
  }

  let pending = null;
  function soon() {
    if (pending) return;
    pending = requestAnimationFrame(() => {
      pending = null;
      mark();
    });
  }

  document.addEventListener("DOMContentLoaded", mark);
  window.addEventListener("resize", soon);
  document.addEventListener("htmx:afterSettle", soon);
})();
