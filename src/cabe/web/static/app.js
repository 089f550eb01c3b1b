// cabe — progressive enhancement of the server-rendered form. No dependencies, no network
// access other than this server. Without this script the form submits with GET and the server
// renders the same results.
(function () {
  "use strict";
  var form = document.getElementById("calc");
  if (!form || !window.fetch) return;
  var config = null;       // parsed uploaded config.json, sent as data
  var configName = "";
  var seq = 0;             // drops stale answers
  var timer = null;
  var file = document.getElementById("config-file");

  // Defaults that follow another field (the precision follows the method), as the server decides
  // them (cabe.schema.resolve_defaults): data in the page, not a second copy here.
  var dependent = {};
  var data = document.getElementById("form-defaults");
  if (data) { try { dependent = JSON.parse(data.textContent); } catch (err) { dependent = {}; } }
  Object.keys(dependent).forEach(function (name) {
    var rule = dependent[name], input = form.elements[name], on = form.elements[rule.depends_on];
    if (!input || !on) return;
    var before = on.value;
    on.addEventListener("change", function () {
      // Still the default of the old value: the user did not choose it, so it follows.
      if (input.value === rule.values[before] && on.value in rule.values) input.value = rule.values[on.value];
      before = on.value;
    });
  });

  function queryString() {
    var data = new FormData(form);
    var parts = [];
    data.forEach(function (v, k) {
      if (typeof v !== "string") return; // the file input
      parts.push(encodeURIComponent(k) + "=" + encodeURIComponent(v));
    });
    return parts.join("&");
  }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // Both panels come from the server (the templates of the no-JS page) for the query string.
  function updatePanels(mySeq, qs) {
    var seedBox = document.getElementById("seed-results");
    var box = document.getElementById("plan-results");
    box.classList.add("busy");
    box.setAttribute("aria-busy", "true");
    fetch("/fragment", { method: "POST", headers: { "Content-Type": "application/json" },
                         body: JSON.stringify({ query: qs, config: config }) })
      .then(function (r) { return r.json(); })
      .then(function (out) {
        if (mySeq !== seq) return;
        if (out.error) {
          var p = el("p", "error", out.error.message);
          p.setAttribute("role", "alert");
          var answer = el("div", "answer");  // as plan_results.html: the answer block stays in view on a phone
          answer.id = "answer";
          answer.appendChild(p);
          box.replaceChildren(answer);
        } else {
          // HTML produced by this server from autoescaped templates (see cabe/web/templates/).
          seedBox.innerHTML = out.seed;
          box.innerHTML = out.plan;
        }
      })
      .catch(function () { /* keep the last result */ })
      .finally(function () {
        if (mySeq === seq) { box.classList.remove("busy"); box.removeAttribute("aria-busy"); }
      });
  }

  function update() {
    seq += 1;
    var qs = queryString();
    history.replaceState(null, "", "?" + qs);
    var sw = document.getElementById("lang-switch");
    if (sw) {
      var other = sw.getAttribute("hreflang");
      sw.href = "?" + qs.replace(/(^|&)lang=[^&]*/, "$1lang=" + other);
    }
    updatePanels(seq, qs);
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(update, 200);
  }

  form.addEventListener("input", function (e) {
    if (e.target.type === "file") return;
    if (e.target.id === "model" && config) { config = null; if (file) file.value = ""; }
    // A Hugging Face id means a download on the server: wait for Enter or leaving the field.
    if (e.target.id === "model" && e.target.value.indexOf("/") >= 0) return;
    schedule();
  });
  // The question (view) picks the fieldsets that apply, the engine its own knobs; the others are hidden
  // (and not sent: the server reads only what the view reads), as the server renders them.
  function showFor() {
    var view = (form.elements.view && form.elements.view.value) || "train";
    form.setAttribute("data-view", view);
    form.querySelectorAll("[data-views]").forEach(function (fs) {
      fs.hidden = fs.getAttribute("data-views").split(" ").indexOf(view) < 0;
    });
    var engine = form.elements.engine ? form.elements.engine.value : "";
    form.querySelectorAll("[data-engine]").forEach(function (d) {
      d.hidden = d.getAttribute("data-engine") !== engine;
    });
  }
  form.addEventListener("change", function (e) {
    if (e.target.type === "file") return;
    if (e.target.name === "view" || e.target.name === "engine") showFor();
    schedule();
  });
  form.addEventListener("submit", function (e) {
    if (e.submitter && e.submitter.name === "pin") return;  // "Compare": the server keeps the setup (a new address)
    e.preventDefault(); clearTimeout(timer); update();
  });

  var hint = document.getElementById("upload-hint");
  if (file) {
    file.addEventListener("change", function () {
      var f = file.files && file.files[0];
      if (!f) { config = null; schedule(); return; }
      if (f.size > 256 * 1024) { config = null; hint.textContent = hint.dataset.bad; return; }
      f.text().then(function (text) {
        try {
          config = JSON.parse(text);
          configName = f.name;
          hint.textContent = hint.dataset.loaded.replace("{name}", configName);
        } catch (err) {
          config = null;
          hint.textContent = hint.dataset.bad;
        }
        clearTimeout(timer);
        update();
      });
    });
  }
})();
