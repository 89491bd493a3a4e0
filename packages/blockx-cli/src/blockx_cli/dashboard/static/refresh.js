// Reloads the page's data every data-refresh seconds: fetches the same URL and
// swaps in its <main>, so the filters above it keep what is being typed. Paused by
// the checkbox, while the tab is hidden, and while a field has the focus.
(function () {
  "use strict";
  const seconds = Number(document.body.dataset.refresh || 0);
  const pause = document.getElementById("pause");
  if (!(seconds > 0)) return;
  let busy = false;
  async function refresh() {
    const main = document.getElementById("content");
    const focused = document.activeElement;
    if (busy || !main || (pause && pause.checked) || document.hidden) return;
    if (focused && (focused.tagName === "INPUT" || focused.tagName === "SELECT") && focused !== pause) return;
    busy = true;
    try {
      const response = await fetch(location.href, { cache: "no-store", headers: { Accept: "text/html" } });
      if (!response.ok) throw new Error("HTTP " + response.status);
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      const next = fresh.getElementById("content");
      if (next) main.replaceChildren(...Array.from(next.childNodes, (n) => document.importNode(n, true)));
      document.body.classList.remove("stale");
    } catch (_) {
      document.body.classList.add("stale"); // the dashboard itself did not answer
    } finally {
      busy = false;
    }
  }
  setInterval(refresh, seconds * 1000);
})();
