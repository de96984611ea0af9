// conduit console: keep keyboard focus where it was when a live part refreshes.
// htmx replaces a polled part (the Work list every 2 s, Needs you every 3 s); the element that had
// the focus is then a new node, and the browser would drop the focus to <body>. Before a swap the
// focused element's key (its id, else its tag, href, name, form action and text) is noted per
// target; right after it, the same element in the new content gets the focus back, unscrolled.
(function () {
  "use strict";
  var noted = {};
  function key(el) {
    var form = el.form ? el.form.getAttribute("action") : null;
    return { id: el.id || null, tag: el.tagName, href: el.getAttribute("href"),
             name: el.getAttribute("name"), form: form, text: (el.textContent || "").trim() };
  }
  function same(el, k) {
    var form = el.form ? el.form.getAttribute("action") : null;
    return el.tagName === k.tag && el.getAttribute("href") === k.href &&
      el.getAttribute("name") === k.name && form === k.form &&
      (el.textContent || "").trim() === k.text;
  }
  document.addEventListener("htmx:beforeSwap", function (e) {
    var target = e.detail.target, active = document.activeElement;
    if (target && target.id && active && active !== document.body && target.contains(active)) {
      noted[target.id] = key(active);
    }
  });
  document.addEventListener("htmx:afterSwap", function () {
    Object.keys(noted).forEach(function (id) {
      var k = noted[id], active = document.activeElement;
      delete noted[id];
      if (active && active !== document.body && active.isConnected) { return; }
      var found = k.id ? document.getElementById(k.id) : null;
      if (!found) {
        var part = document.getElementById(id);
        var all = part ? part.querySelectorAll(k.tag) : [];
        for (var i = 0; i < all.length && !found; i++) { if (same(all[i], k)) { found = all[i]; } }
      }
      if (found) { found.focus({ preventScroll: true }); }
    });
  });

  // A running job's live output shows its end: kept at the bottom across refreshes, unless the
  // reader scrolled up (then the same offset is kept).
  var scrolled = {};
  function follow() {
    document.querySelectorAll("pre.live").forEach(function (pre) {
      var was = scrolled[pre.id];
      pre.scrollTop = was === undefined ? pre.scrollHeight : was;
    });
    scrolled = {};
  }
  document.addEventListener("htmx:beforeSwap", function () {
    document.querySelectorAll("pre.live").forEach(function (pre) {
      if (pre.scrollTop + pre.clientHeight < pre.scrollHeight - 4) { scrolled[pre.id] = pre.scrollTop; }
    });
  });
  document.addEventListener("htmx:afterSwap", follow);
  document.addEventListener("DOMContentLoaded", follow);
})();
