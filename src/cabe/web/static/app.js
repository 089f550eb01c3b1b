// cabe — progressive enhancement of the server-rendered form. No dependencies, no network
// access other than this server. Without this script the form submits with GET and the server
// renders the same results.
(function () {
  "use strict";
  var form = document.getElementById("calc");
  if (!form || !window.fetch) return;
  var lang = document.documentElement.lang || "en";
  var config = null;       // parsed uploaded config.json, sent as data
  var configName = "";
  var seq = 0;             // drops stale answers
  var timer = null;
  var file = document.getElementById("config-file");

  // Same rules as cabe.i18n.fmt_number.
  function fmt(x, digits) {
    var s;
    if (Number.isInteger(x) && digits === undefined) {
      s = Math.abs(x).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ",");
      if (x < 0) s = "-" + s;
    } else {
      if (digits === undefined) digits = Math.abs(x) >= 100 ? 1 : Math.abs(x) >= 1 ? 2 : 4;
      var fixed = Math.abs(x).toFixed(digits).split(".");
      s = fixed[0].replace(/\B(?=(\d{3})+(?!\d))/g, ",") + (fixed.length > 1 ? "." + fixed[1] : "");
      if (s.indexOf(".") >= 0) s = s.replace(/0+$/, "").replace(/\.$/, "");
      if (x < 0) s = "-" + s;
    }
    if (lang === "es") s = s.replace(/,/g, "\u0000").replace(/\./g, ",").replace(/\u0000/g, ".");
    return s;
  }
  function fill(template, params) {
    return template.replace(/\{(\w+)\}/g, function (m, k) {
      if (!(k in params)) return m;
      var v = params[k];
      return typeof v === "number" ? fmt(v) : String(v);
    });
  }
  function num(text) {
    var s = String(text).trim().replace(/\s/g, "");
    if ((s.match(/,/g) || []).length === 1 && s.indexOf(".") < 0) s = s.replace(",", ".");
    return s;
  }

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

  // Seed calculator: straight to /api/estimate, rendered from the report's steps.
  function updateSeed(mySeq) {
    var box = document.getElementById("seed-results");
    var n = num(form.n.value), a = num(form.a.value) || "0";
    var b = form.b.value === "custom" ? num(form.bc.value) : form.b.value;
    if (!n || !b) { box.replaceChildren(el("p", "empty", box.dataset.empty)); return; }
    var body = { params: Number(n), bytes_per_param: Number(b), activations_gb: Number(a), lang: lang };
    if (!isFinite(body.params)) body.params = n;
    if (!isFinite(body.bytes_per_param)) body.bytes_per_param = b;
    if (!isFinite(body.activations_gb)) body.activations_gb = a;
    fetch("/api/estimate", { method: "POST", headers: { "Content-Type": "application/json" },
                             body: JSON.stringify(body) })
      .then(function (r) { return r.json(); })
      .then(function (out) {
        if (mySeq !== seq) return;
        if (out.error) {
          var p = el("p", "error", out.error.message);
          p.setAttribute("role", "alert");
          if (out.error.field) p.dataset.field = out.error.field;
          box.replaceChildren(p);
          return;
        }
        var steps = {};
        out.steps.forEach(function (s) { steps[s.key] = s; });
        var labels = box.dataset;
        var big = el("p", "big");
        var total = el("output", null, fmt(out.total_gb, 2) + " GB");
        total.id = "seed-total";
        total.dataset.gb = out.total_gb;
        var gib = el("output", null, fmt(out.total_gib, 2) + " GiB");
        gib.id = "seed-total-gib";
        var muted = el("span", "muted");
        muted.append("(", gib, ")");
        big.append(total, " ", muted);
        var nodes = [big];
        [["simple.model_states", "seed-m", labels.labelM], ["simple.total", "seed-v", labels.labelV]].forEach(function (x) {
          var s = steps[x[0]];
          if (!s) return;
          var kv = el("div", "kv");
          var o = el("output", "formula", fill(s.formula, s.params));
          o.id = x[1];
          kv.append(el("span", null, x[2]), o);
          nodes.push(kv);
        });
        box.replaceChildren.apply(box, nodes);
      })
      .catch(function () { /* keep the last result */ });
  }

  // Planner: the server renders the panel (same code as the no-JS page) from the query string.
  function updatePlan(mySeq, qs) {
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
          box.replaceChildren(p);
        } else {
          // HTML produced by this server from escaped values (see cabe/web/page.py).
          box.innerHTML = out.plan;
        }
      })
      .catch(function () {})
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
    updateSeed(seq);
    updatePlan(seq, qs);
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
  form.addEventListener("change", function (e) { if (e.target.type !== "file") schedule(); });
  form.addEventListener("submit", function (e) { e.preventDefault(); clearTimeout(timer); update(); });

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
