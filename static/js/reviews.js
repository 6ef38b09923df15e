// Reviewer pages: copy to clipboard (fingerprints, relay prompt), add/remove finding rows, and check
// a finding before the round trip: a started row needs its other fields, and its location must name
// lines of the candidate (the server checks the same: reviews/verdicts.py location_error).
// Everything works without JavaScript too: the prompt is selectable text, empty rows are ignored,
// required scores are caught by the browser's own form validation, and the server names the rest.
(function () {
  "use strict";
  document.documentElement.classList.add("js");
  // The page's language: the script catalog base.html renders as JSON (<script id="nf-i18n">,
  // templatetags/page_language.py). No catalog (English): the strings as written here. Its plural
  // rule is Django's expression: "0" (one form, as in Chinese) or null (English: one and many).
  var I18N = {};
  try { I18N = JSON.parse((document.getElementById("nf-i18n") || {}).textContent || "{}") || {}; } catch (e) { I18N = {}; }
  var CATALOG = I18N.catalog || {};
  function gettext(s) {
    var v = CATALOG[s];
    return typeof v === "string" ? v : (Array.isArray(v) ? v[0] : s);
  }
  function ngettext(one, many, n) {
    var v = CATALOG[one];
    if (Array.isArray(v)) return I18N.plural === "0" ? v[0] : v[n === 1 ? 0 : Math.min(1, v.length - 1)];
    return n === 1 ? one : many;
  }
  function interpolate(fmt, obj) {
    return fmt.replace(/%\((\w+)\)s/g, function (m, k) { return String(obj[k]); });
  }

  function flash(button, text) {
    var original = button.dataset.label || button.textContent;
    button.dataset.label = original;
    button.textContent = text;
    button.classList.add("copied");
    window.setTimeout(function () { button.textContent = original; button.classList.remove("copied"); }, 1600);
  }

  function copyText(text, button) {
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { flash(button, gettext("Copied")); }, function () { fallback(text, button); });
    } else {
      fallback(text, button);
    }
  }

  function fallback(text, button) {
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(area);
    flash(button, ok ? gettext("Copied") : gettext("Select and copy"));
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest("button.copy");
    if (!button) return;
    var text = button.dataset.copy;
    if (text === undefined && button.dataset.copyTarget) {
      var target = document.querySelector(button.dataset.copyTarget);
      text = target ? target.value || target.textContent : "";
    }
    copyText(text || "", button);
  });

  var rows = document.getElementById("finding-rows");
  var template = document.getElementById("finding-template");
  var add = document.getElementById("add-finding");
  if (rows && template && add) {
    var next = rows.querySelectorAll(".finding-row").length;
    add.addEventListener("click", function () {
      var html = template.innerHTML.replace(/__i__/g, String(next)).replace(/__n__/g, String(next + 1));
      next++;
      var holder = document.createElement("div");
      holder.innerHTML = html.trim();
      var row = holder.firstElementChild;
      rows.appendChild(row);
      row.querySelector("input").focus();
    });
    rows.addEventListener("click", function (event) {
      var remove = event.target.closest("button.remove-finding");
      if (!remove) return;
      var row = remove.closest(".finding-row");
      if (rows.querySelectorAll(".finding-row").length > 1) {
        row.remove();
      } else {
        row.querySelectorAll("input, select").forEach(function (el) { el.value = ""; });
        checkRow(row);
      }
      add.focus();
    });
  }

  // ---- findings checked in the browser (same rules as the server)
  var form = document.querySelector("form.verdict-form");
  var LINE_PART = /^(?:l|line|lines)?\s*\.?\s*(\d{1,7})\s*(?:(?:-|\u2013|\u2014|to)\s*(?:l|line)?\s*\.?\s*(\d{1,7}))?$/i;
  var HINT = gettext("a line or range of the candidate, e.g. L3, L3-5 or L3, L7");

  function locationError(text, lines) {
    var parts = text.split(/[,;]/).map(function (p) { return p.trim(); });
    for (var k = 0; k < parts.length; k++) {
      var m = LINE_PART.exec(parts[k]);
      if (!parts[k] || !m) return interpolate(gettext("Say which line it is about: %(hint)s."), { hint: HINT }, true);
      var start = parseInt(m[1], 10), end = m[2] ? parseInt(m[2], 10) : start;
      if (start > end) return interpolate(gettext("The range %(start)s-%(end)s runs backwards."), { start: start, end: end }, true);
      var bad = [start, end].filter(function (n) { return n < 1 || n > lines; });
      if (bad.length) {
        return interpolate(ngettext("Line %(line)s is not in the candidate (it has %(lines)s line).",
                                    "Line %(line)s is not in the candidate (it has %(lines)s lines).", lines),
                           { line: bad[0], lines: lines }, true);
      }
    }
    return "";
  }

  function checkRow(row) {
    var loc = row.querySelector("input[name$='-location']");
    var sev = row.querySelector("select[name$='-severity']");
    var note = row.querySelector("input[name$='-note']");
    if (!loc || !sev || !note) return;
    var started = loc.value.trim() !== "" || note.value.trim() !== "";
    loc.required = sev.required = note.required = started;
    var lines = parseInt(form.dataset.lines, 10);
    loc.setCustomValidity(started && loc.value.trim() !== "" ? locationError(loc.value.trim(), lines) : "");
  }

  if (form && rows) {
    rows.addEventListener("input", function (event) {
      var row = event.target.closest(".finding-row");
      if (row) checkRow(row);
    });
    form.addEventListener("submit", function (event) {
      rows.querySelectorAll(".finding-row").forEach(checkRow);
      if (!form.checkValidity()) {
        event.preventDefault();
        form.reportValidity();
      }
    });
    rows.querySelectorAll(".finding-row").forEach(checkRow);
  }

  var confirmation = document.getElementById("confirmation");
  if (confirmation && window.location.hash === "#confirmation") confirmation.focus();
})();
