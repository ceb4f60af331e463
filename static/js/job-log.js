// The job page's log (templates/console/_job_log.html): opens at its newest line, and stays
// there after each refresh while "Follow" is checked; scrolling up turns following off.
(function () {
  function follow() { const box = document.getElementById("log-follow"); return !box || box.checked; }
  function toBottom() {
    const pre = document.querySelector("#job-log pre.log");
    if (pre && follow()) pre.scrollTop = pre.scrollHeight;
  }
  document.addEventListener("htmx:afterSwap", toBottom);
  document.addEventListener("htmx:load", toBottom);
  document.addEventListener("scroll", function (event) {
    const pre = event.target;
    if (!(pre instanceof Element) || !pre.matches("#job-log pre.log")) return;
    const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 4;
    const box = document.getElementById("log-follow");
    if (box && !atBottom && box.checked && pre.dataset.userScroll) box.checked = false;
  }, true);
  document.addEventListener("wheel", function (event) {
    const pre = event.target instanceof Element && event.target.closest("#job-log pre.log");
    if (pre) pre.dataset.userScroll = "1";
  }, true);
  document.addEventListener("change", function (event) {
    if (event.target && event.target.id === "log-follow") toBottom();
  });
  document.addEventListener("DOMContentLoaded", toBottom);
})();
