// Recovery Console: keyboard navigation of queue rows, the live refresh's new-row marks, the copy buttons of truncated
// ids and keys, the phone's Menu button and the JSON evidence's highlighting.
// j / k move the current row, Enter opens it, c claims (or releases) it; rows ticked for a bulk stay ticked; p, a, r,
// Enter in a reason and ? below. Without JavaScript every page still reads
// and every form still posts; this only adds speed.
(function () {
  "use strict";
  let currentId = null;
  let known = null; // row ids seen before the last refresh
  const picked = new Set(); // rows ticked for a bulk action: kept across the live refresh, which redraws them

  function rows() {
    return Array.from(document.querySelectorAll("#rows tr[data-id]"));
  }

  function setCurrent(row) {
    rows().forEach(function (r) { r.classList.remove("current"); r.removeAttribute("aria-selected"); });
    if (!row) { currentId = null; return; }
    row.classList.add("current");
    row.setAttribute("aria-selected", "true");
    row.focus({ preventScroll: false });
    currentId = row.dataset.id;
  }

  function move(step) {
    const all = rows();
    if (!all.length) return;
    let i = all.findIndex(function (r) { return r.dataset.id === currentId; });
    i = i < 0 ? (step > 0 ? 0 : all.length - 1) : Math.min(all.length - 1, Math.max(0, i + step));
    setCurrent(all[i]);
  }

  function current() {
    return rows().find(function (r) { return r.dataset.id === currentId; }) || null;
  }

  // Enter in a reason sends its form (Shift+Enter: a new line). Approving or rejecting asks first, however it is
  // sent (Enter, a click on the button, the keyboard on the button): the question is asked on the submit itself.
  const CONFIRM = { "approve-form": "Approve this request? A worker then executes it once.",
                    "reject-form": "Reject this request? Nothing will run." };
  document.addEventListener("keydown", function (event) {
    const box = event.target;
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    if (!box.matches || !box.matches("form.action-form textarea")) return;
    event.preventDefault();
    if (!box.value.trim()) { box.reportValidity(); return; }
    box.form.requestSubmit();
  });
  document.addEventListener("submit", function (event) {
    const question = CONFIRM[event.target.id];
    if (question && !window.confirm(question)) event.preventDefault();
  });

  // Page keys: p previews the call page's recommended action; a / r go to the approve / reject reason; ? lists keys.
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const target = event.target;
    if (target.matches && target.matches("input, select, textarea, [contenteditable]")) return;
    if (event.key === "?") {
      const keys = document.getElementById("keys");
      if (keys && !keys.open) { keys.showModal(); event.preventDefault(); }
      return;
    }
    const fields = { a: "#approve-form textarea", r: "#reject-form textarea" };
    if (event.key === "p") {
      const form = document.querySelector('[data-recommended] form.preview-form');
      if (!form) return;
      event.preventDefault();
      const missing = Array.from(form.querySelectorAll("input, textarea, select")).find(function (f) {
        return f.type !== "hidden" && f.required && !f.value;
      });
      if (missing) missing.focus(); else form.requestSubmit();
      return;
    }
    if (fields[event.key]) {
      const field = document.querySelector(fields[event.key]);
      if (field) { field.focus(); event.preventDefault(); }
      return;
    }
    if (!document.getElementById("rows")) return;
    if (event.key === "j") { move(1); event.preventDefault(); }
    else if (event.key === "k") { move(-1); event.preventDefault(); }
    else if (event.key === "Enter" && current()) {
      const link = current().querySelector("a.open");
      if (link) { link.click(); event.preventDefault(); }
    } else if (event.key === "c" && current()) {
      const button = current().querySelector(".claim-button");
      if (button) { button.click(); event.preventDefault(); }
    } else if (event.key === "m" && current()) {
      const button = current().querySelector(".assign-me");
      if (button) { button.click(); event.preventDefault(); }
    }
  });

  document.addEventListener("click", function (event) {
    const row = event.target.closest && event.target.closest("#rows tr[data-id]");
    if (row) setCurrent(row);
  });

  document.addEventListener("change", function (event) {
    const box = event.target;
    if (!box.matches || !box.matches('#rows input[type="checkbox"][name="call"]')) return;
    if (box.checked) picked.add(box.value); else picked.delete(box.value);
  });

  function remember() {
    known = new Set(rows().map(function (r) { return r.dataset.id; }));
  }

  function restoreTicks() {
    document.querySelectorAll('#rows input[type="checkbox"][name="call"]').forEach(function (box) {
      box.checked = picked.has(box.value);
    });
  }

  document.addEventListener("DOMContentLoaded", remember);
  // The ticks come back in the same task as the swap (afterSwap), so no moment shows the redrawn rows unticked (the
  // settle comes a few milliseconds later and another refresh may land in between); and again after the settle.
  document.addEventListener("htmx:afterSwap", restoreTicks);
  // After the settle, not the swap: htmx's settle step puts back the new markup's class attributes (it first copies
  // the old ones onto elements with the same id, for CSS transitions), which would wipe the marks made on afterSwap.
  document.addEventListener("htmx:afterSettle", function (event) {
    const swapped = event.detail && event.detail.target;
    if (!swapped) return;
    // The refresh replaced the whole tbody: mark rows that were not there before, keep the current row.
    if (known) {
      rows().forEach(function (r) { if (!known.has(r.dataset.id)) r.classList.add("new"); });
    }
    remember();
    restoreTicks();
    const row = current();
    if (row) { row.classList.add("current"); row.setAttribute("aria-selected", "true"); }
  });

  // The copy button beside a truncated id or key copies it whole (the clipboard needs a secure context; elsewhere the
  // value is selected for Ctrl+C instead).
  document.addEventListener("click", function (event) {
    const button = event.target.closest && event.target.closest("button.copy[data-copy]");
    if (!button) return;
    const done = function () {
      button.classList.add("copied");
      window.setTimeout(function () { button.classList.remove("copied"); }, 1200);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(button.dataset.copy).then(done, function () {});
    } else {
      const shown = button.previousElementSibling;
      if (shown) { window.getSelection().selectAllChildren(shown); done(); }
    }
  });

  // The phone's Menu button: the navigation folds away below the desktop width once this script runs (without it,
  // the navigation simply stays open).
  function menu() {
    const top = document.getElementById("top");
    const toggle = top && top.querySelector(".nav-toggle");
    if (!toggle) return;
    top.classList.add("collapsible");
    toggle.hidden = false;
    toggle.addEventListener("click", function () {
      const open = top.classList.toggle("open");
      toggle.setAttribute("aria-expanded", open ? "true" : "false");
    });
  }

  // JSON evidence, coloured: keys, strings, numbers and literals each in a span made with textContent (the text is
  // an agent's or a provider's: it never becomes markup).
  const TOKEN = /("(?:\\.|[^"\\])*")(\s*:)?|(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|\b(true|false|null)\b/g;
  function highlight(pre) {
    if (pre.dataset.highlighted) return;
    const text = pre.textContent;
    if (text.length > 200000) return;
    const out = document.createDocumentFragment();
    let last = 0;
    const add = function (cls, value) {
      if (!cls) { out.appendChild(document.createTextNode(value)); return; }
      const span = document.createElement("span");
      span.className = cls;
      span.textContent = value;
      out.appendChild(span);
    };
    text.replace(TOKEN, function (match, str, colon, num, lit, at) {
      add("", text.slice(last, at));
      if (str) { add(colon ? "j-key" : "j-str", str); if (colon) add("", colon); }
      else if (num) add("j-num", num);
      else add("j-lit", lit);
      last = at + match.length;
      return match;
    });
    add("", text.slice(last));
    pre.textContent = "";
    pre.appendChild(out);
    pre.dataset.highlighted = "yes";
  }
  function highlightAll(root) {
    (root || document).querySelectorAll("pre.json").forEach(highlight);
  }
  document.addEventListener("DOMContentLoaded", function () { menu(); highlightAll(); });
  document.addEventListener("htmx:afterSettle", function (event) { highlightAll(event.detail && event.detail.target); });
})();
