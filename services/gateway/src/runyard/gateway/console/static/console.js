// Runyard console: the one script of our own (the CSP allows no inline script).
// A form with data-confirm asks before it is sent (stop, rerun).
document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form.getAttribute && form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

// The task list, live by server-sent events: while the stream is open the rows'
// polling is held back; when it drops (or there is no EventSource), they poll again.
(function () {
  var live = false;
  function mark(state) {
    live = state === "sse";
    var rows = document.getElementById("task-rows");
    if (rows) { rows.setAttribute("data-live", state); }
  }
  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail && event.detail.elt;
    if (live && elt && elt.id === "task-rows") { event.preventDefault(); }
  });
  function start() {
    var rows = document.getElementById("task-rows");
    var url = rows && rows.getAttribute("data-stream");
    if (!url || !window.EventSource) { return; }
    var source = new EventSource(url);
    source.addEventListener("open", function () { mark("sse"); });
    source.addEventListener("error", function () { mark("polling"); });
    source.addEventListener("end", function () { source.close(); mark("polling"); });
    source.addEventListener("rows", function (event) {
      var body = document.getElementById("task-rows");
      if (body) { body.innerHTML = event.data; }
    });
    source.addEventListener("row", function (event) {
      var holder = document.createElement("tbody");
      holder.innerHTML = event.data;
      var row = holder.firstElementChild;
      if (!row) { return; }
      var id = row.getAttribute("data-task-id");
      var shown = document.querySelectorAll("#task-rows tr[data-task-id]");
      for (var i = 0; i < shown.length; i++) {
        if (shown[i].getAttribute("data-task-id") === id) { shown[i].replaceWith(row); return; }
      }
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
