// Close this page's event stream when the page is left. Chromium keeps the streams of
// pages navigated away from open, and six of them exhaust its connections per host: the
// seventh page would wait about a minute to load.
window.addEventListener("pagehide", function () {
  var data = document.body && document.body["htmx-internal-data"];
  if (data && data.sseEventSource) {
    data.sseEventSource.close();
  }
});
