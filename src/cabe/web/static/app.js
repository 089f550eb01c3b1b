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
  // The form's rules, as data (cabe.web.form.rules): dtype and autocast follow the precision; the
  // optimizers that read GaLore's fields.
  var rules = { follow: {}, low_rank: [] };
  var rulesData = document.getElementById("form-rules");
  if (rulesData) { try { rules = JSON.parse(rulesData.textContent); } catch (err) { /* keep the empty rules */ } }
  Object.keys(rules.follow || {}).forEach(function (name) { if (!(name in dependent)) dependent[name] = rules.follow[name]; });
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
          notApplying = out.not_applying || [];
          showFor();
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
  // The question (view) picks the fieldsets that apply, the engine its own knobs, the method its own
  // fields, a GaLore optimizer GaLore's; the others are hidden (and not sent: the server reads only what
  // applies), as the server renders them (cabe.web.form.shown).
  // the fields the server found would not act in the last request (cabe.web.form.not_applying), from each answer
  var notApplying = [];
  document.querySelectorAll("[data-probe][hidden]").forEach(function (e) { notApplying.push(e.getAttribute("data-probe")); });
  function value(name) { var e = form.elements[name]; return e ? e.value : ""; }
  function showFor() {
    var view = value("view") || "train", engine = value("engine"), method = value("method");
    var lowRank = (rules.low_rank || []).indexOf(value("optimizer")) >= 0;
    form.setAttribute("data-view", view);
    var sel = "[data-views],[data-engine],[data-methods],[data-lowrank],[data-probe]";
    document.querySelectorAll(sel).forEach(function (e) {
      var views = e.getAttribute("data-views"), methods = e.getAttribute("data-methods");
      e.hidden = (views !== null && views.split(" ").indexOf(view) < 0) ||
        (e.hasAttribute("data-engine") && e.getAttribute("data-engine") !== engine) ||
        (methods !== null && methods.split(" ").indexOf(method) < 0) ||
        (e.hasAttribute("data-lowrank") && !lowRank) ||
        notApplying.indexOf(e.getAttribute("data-probe")) >= 0;
    });
    var heading = document.querySelector("#plan-h > span:not([hidden])"), h1 = document.querySelector("header h1");
    if (heading && h1) document.title = heading.textContent + " — " + h1.textContent;
  }
  var SHOWS = ["view", "engine", "method", "optimizer"];
  form.addEventListener("change", function (e) {
    if (e.target.type === "file") return;
    if (SHOWS.indexOf(e.target.name) >= 0) showFor();
    schedule();
  });
  form.addEventListener("submit", function (e) {
    if (e.submitter && e.submitter.name === "pin") return;  // "Compare": the server keeps the setup (a new address)
    e.preventDefault(); clearTimeout(timer); update();
  });

  // Your own files: a model's config.json is sent with each request as data (never stored); a run's configs
  // (TrainingArguments, adapter_config.json, DeepSpeed, accelerate, axolotl, LLaMA-Factory, torchtune ...) go
  // once to /api/from-config, read there with cabe from-config's readers, and fill the form with what they set.
  var hint = document.getElementById("upload-hint");
  var setsBox = document.getElementById("config-sets");
  function say(text, alert) {
    if (!hint) return;
    hint.textContent = text;
    if (alert) hint.setAttribute("role", "alert"); else hint.removeAttribute("role");
  }
  function setField(name, v) {
    var e = form.elements[name];
    if (!e || e.type === "file" || v === null || v === undefined) return;
    if (e.type === "checkbox") { e.checked = !!v; return; }
    var text = Array.isArray(v) ? v.join(",") : typeof v === "boolean" ? (v ? "1" : (e.tagName === "SELECT" ? "0" : "")) : String(v);
    if (e.tagName === "SELECT" && !Array.prototype.some.call(e.options, function (o) { return o.value === text; })) return;
    e.value = text;
  }
  function fill(fc) {
    var req = fc.request || {};
    Object.keys(req).forEach(function (k) { if (k !== "model" || !config) setField(k, req[k]); });
    var one = rules.one_gpu || {};  // a field of several GPUs set off its default: the several-GPU question
    var several = Object.keys(one).some(function (k) { return k in req && req[k] !== one[k]; });
    if (several && value("view") === "train") form.elements.view.value = "gpus";
    showFor();
    if (!setsBox) return;
    var list = el("ul", "lines");
    (fc.sets || []).forEach(function (f) {
      var li = el("li");
      li.appendChild(el("strong", "", f.file));
      var pairs = Object.keys(f.sets).map(function (k) {
        var v = f.sets[k];
        return k + " = " + (Array.isArray(v) ? v.join(",") : String(v));
      });
      li.appendChild(document.createTextNode(" (" + f.format_name + "): " + (pairs.join(", ") || setsBox.dataset.nothing)));
      list.appendChild(li);
    });
    setsBox.replaceChildren(el("p", "sets-title", setsBox.dataset.title), list);
  }
  function readConfigs(files) {
    var texts = files.map(function (f) { return { name: f.name, text: f.text }; });
    return fetch("/api/from-config", { method: "POST", headers: { "Content-Type": "application/json" },
                                      body: JSON.stringify({ files: texts, lang: value("lang") }) })
      .then(function (r) { return r.json(); })
      .then(function (out) {
        if (out.from_config) fill(out.from_config);
        var names = files.map(function (f) { return f.name; }).join(", ");
        if (out.error && !out.from_config) { say(out.error.message, true); return; }
        say(hint.dataset.read.replace("{names}", names) + (out.error ? " " + out.error.message : ""), false);
      })
      .catch(function () { say(hint.dataset.bad, true); });
  }
  function takeFiles(list) {
    var files = Array.prototype.slice.call(list || []);
    if (!files.length) { config = null; schedule(); return; }
    var limit = Number(hint.dataset.limit);
    var big = files.filter(function (f) { return f.size > limit; })[0];
    if (big) { say(hint.dataset.tooLarge.replace("{name}", big.name).replace("{limit}", limit), true); return; }
    Promise.all(files.map(function (f) { return f.text().then(function (text) { return { name: f.name, text: text }; }); }))
      .then(function (read) {
        var model = null, runs = [];
        read.forEach(function (f) {
          var parsed = null;
          try { parsed = JSON.parse(f.text); } catch (err) { parsed = null; }
          if (parsed && typeof parsed === "object" && !Array.isArray(parsed) && "model_type" in parsed) model = { name: f.name, data: parsed };
          else runs.push(f);
        });
        if (model) { config = model.data; configName = model.name; say(hint.dataset.loaded.replace("{name}", configName), false); }
        return runs.length ? readConfigs(runs) : null;
      })
      .then(function () { clearTimeout(timer); update(); });
  }
  if (file) {
    file.addEventListener("change", function () { takeFiles(file.files); });
    var zone = document.getElementById("drop");
    if (zone) {
      ["dragenter", "dragover"].forEach(function (t) {
        zone.addEventListener(t, function (e) { e.preventDefault(); zone.classList.add("dragging"); });
      });
      ["dragleave", "drop"].forEach(function (t) {
        zone.addEventListener(t, function () { zone.classList.remove("dragging"); });
      });
      zone.addEventListener("drop", function (e) {
        e.preventDefault();
        if (e.dataTransfer && e.dataTransfer.files) takeFiles(e.dataTransfer.files);
      });
    }
  }
})();
