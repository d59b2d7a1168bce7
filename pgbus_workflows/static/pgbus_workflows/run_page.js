/* pgbus_workflows run page: while the run is ongoing (#pgbus-live is on the page), fetch the page
   again every data-seconds and swap in its status fields, buttons and sections. A tick is skipped
   while the tab is hidden, text is selected, a field has the focus or a detail in the sections is
   open, so nothing the operator is reading or typing moves. Once the fetched page has no
   #pgbus-live (the run finished or was cancelled) the swap removes it here too, and it stops. */
(function () {
  "use strict";
  var SWAPPED = [
    "#pgbus-operations",
    ".form-row.field-coloured_status",
    ".form-row.field-current_step",
    ".form-row.field-paused_reason",
    ".form-row.field-status_changed_at",
    ".form-row.field-finished_at",
    "#pgbus-run-sections"
  ];

  function busy() {
    var selection = window.getSelection && window.getSelection();
    if (document.hidden || (selection && selection.toString() !== "")) return true;
    var focused = document.activeElement;
    if (focused && focused.matches("input, textarea, select, [contenteditable]")) return true;
    return document.querySelector("#pgbus-run-sections details[open]") !== null;
  }

  function swap(fresh) {
    if (!fresh.querySelector("#pgbus-run-sections")) return false; /* a login page, an error: not the run */
    SWAPPED.forEach(function (selector) {
      var old = document.querySelector(selector);
      var now = fresh.querySelector(selector);
      if (old && now) old.replaceWith(document.importNode(now, true));
    });
    return true;
  }

  function schedule(seconds) {
    window.setTimeout(function () { tick(seconds); }, seconds * 1000);
  }

  function tick(seconds) {
    if (!document.getElementById("pgbus-live")) return;
    if (busy()) { schedule(seconds); return; }
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : ""; })
      .then(function (html) {
        if (html && !busy()) swap(new DOMParser().parseFromString(html, "text/html"));
      })
      .catch(function () { /* the server is away for a moment: try again at the next tick */ })
      .then(function () {
        var live = document.getElementById("pgbus-live");
        if (live) schedule(Number(live.dataset.seconds) || seconds);
      });
  }

  function start() {
    var live = document.getElementById("pgbus-live");
    if (live) schedule(Number(live.dataset.seconds) || 5);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
