// Fetches the live part of the dashboard again every data-refresh-ms and puts it in place.
// No build step, no library: the page works without it too (reload to refresh).
(function () {
  "use strict";
  const body = document.body;
  const every = Number(body.dataset.refreshMs) || 2000;
  const live = document.getElementById("live");
  const state = document.getElementById("state");
  async function refresh() {
    try {
      const reply = await fetch("/dashboard/live", { credentials: "same-origin", cache: "no-store" });
      if (!reply.ok) throw new Error("HTTP " + reply.status);
      live.innerHTML = await reply.text();
      state.textContent = "live";
      state.className = "";
    } catch (err) {
      state.textContent = "not refreshed: " + err.message;
      state.className = "stale";
    } finally {
      setTimeout(refresh, every);
    }
  }
  setTimeout(refresh, every);
})();
