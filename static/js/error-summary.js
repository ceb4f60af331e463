// The submit form's error summary (templates/console/job_new.html) takes focus on load, so a
// screen reader reads every problem at once and the keyboard starts there.
document.addEventListener("DOMContentLoaded", function () {
  const summary = document.getElementById("error-summary");
  if (summary) summary.focus();
});
