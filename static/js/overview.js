/* Sessions overview: counts, table rows and the event feed follow the event stream.
 *
 * A session.transitioned event repaints the row's badge at once (from the event itself);
 * then the row and the counts are re-fetched from the server (debounced), which stays the
 * single source of truth for everything else in the row and for what matches the filters.
 */
(function () {
  "use strict";
  const NF = window.NF;

  document.addEventListener("DOMContentLoaded", () => {
    const root = document.getElementById("overview");
    if (!root) return;
    const filters = JSON.parse(document.getElementById("overview-filters").textContent || "{}");
    const query = new URLSearchParams(filters).toString();
    const paged = root.dataset.paged === "1";
    const rows = document.getElementById("session-rows");
    const feed = document.getElementById("feed");
    const projects = (root.dataset.projects || "").split(",").filter(Boolean).map(Number).slice(0, 32);
    const later = NF.debouncer(250);
    // The statuses the server highlights (lifecycles.ATTENTION_STATUSES): never spelled here.
    const attention = new Set((root.dataset.attentionStates || "").split(" ").filter(Boolean));
    const seq = new Map(); // session id → latest request number (stale answers are dropped)

    const withQuery = (url) => (query ? url + "?" + query : url);
    const rowUrl = (id) => withQuery("/sessions/" + id + "/row/");

    function rowOf(id) { return document.getElementById("session-" + id); }

    function paintState(id, state) {
      const row = rowOf(id);
      if (!row) return;
      const badge = row.querySelector('[data-field="state"]');
      if (badge) NF.paintBadge(badge, state);
      row.dataset.state = state;
      row.className = row.className.replace(/\brow-\S+/, "row-" + state);
      row.classList.toggle("standout", attention.has(state));
      flash(row);
    }

    function flash(row) {
      row.classList.remove("flash");
      void row.offsetWidth; // restart the animation
      row.classList.add("flash");
    }

    function placeRow(fresh) {
      const id = Number(fresh.dataset.sessionId);
      const existing = rowOf(id);
      if (existing) { existing.replaceWith(fresh); flash(fresh); NF.tick(); return; }
      if (paged) return; // new sessions appear on the first page only
      const empty = rows.querySelector("tr.empty");
      if (empty) empty.remove();
      const after = [...rows.querySelectorAll("tr[data-session-id]")].find((r) => Number(r.dataset.sessionId) < id);
      rows.insertBefore(fresh, after || null);
      flash(fresh);
      NF.tick();
    }

    async function refreshRow(id, mayInsert) {
      const n = (seq.get(id) || 0) + 1;
      seq.set(id, n);
      const resp = await fetch(rowUrl(id), { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (seq.get(id) !== n) return;
      if (resp.status === 204 || resp.status === 404) { const r = rowOf(id); if (r) r.remove(); return; }
      if (!resp.ok) return;
      if (!mayInsert && !rowOf(id)) return;
      const tpl = document.createElement("template");
      tpl.innerHTML = (await resp.text()).trim();
      const fresh = tpl.content.querySelector("tr");
      if (fresh) placeRow(fresh);
    }

    async function refreshCounts() {
      const resp = await fetch(withQuery(root.dataset.countsUrl), { credentials: "same-origin" });
      if (!resp.ok) return;
      const data = await resp.json();
      for (const [state, n] of Object.entries(data.counts)) {
        const cell = root.querySelector('[data-count="' + state + '"]');
        if (!cell) continue;
        if (cell.textContent !== String(n)) { cell.textContent = n; flash(cell.closest(".count")); }
        cell.closest(".count").classList.toggle("zero", n === 0);
      }
      const total = root.querySelector('[data-count="total"]');
      if (total) total.textContent = data.total;
    }

    // The charts (dashboard/charts.py) are drawn by the server from the event log; events
    // re-fetch them, and once a minute the window moves on.
    const chartsCard = document.getElementById("charts");
    let chartsNo = 0;
    async function refreshCharts() {
      if (!chartsCard) return;
      const n = ++chartsNo;
      const resp = await fetch(withQuery(chartsCard.dataset.chartsUrl), { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (n !== chartsNo || !resp.ok) return;
      chartsCard.innerHTML = await resp.text();
      chartsCard.dataset.refreshed = String(n);
      NF.tick();
    }
    // Throttled, not debounced: a steady stream of events still redraws them once a second.
    let chartsTimer = null;
    function scheduleCharts() {
      if (chartsTimer) return;
      chartsTimer = setTimeout(() => { chartsTimer = null; refreshCharts(); }, 1000);
    }
    setInterval(scheduleCharts, 60000);

    function onEvent(ev) {
      NF.prependToFeed(feed, ev, { showSession: true });
      scheduleCharts();
      const id = ev.session_id;
      if (ev.type === "session.created" || ev.type === "session.transitioned" || ev.type === "session.forgotten") {
        later("counts", refreshCounts);
      }
      if (!id) return;
      if (ev.type === "session.forgotten") { const r = rowOf(id); if (r) r.remove(); return; }
      if (ev.type === "session.transitioned") paintState(id, ev.payload.to);
      // A new session may belong on this page; with a state filter, so may one that just changed state.
      const mayInsert = ev.type === "session.created" || (ev.type === "session.transitioned" && !!filters.state);
      if (mayInsert || rowOf(id)) later("row:" + id, () => refreshRow(id, mayInsert));
    }

    NF.stream = new NF.EventStream(projects.map((p) => ({ project_id: p })), root.dataset.cursor, onEvent);
    NF.stream.start();
  });
})();
