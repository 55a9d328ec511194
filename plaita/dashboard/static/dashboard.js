// Refreshes the overview without a page reload: fetch the server-rendered fragment (escaped
// by the server's templates) and swap it in. No framework, no build step.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) { return; }
  var url = live.getAttribute("data-refresh");
  var everyMs = parseInt(live.getAttribute("data-every-ms"), 10) || 1000;
  var marker = document.getElementById("dashboard-unreachable");
  var busy = false;

  function refresh() {
    if (busy) { return; }
    busy = true;
    var controller = new AbortController();
    var timer = setTimeout(function () { controller.abort(); }, 5000);
    fetch(url, { credentials: "same-origin", cache: "no-store", signal: controller.signal })
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (html) {
        live.innerHTML = html;
        live.setAttribute("data-updated", String(Date.now()));
        if (marker) { marker.hidden = true; }
      })
      .catch(function () { if (marker) { marker.hidden = false; } })
      .finally(function () { clearTimeout(timer); busy = false; });
  }

  setInterval(refresh, everyMs);
})();
