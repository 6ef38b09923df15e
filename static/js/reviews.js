// Reviewer pages: copy to clipboard (fingerprints, relay prompt) and add/remove finding rows.
// Everything works without JavaScript too: the prompt is selectable text, empty rows are ignored.
(function () {
  "use strict";
  document.documentElement.classList.add("js");

  function flash(button, text) {
    var original = button.dataset.label || button.textContent;
    button.dataset.label = original;
    button.textContent = text;
    button.classList.add("copied");
    window.setTimeout(function () { button.textContent = original; button.classList.remove("copied"); }, 1600);
  }

  function copyText(text, button) {
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { flash(button, "Copied"); }, function () { fallback(text, button); });
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
    flash(button, ok ? "Copied" : "Select and copy");
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
      var html = template.innerHTML.replace(/__i__/g, String(next++));
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
      }
      add.focus();
    });
  }

  var confirmation = document.getElementById("confirmation");
  if (confirmation && window.location.hash === "#confirmation") confirmation.focus();
})();
