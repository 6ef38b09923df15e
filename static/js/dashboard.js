/* NovelForge dashboard: shared pieces (no build step, no framework).
 *
 * - NF.EventStream: one websocket to /ws/events/, one or more subscriptions, each with its own
 *   cursor (the last event id applied). On reconnect every subscription resumes "after" its
 *   cursor, so the page catches up from the event log instead of reloading; an event at or
 *   below the cursor is ignored, so nothing is applied twice.
 * - the connection indicator (live / catching up / reconnecting / offline);
 * - relative times and lease countdowns that tick; copy-to-clipboard; confirm-before-submit;
 * - NF.renderEvent: the same markup as templates/dashboard/_event.html;
 * - NF.stateLabel / NF.reasonText / NF.codeWord / NF.boundaryWords / NF.roleWords: states, coded reasons,
 *   records' state codes, checkpoint boundaries and sessions' roles in words, from the server's one map
 *   (presenters.STATE_LABELS / REASON_TEXT / CODE_WORDS / BOUNDARY_WORDS / ROLE_WORDS, rendered into the
 *   page as <script id="nf-words">).
 */
(function () {
  "use strict";
  const NF = (window.NF = window.NF || {});
  // The page's language: the script catalog base.html renders as JSON (<script id="nf-i18n">,
  // templatetags/page_language.py, built by Django's JavaScriptCatalog). No catalog (English): the
  // strings as written here.
  const I18N = (() => {
    const node = document.getElementById("nf-i18n");
    try { return (node && JSON.parse(node.textContent)) || {}; } catch (_) { return {}; }
  })();
  const CATALOG = I18N.catalog || {};
  const gettext = (s) => { const v = CATALOG[s]; return typeof v === "string" ? v : Array.isArray(v) ? v[0] : s; };
  // Django's plural rule for the language: "0" (one form, as in Chinese) or null (English: one and many).
  const ngettext = (one, many, n) => {
    const v = CATALOG[one];
    if (Array.isArray(v)) return I18N.plural === "0" ? v[0] : v[n === 1 ? 0 : Math.min(1, v.length - 1)];
    return n === 1 ? one : many;
  };
  const interpolate = (fmt, obj) => fmt.replace(/%\((\w+)\)s/g, (m, k) => String(obj[k]));
  NF.gettext = gettext;
  NF.ngettext = ngettext;
  NF.interpolate = interpolate;

  // ------------------------------------------------------------------ connection indicator
  const CONN_TEXT = { connecting: gettext("connecting…"), catching_up: gettext("catching up…"), live: gettext("live"),
                      reconnecting: gettext("reconnecting…"), offline: gettext("offline") };
  NF.setConn = function (state, title) {
    const el = document.getElementById("conn");
    if (!el) return;
    el.className = "conn " + state.replace("_", "-");
    el.dataset.state = state;
    el.textContent = CONN_TEXT[state] || state;
    el.title = title || "";
  };

  // ------------------------------------------------------------------ event stream
  const FINAL_CODES = { 4400: gettext("the server refused a malformed message"), 4401: gettext("your login has expired — reload to log in"),
                        4403: gettext("you may not watch this any more"), 4413: gettext("a message was too large") };

  NF.EventStream = class {
    /** subs: [{project_id: N} | {session_id: N}]; after: the page's cursor; onEvent(event, subKey). */
    constructor(subs, after, onEvent) {
      this.subs = subs.map((s) => ({ msg: s, key: s.project_id != null ? "project:" + s.project_id : "session:" + s.session_id }));
      this.cursors = {};
      for (const s of this.subs) this.cursors[s.key] = Number(after) || 0;
      this.onEvent = onEvent;
      this.pending = new Set();
      this.attempt = 0;
      this.stopped = false;
      this.ws = null;
    }

    start() {
      if (!this.subs.length) {  // nothing to follow (no project): no indicator, nothing is wrong
        const conn = document.getElementById("conn");
        if (conn) conn.hidden = true;
        return;
      }
      if (!("WebSocket" in window)) { NF.setConn("offline", gettext("live updates unavailable")); return; }
      this.connect();
      window.addEventListener("online", () => { if (!this.ws && !this.stopped) this.connect(); });
    }

    connect() {
      NF.setConn(this.attempt ? "reconnecting" : "connecting");
      const proto = location.protocol === "https:" ? "wss:" : "ws:";
      const ws = new WebSocket(proto + "//" + location.host + "/ws/events/");
      this.ws = ws;
      ws.onopen = () => {
        this.attempt = 0;
        NF.setConn("catching_up");
        this.pending = new Set(this.subs.map((s) => s.key));
        // batch: the events one delivery found come in one frame ({type: "events"}), in id order.
        for (const s of this.subs) ws.send(JSON.stringify(Object.assign({ type: "subscribe", after: this.cursors[s.key], batch: true }, s.msg)));
      };
      ws.onmessage = (msg) => this.handle(JSON.parse(msg.data));
      ws.onclose = (e) => {
        this.ws = null;
        if (this.stopped) return;
        if (FINAL_CODES[e.code]) { NF.setConn("offline", FINAL_CODES[e.code]); this.stopped = true; return; }
        this.attempt += 1;
        const delay = Math.min(10000, 400 * 2 ** Math.min(this.attempt, 5)) * (0.75 + Math.random() / 2);
        NF.setConn(navigator.onLine === false ? "offline" : "reconnecting", interpolate(gettext("retrying in %(n)s s"), { n: Math.round(delay / 1000) }, true));
        setTimeout(() => { if (!this.stopped) this.connect(); }, delay);
      };
    }

    apply(ev, sub) {
      if (ev.id <= (this.cursors[sub] || 0)) return; // already applied
      this.cursors[sub] = ev.id;
      try { this.onEvent(ev, sub); } catch (err) { console.error(err); }
    }

    handle(frame) {
      if (frame.type === "events") {
        for (const ev of frame.events) this.apply(ev, frame.sub);
      } else if (frame.type === "event") {
        this.apply(frame.event, frame.sub);
      } else if (frame.type === "caught_up") {
        this.pending.delete(frame.sub);
        if (!this.pending.size) NF.setConn("live", interpolate(gettext("up to date with event #%(id)s"), { id: Math.max(0, ...Object.values(this.cursors)) }, true));
      } else if (frame.type === "error") {
        console.warn("event stream:", frame.error);
      }
    }
  };

  // ------------------------------------------------------------------ words
  let words = null;
  function wordMaps() {
    if (words) return words;
    const node = document.getElementById("nf-words");
    try { words = JSON.parse((node && node.textContent) || "{}"); } catch (_) { words = {}; }
    words.states = words.states || {};
    words.reasons = words.reasons || {};
    return words;
  }
  /** A session state in words (presenters.state_label); an unknown value as it is. */
  NF.stateLabel = function (state) {
    const label = wordMaps().states[state];
    return typeof label === "string" ? label : (state == null ? "" : String(state));
  };
  /** A reason in words (presenters.reason): a code the service writes becomes its sentence
   *  ("<code>: <detail>" fills {detail}); anything else is someone's own words, as written. */
  NF.reasonText = function (reason) {
    const raw = reason == null ? "" : String(reason);
    const at = raw.indexOf(": ");
    const code = at < 0 ? raw : raw.slice(0, at), detail = at < 0 ? "" : raw.slice(at + 2);
    const template = Object.prototype.hasOwnProperty.call(wordMaps().reasons, code) ? wordMaps().reasons[code] : null;
    if (typeof template !== "string" || template.includes("{detail}") !== (detail !== "")) {
      for (const [source, words] of wordMaps().patterns || []) {  // presenters.SERVICE_REASONS
        const m = new RegExp("^(?:" + source + ")$").exec(raw);
        if (m) return words.split("{1}").join(m[1]);
      }
      return raw;
    }
    return template.split("{detail}").join(detail);
  };
  /** An event type in words (presenters.EVENT_WORDS); an unknown type as it is. */
  NF.eventWords = function (type) {
    const label = (wordMaps().events || {})[type];
    return typeof label === "string" ? label : String(type);
  };
  function label(key, fallback) {
    const text = (wordMaps().labels || {})[key];
    return typeof text === "string" ? text : fallback;
  }
  /** A record's state code (a run's "interrupted") in words (presenters.code_word); an unknown code as it is. */
  NF.codeWord = function (code) {
    const text = (wordMaps().codes || {})[code];
    return typeof text === "string" ? text : (code == null ? "" : String(code));
  };
  /** A checkpoint boundary in words (presenters.boundary_words); an unknown one as its code, spaced. */
  NF.boundaryWords = function (code) {
    const text = (wordMaps().boundaries || {})[code];
    return typeof text === "string" ? text : (code == null ? "" : String(code).replace(/_/g, " "));
  };
  /** A session's role in words (presenters.role_words); an unknown one as its code, spaced. */
  NF.roleWords = function (code) {
    const text = (wordMaps().roles || {})[code];
    return typeof text === "string" ? text : (code == null ? "" : String(code).replace(/_/g, " "));
  };
  /** Ids, fingerprints, hashes: shown under "details" only (presenters.technical_key). */
  NF.technicalKey = function (key) {
    return key === "id" || /(_id|fingerprint|_hash)$/.test(key);
  };
  /** Paint a state badge as the server renders it: colour class, words, the code as its title. */
  NF.paintBadge = function (badge, state, extraClass) {
    badge.textContent = NF.stateLabel(state);
    badge.className = "badge " + (extraClass ? extraClass + " " : "") + "st-" + state;
    badge.title = state;
  };

  // ------------------------------------------------------------------ event summaries
  /** Mirrors presenters.describe(). `family` is the event's family as the server sends it
   *  (`event.family`: session, run, runtime, handoff, review, write_intent, …). */
  NF.describe = function (type, p, family) {
    p = p || {};
    const why = typeof p.reason === "string" && p.reason ? " · " + NF.reasonText(p.reason) : "";
    const what = family && family !== "other" ? type.slice(family.length + 1) : "";
    if (type === "session.transitioned") return NF.stateLabel(p.from) + " → " + NF.stateLabel(p.to) + why;
    // the role in words; the task mode and the runtime family are the agent's own names, as written
    if (type === "session.created") return NF.roleWords(p.role) + " · " + p.task_mode + " · " + p.runtime_family;
    if (type === "run.started") return fmt(gettext("run #%(seq)s started · gen %(gen)s"), { seq: p.seq, gen: p.generation });
    if (type === "run.ended") return fmt(gettext("run #%(seq)s %(state)s"), { seq: p.seq, state: NF.codeWord(p.state) }) + why;
    if (type === "checkpoint.recorded") return fmt(gettext("checkpoint #%(seq)s · %(boundary)s"), { seq: p.seq, boundary: NF.boundaryWords(p.boundary) });
    if (type === "session.resumed") return describeResumed(p) + why;
    if (family === "runtime") return fmt(gettext("generation %(gen)s"), { gen: p.generation != null ? p.generation : "?" }) + why;
    if (family === "handoff") return describeHandoff(what, p);
    if (family === "review") return describeReview(what, p);
    if (family === "write_intent") {
      const action = WRITE_ACTIONS[what] || what.replace(/_/g, " ");
      return fmt(gettext("write intent #%(id)s %(what)s"), { id: p.intent_id, what: action }) + (p.kind ? " · " + p.kind : "");
    }
    if (type === "authority.settled" || type === "framework.changed") return describeAuthority(type, p);
    const parts = [];
    for (const [k, v] of Object.entries(p)) {
      if (NF.technicalKey(k)) continue;
      if (["string", "number", "boolean"].includes(typeof v) && v !== "") parts.push(k + "=" + v);
    }
    const text = parts.join(" · ");
    return text.length <= 120 ? text : text.slice(0, 119) + "…";
  };
  /** The payload's ids and fingerprints, for the "details" disclosure (presenters._scalar_items). */
  NF.technicalDetails = function (p) {
    const parts = [];
    for (const [k, v] of Object.entries(p || {})) {
      if (NF.technicalKey(k) && ["string", "number", "boolean"].includes(typeof v) && v !== "") parts.push(k + "=" + v);
    }
    const text = parts.join(" · ");
    return text.length <= 120 ? text : text.slice(0, 119) + "…";
  };

  // The summaries in the page's language: the same messages as presenters.describe() (both catalogs).
  function fmt(text, values) { return interpolate(text, values, true); }
  const WRITE_ACTIONS = { created: gettext("created"), approved: gettext("approved"), rejected: gettext("rejected"),
                          approval_revoked: gettext("approval revoked"), executed: gettext("executed"), refused: gettext("refused") };
  const GATE_ACTIONS = { completed: gettext("completed"), cancelled: gettext("cancelled") };

  /** presenters._describe_resumed: the new run's generation, no checkpoint (starts over), what it carried over. */
  function describeResumed(p) {
    const parts = [fmt(gettext("resumed on generation %(gen)s"), { gen: p.generation != null ? p.generation : "?" })];
    if (p.checkpoint_id == null) parts.push(gettext("no checkpoint: starts from the beginning"));
    const counts = {};
    const carried = p.carried_over && typeof p.carried_over === "object" && !Array.isArray(p.carried_over) ? p.carried_over : {};
    for (const [key, items] of Object.entries(carried)) if (Array.isArray(items)) counts[key] = items.length;
    let n = counts.handoffs || 0;
    delete counts.handoffs;
    if (n) parts.push(fmt(ngettext("%(n)s unfinished handoff carried over", "%(n)s unfinished handoffs carried over", n), { n }));
    n = counts.gates || 0;
    delete counts.gates;
    if (n) parts.push(fmt(ngettext("%(n)s open review gate carried over", "%(n)s open review gates carried over", n), { n }));
    n = Object.values(counts).reduce((a, b) => a + b, 0);
    if (n) parts.push(fmt(ngettext("%(n)s other wait carried over", "%(n)s other waits carried over", n), { n }));
    return parts.join(" · ");
  }

  function describeAuthority(type, p) {
    const before = p.before || {}, after = p.after || {};
    let text;
    if (type === "framework.changed") {
      text = fmt(gettext("framework %(before)s → %(after)s"), { before: before.framework_version, after: after.framework_version });
    } else {
      text = fmt(gettext("authority v%(before)s → v%(after)s"), { before: before.authority_version, after: after.authority_version });
      if (typeof after.lock_fingerprint === "string") text += " · " + fmt(gettext("lock %(lock)s…"), { lock: after.lock_fingerprint.slice(0, 15) });
    }
    return text + (p.intent_id ? " · " + fmt(gettext("write intent #%(id)s"), { id: p.intent_id }) : "");
  }

  function describeHandoff(what, p) {
    const job = { job: p.logical_id };
    if (what === "created") {
      const caps = p.required_capabilities || [];
      return fmt(gettext("handoff %(job)s created"), job) + (caps.length ? " · " + fmt(gettext("needs %(caps)s"), { caps: caps.join(", ") }) : "");
    }
    if (what === "claimed") {
      return fmt(gettext("handoff %(job)s claimed by %(worker)s · attempt %(attempt)s"), { job: p.logical_id, worker: p.worker, attempt: p.attempt })
        + (p.reclaimed_after_expiry ? " · " + gettext("previous lease expired") : "");
    }
    if (what === "result_consumed") return fmt(gettext("handoff %(job)s · result consumed"), job);
    if (what === "result_invalid") return fmt(gettext("handoff %(job)s · invalid result refused"), job);
    if (what === "result_conflict") return fmt(gettext("handoff %(job)s · CONFLICTING result: hard stop"), job);
    if (what === "conflict_resolved") return fmt(gettext("handoff %(job)s · conflict resolved"), job);
    if (what === "waiting_long") return fmt(gettext("handoff %(job)s · waiting for %(minutes)s min"), { job: p.logical_id, minutes: Math.floor((p.waited_seconds || 0) / 60) });
    if (what === "cancelled") return fmt(gettext("handoff %(job)s cancelled"), job) + (typeof p.reason === "string" && p.reason ? " · " + NF.reasonText(p.reason) : "");
    return fmt(gettext("handoff %(job)s"), job) + " · " + what.replace(/_/g, " ");
  }

  function describeReview(what, p) {
    const gate = { gate: p.gate_id };
    if (what === "gate_opened") {
      return fmt(gettext("review gate #%(gate)s opened · %(route)s route · %(n)s verdict(s) needed"), { gate: p.gate_id, route: p.route, n: p.required_verdicts });
    }
    if (what === "verdict_bound") {
      return fmt(gettext("review gate #%(gate)s · verdict bound (%(bound)s of %(n)s)"), { gate: p.gate_id, bound: p.bound_verdicts, n: p.required_verdicts });
    }
    if (what === "packet_claimed") return fmt(gettext("review gate #%(gate)s · packet #%(packet)s claimed"), { gate: p.gate_id, packet: p.packet_id });
    const action = what.replace("gate_", "");
    return fmt(gettext("review gate #%(gate)s"), gate) + " · " + (GATE_ACTIONS[action] || action.replace(/_/g, " "));
  }

  const STATES = ["created", "running", "idle", "awaiting_user", "awaiting_external", "completed", "failed", "terminated", "stale"];

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text != null) node.textContent = text;
    return node;
  }
  NF.el = el;

  NF.timeEl = function (iso) {
    const t = el("time", { datetime: iso, title: iso.replace("T", " ").slice(0, 19) + " UTC", "data-rel": "" });
    t.textContent = NF.relative(new Date(iso));
    return t;
  };

  NF.renderEvent = function (ev, opts) {
    const li = el("li", { class: "ev fresh", "data-id": ev.id, "data-type": ev.type });
    const head = el("div", { class: "ev-head" });
    head.append(el("span", { class: "ev-type", title: ev.type }, NF.eventWords(ev.type)));
    const when = el("span", { class: "ev-when" });
    when.append(NF.timeEl(ev.created_at));
    head.append(when);
    const body = el("div", { class: "ev-body" });
    const to = ev.type === "session.transitioned" ? ev.payload.to : null;
    if (STATES.includes(to)) { body.append(el("span", { class: "badge st-" + to, title: to }, NF.stateLabel(to))); body.append(" "); }
    if (ev.session_id && opts && opts.showSession) {
      body.append(el("a", { href: "/sessions/" + ev.session_id + "/" }, interpolate(gettext("session #%(id)s"), { id: ev.session_id }, true)));
      body.append(" · ");
    }
    body.append(el("span", { class: "ev-sum" }, NF.describe(ev.type, ev.payload, ev.family)));
    const details = el("details", { class: "ev-details" });
    details.append(el("summary", {}, label("details", "details")));
    details.append(el("span", { class: "ev-id" }, label("event", "event #{id}").split("{id}").join(String(ev.id))));
    details.append(" · ");
    details.append(el("code", {}, ev.type));
    const tech = NF.technicalDetails(ev.payload);
    if (tech) { details.append(" · "); details.append(el("span", { class: "ev-tech" }, tech)); }
    li.append(head, body, details);
    return li;
  };

  /** Prepend an event to a feed list, keeping at most `max` items. */
  NF.prependToFeed = function (list, ev, opts) {
    if (!list) return;
    const empty = list.querySelector(".empty");
    if (empty) empty.remove();
    list.prepend(NF.renderEvent(ev, opts));
    while (list.children.length > 60) list.lastElementChild.remove();
  };

  // ------------------------------------------------------------------ times and countdowns
  NF.relative = function (date) {
    const s = Math.round((Date.now() - date.getTime()) / 1000);
    if (s < 10) return gettext("just now");
    if (s < 60) return interpolate(gettext("%(n)s s ago"), { n: s }, true);
    if (s < 3600) return interpolate(gettext("%(n)s min ago"), { n: Math.floor(s / 60) }, true);
    if (s < 86400) return interpolate(gettext("%(h)s h %(m)s min ago"), { h: Math.floor(s / 3600), m: Math.floor((s % 3600) / 60) }, true);
    return interpolate(gettext("%(n)s d ago"), { n: Math.floor(s / 86400) }, true);
  };

  function clock(seconds) {
    const s = Math.abs(Math.round(seconds));
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    return (h ? h + ":" + String(m).padStart(2, "0") : m) + ":" + String(r).padStart(2, "0");
  }

  NF.tick = function () {
    for (const t of document.querySelectorAll("time[data-rel]")) t.textContent = NF.relative(new Date(t.getAttribute("datetime")));
    for (const c of document.querySelectorAll(".countdown[data-expires]")) {
      const left = (new Date(c.dataset.expires).getTime() - Date.now()) / 1000;
      c.classList.toggle("expired", left <= 0);
      c.classList.toggle("soon", left > 0 && left < 15);
      c.textContent = left > 0 ? interpolate(gettext("expires in %(clock)s"), { clock: clock(left) }, true)
                              : interpolate(gettext("expired %(clock)s ago"), { clock: clock(left) }, true);
    }
  };

  // ------------------------------------------------------------------ copy, confirm
  async function copyText(text) {
    try { await navigator.clipboard.writeText(text); return true; } catch (_) { /* insecure context: fall back */ }
    const area = el("textarea", { readonly: "" });
    area.style.position = "fixed";  // through the CSSOM: the CSP allows no style attributes
    area.style.opacity = "0";
    area.value = text;
    document.body.append(area);
    area.select();
    const ok = document.execCommand("copy");
    area.remove();
    return ok;
  }

  document.addEventListener("click", async (e) => {
    const btn = e.target.closest("button.copy[data-copy]");
    if (!btn) return;
    const ok = await copyText(btn.dataset.copy);
    btn.textContent = ok ? gettext("copied") : gettext("failed");
    setTimeout(() => { btn.textContent = gettext("copy"); }, 1200);
  });

  document.addEventListener("submit", (e) => {
    // A button may carry its own question (one form, two decisions: approve / refuse).
    const btn = e.submitter;
    const msg = (btn && btn.dataset && btn.dataset.confirm) || (e.target.dataset && e.target.dataset.confirm);
    if (msg && !window.confirm(msg)) e.preventDefault();
  });

  /** Debounce per key; returns schedule(key, fn). */
  NF.debouncer = function (ms) {
    const timers = new Map();
    return function (key, fn) {
      clearTimeout(timers.get(key));
      timers.set(key, setTimeout(() => { timers.delete(key); fn(); }, ms));
    };
  };

  // ------------------------------------------------------------------ geometry
  /** The timeline's positions come as data-left / data-width (percent) and data-top /
   * data-height (px); they are applied through the CSSOM because the Content-Security-Policy
   * allows no style="" attributes. Call it again after a panel is re-rendered. */
  NF.layout = function (root) {
    for (const n of (root || document).querySelectorAll("[data-left], [data-width], [data-top], [data-height]")) {
      const d = n.dataset;
      if (d.left != null) n.style.left = d.left + "%";
      if (d.width != null) n.style.width = d.width + "%";
      if (d.top != null) n.style.top = d.top + "px";
      if (d.height != null) n.style.height = d.height + "px";
    }
    NF.placeLabels(root);
    NF.fitBarLabels(root);
  };

  /** A bar's label that does not fit its bar is hidden (the bar's tooltip still says it):
   * never a label cut to its first letter. */
  NF.fitBarLabels = function (root) {
    for (const span of (root || document).querySelectorAll(".tl-bar > span, .tl-span > span")) {
      span.classList.remove("cut");
      if (span.scrollWidth > span.parentElement.clientWidth + 1) span.classList.add("cut");
    }
  };

  /** Checkpoint labels, placed again from their measured boxes (the server placed them from an
   * estimate): in order of position, each goes into the first of LANES lanes where it starts
   * after the previous label of that lane ends (plus a gap); one that fits in none is thinned —
   * hidden, its tick keeping the tooltip. So no two labels ever overlap. */
  const LANES = 2, GAP = 4;
  NF.placeLabels = function (root) {
    for (const track of (root || document).querySelectorAll(".tl-track")) {
      const labels = [...track.querySelectorAll(".tl-tick-label")];
      if (!labels.length) continue;
      for (const l of labels) { l.classList.remove("thinned", "lane-1", "flip"); l.classList.add("lane-0"); }
      const edge = track.getBoundingClientRect().right;
      for (const l of labels) if (l.getBoundingClientRect().right > edge) l.classList.add("flip"); // ends at its tick
      const boxes = labels.map((l) => ({ l, r: l.getBoundingClientRect() })).sort((a, b) => a.r.left - b.r.left);
      const ends = [];
      let used = 0;
      for (const { l, r } of boxes) {
        let lane = ends.findIndex((end) => end + GAP <= r.left);
        if (lane < 0 && ends.length < LANES) { ends.push(-Infinity); lane = ends.length - 1; }
        if (lane < 0) { l.classList.add("thinned"); continue; }
        ends[lane] = r.right;
        used = Math.max(used, lane + 1);
        l.classList.toggle("lane-0", lane === 0);
        l.classList.toggle("lane-1", lane === 1);
      }
      track.classList.remove("lanes-0", "lanes-1", "lanes-2");
      track.classList.add("lanes-" + used);
    }
  };
  window.addEventListener("resize", () => { NF.placeLabels(document); NF.fitBarLabels(document); });

  document.addEventListener("DOMContentLoaded", () => {
    NF.layout(document);
    NF.tick();
    setInterval(NF.tick, 1000);
  });
})();
