// Runyard console: the one script of our own (the CSP allows no inline script).
// A form with data-confirm asks before it is sent (stop, rerun).
document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form.getAttribute && form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
