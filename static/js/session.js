/* Session page: the diagram, timeline, handoffs, checkpoints, runtimes, review gates and
 * actions are re-rendered by the server (GET …/panels/) whenever an event of this session
 * arrives (handoff.* and review.* events included); the header badge and the feed update at
 * once from the event itself. Open drawers and keyboard focus are kept across a re-render.
 *
 * Lease heartbeats are not events (liveness is not a state change), so when a handoff's or a
 * runtime's lease countdown runs out the panels are re-fetched once for that lease: a worker
 * that renewed it shows its new expiry, one that did not stays "expired".
 *
 * Liveness is the lease (docs/model.md#runtimes-and-leases): the moment a live runtime's lease runs out, its badge
 * turns "lease expired" here, without waiting for the server; the re-fetch then shows the
 * server's view, and the reconciler's runtime.lost / session.transitioned events re-render it
 * as lost and the session as failed.
 */
(function () {
  "use strict";
  const NF = window.NF;

  document.addEventListener("DOMContentLoaded", () => {
    const root = document.getElementById("session-page");
    if (!root) return;
    const sessionId = Number(root.dataset.sessionId);
    const feed = document.getElementById("feed");
    const later = NF.debouncer(250);
    let requestNo = 0;

    function paintState(state) {
      const badge = document.getElementById("session-state");
      if (badge) { NF.paintBadge(badge, state, "big"); badge.dataset.state = state; }
    }

    function swap(panel, html) {
      const openKeys = new Set([...panel.querySelectorAll("details[open][data-key]")].map((d) => d.dataset.key));
      const closedKeys = new Set([...panel.querySelectorAll("details:not([open])[data-key]")].map((d) => d.dataset.key));
      const active = panel.contains(document.activeElement) ? document.activeElement : null;
      const focusKey = active && (active.getAttribute("value") || active.textContent || "").trim();
      panel.innerHTML = html;
      NF.layout(panel);
      for (const d of panel.querySelectorAll("details[data-key]")) {
        if (openKeys.has(d.dataset.key)) d.open = true;
        else if (closedKeys.has(d.dataset.key)) d.open = false;
      }
      if (focusKey) {
        const again = [...panel.querySelectorAll("button, a, summary")].find(
          (n) => (n.getAttribute("value") || n.textContent || "").trim() === focusKey);
        if (again && !again.disabled) again.focus();
      }
    }

    async function refreshPanels() {
      const n = ++requestNo;
      const resp = await fetch(root.dataset.panelsUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (n !== requestNo || !resp.ok) return;
      const data = await resp.json();
      for (const [name, html] of Object.entries(data.panels)) {
        const panel = root.querySelector('[data-panel="' + name + '"]');
        if (panel) swap(panel, html);
      }
      NF.tick();
      scheduleLeaseFlips();
    }

    function onEvent(ev) {
      NF.prependToFeed(feed, ev, { showSession: false });
      if (ev.type === "session.transitioned") paintState(ev.payload.to);
      if (ev.type === "session.forgotten") {
        const note = NF.el("p", { class: "alert", role: "alert" }, NF.gettext("This session has been forgotten: its record is gone."));
        root.prepend(note);
        return;
      }
      later("panels", refreshPanels);
    }

    const rechecked = new Set();
    function recheckExpiredLeases() {
      for (const c of root.querySelectorAll(".countdown[data-recheck][data-expires]")) {
        const key = c.dataset.recheck + "@" + c.dataset.expires;
        if (rechecked.has(key) || new Date(c.dataset.expires).getTime() > Date.now()) continue;
        rechecked.add(key);
        later("panels", refreshPanels);
      }
    }
    setInterval(recheckExpiredLeases, 1000);

    function flipExpiredLeases() {
      for (const b of root.querySelectorAll(".rt[data-lease-expires]:not([data-lease-flipped])")) {
        const at = new Date(b.dataset.leaseExpires);
        if (at.getTime() > Date.now()) continue;
        b.dataset.leaseFlipped = "1";
        b.textContent = NF.gettext("lease expired");
        b.classList.remove("rt-live");
        b.classList.add("rt-expired", "problem");
        b.title = NF.interpolate(NF.gettext("the lease ran out at %(at)s UTC: the runtime is gone"),
                                { at: at.toISOString().replace("T", " ").slice(0, 19) }, true);
        const row = b.closest("tr.rt-row");
        if (row) row.classList.add("lease-expired");
      }
    }
    let flipTimers = [];
    function scheduleLeaseFlips() {
      flipTimers.forEach(clearTimeout);
      flipTimers = [...root.querySelectorAll(".rt[data-lease-expires]:not([data-lease-flipped])")].map((b) =>
        setTimeout(() => { flipExpiredLeases(); recheckExpiredLeases(); },
                   Math.max(0, new Date(b.dataset.leaseExpires).getTime() - Date.now()) + 20));
      flipExpiredLeases();
    }
    scheduleLeaseFlips();
    setInterval(flipExpiredLeases, 1000);

    NF.stream = new NF.EventStream([{ session_id: sessionId }], root.dataset.cursor, onEvent);
    NF.stream.start();
  });
})();
