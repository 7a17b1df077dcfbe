// Close this page's event stream when the page is left. Chromium keeps the streams of
// pages navigated away from open, and six of them exhaust its connections per host: the
// seventh page would wait about a minute to load.
window.addEventListener("pagehide", function () {
  var data = document.body && document.body["htmx-internal-data"];
  if (data && data.sseEventSource) {
    data.sseEventSource.close();
  }
});

// A list with tasks ticked for a control is not redrawn under the person ticking them
// (its live part would lose the ticks): the refresh waits until nothing is ticked.
document.addEventListener("htmx:beforeRequest", function (event) {
  var target = event.detail && event.detail.elt;
  if (target && target.hasAttribute && target.hasAttribute("data-keep-selection") &&
      target.querySelector("input:checked")) {
    event.preventDefault();
  }
});

// Stop and cancel cannot be undone: the selection's buttons ask first, naming how many
// tasks are selected (a task page's own buttons ask through htmx's hx-confirm).
document.addEventListener("click", function (event) {
  var button = event.target.closest && event.target.closest("button[data-confirm]");
  if (!button || !button.form) {
    return;
  }
  var count = button.form.querySelectorAll("input[name=task_id]:checked").length;
  var question = button.dataset.confirm + " the " + count + " selected task(s)? It cannot be undone.";
  if (!window.confirm(question)) {
    event.preventDefault();
  }
});

// "All N tasks matching this filter" asks first, naming N, whatever the action.
document.addEventListener("click", function (event) {
  var button = event.target.closest && event.target.closest("button[data-confirm-all]");
  if (button && !window.confirm(button.dataset.confirmAll + " Each gets its own control.")) {
    event.preventDefault();
  }
});
