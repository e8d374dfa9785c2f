// mixprec report page: sort and filter the layer table, link graph nodes and rows, zoom the graph.
// The table's state lives in the URL fragment (#q=..&precision=..&source=..&kind=a,b&sort=key&dir=asc|desc).
(function () {
  "use strict";
  var table = document.getElementById("layers");
  var body = table.tBodies[0];
  var rows = Array.prototype.slice.call(body.rows);
  var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
  var q = document.getElementById("q");
  var precision = document.getElementById("precision");
  var source = document.getElementById("source");
  var kindBoxes = Array.prototype.slice.call(document.querySelectorAll('input[name="kind"]'));
  var count = document.getElementById("count");
  var state = { sort: "index", dir: "asc" };

  function column(key) {
    for (var i = 0; i < heads.length; i++) if (heads[i].dataset.key === key) return i;
    return 0;
  }

  function readHash() {
    var params = new URLSearchParams(location.hash.replace(/^#/, ""));
    if (params.has("q")) q.value = params.get("q");
    if (params.has("precision")) precision.value = params.get("precision");
    if (params.has("source")) source.value = params.get("source");
    if (params.has("kind")) {
      var wanted = params.get("kind").split(",");
      kindBoxes.forEach(function (b) { b.checked = wanted.indexOf(b.value) >= 0; });
    }
    if (params.has("sort")) state.sort = params.get("sort");
    if (params.get("dir") === "desc") state.dir = "desc";
  }

  function writeHash() {
    var params = new URLSearchParams();
    if (q.value) params.set("q", q.value);
    if (precision.value) params.set("precision", precision.value);
    if (source.value) params.set("source", source.value);
    params.set("kind", kindBoxes.filter(function (b) { return b.checked; }).map(function (b) { return b.value; }).join(","));
    if (state.sort !== "index" || state.dir !== "asc") { params.set("sort", state.sort); params.set("dir", state.dir); }
    try { history.replaceState(null, "", "#" + params.toString()); } catch (e) { /* file:// in some browsers */ }
  }

  function apply() {
    var needle = q.value.trim().toLowerCase();
    var kinds = kindBoxes.filter(function (b) { return b.checked; }).map(function (b) { return b.value; });
    var shown = 0;
    rows.forEach(function (row) {
      var ok = (!precision.value || row.dataset.precision === precision.value) &&
        (!source.value || row.dataset.source === source.value) &&
        kinds.indexOf(row.dataset.kind) >= 0 &&
        (!needle || row.textContent.toLowerCase().indexOf(needle) >= 0);
      row.hidden = !ok;
      if (ok) shown++;
    });
    var c = column(state.sort);
    var numeric = heads[c].dataset.type === "num";
    var sign = state.dir === "desc" ? -1 : 1;
    var sorted = rows.slice().sort(function (a, b) {
      var x = a.cells[c].dataset.v, y = b.cells[c].dataset.v;
      var d = numeric ? Number(x) - Number(y) : x.localeCompare(y);
      return d !== 0 ? sign * d : Number(a.cells[0].dataset.v) - Number(b.cells[0].dataset.v);
    });
    sorted.forEach(function (row) { body.appendChild(row); });
    heads.forEach(function (h, i) {
      h.classList.toggle("asc", i === c && state.dir === "asc" && state.sort !== "index");
      h.classList.toggle("desc", i === c && state.dir === "desc");
    });
    count.textContent = "showing " + shown + " of " + rows.length + " layers";
    count.dataset.shown = String(shown);
    writeHash();
  }

  heads.forEach(function (h) {
    function sortBy() {
      if (state.sort === h.dataset.key) state.dir = state.dir === "asc" ? "desc" : "asc";
      else { state.sort = h.dataset.key; state.dir = h.dataset.type === "num" ? "desc" : "asc"; }
      apply();
    }
    h.addEventListener("click", sortBy);
    h.addEventListener("keydown", function (e) { if (e.key === "Enter") sortBy(); });
  });
  [q, precision, source].concat(kindBoxes).forEach(function (el) {
    el.addEventListener("input", apply);
    el.addEventListener("change", apply);
  });

  // graph <-> table
  var nodes = Array.prototype.slice.call(document.querySelectorAll("#graph g.node"));
  function highlight(name) {
    document.querySelectorAll(".hl").forEach(function (el) { el.classList.remove("hl"); });
    var row = document.getElementById("row-" + name);
    if (row) {
      if (row.hidden) {
        q.value = ""; precision.value = ""; source.value = "";
        kindBoxes.forEach(function (b) { if (b.value === row.dataset.kind) b.checked = true; });
        apply();
      }
      row.classList.add("hl");
      row.scrollIntoView({ block: "center" });
    }
    nodes.forEach(function (n) { if (n.dataset.name === name) n.classList.add("hl"); });
  }
  nodes.forEach(function (n) {
    n.addEventListener("click", function () { highlight(n.dataset.name); });
    n.addEventListener("keydown", function (e) { if (e.key === "Enter") highlight(n.dataset.name); });
  });
  rows.forEach(function (row) {
    row.addEventListener("click", function () {
      document.querySelectorAll(".hl").forEach(function (el) { el.classList.remove("hl"); });
      row.classList.add("hl");
      nodes.forEach(function (n) {
        if (n.dataset.name === row.dataset.name) {
          n.classList.add("hl");
          if (n.scrollIntoView) n.scrollIntoView({ block: "center", inline: "center" });
        }
      });
    });
  });

  // zoom
  var svg = document.getElementById("graph");
  var scale = 1;
  document.querySelectorAll("[data-zoom]").forEach(function (b) {
    b.addEventListener("click", function () {
      var step = Number(b.dataset.zoom);
      scale = step === 0 ? 1 : Math.max(0.2, Math.min(3, scale * (step > 0 ? 1.25 : 0.8)));
      if (svg) {
        svg.style.width = (svg.viewBox.baseVal.width * scale) + "px";
        svg.style.height = (svg.viewBox.baseVal.height * scale) + "px";
      }
    });
  });

  readHash();
  apply();
  // What the browser actually drew: nodes with a non-empty box (read by the page's browser test).
  var drawn = nodes.filter(function (n) { var b = n.getBBox(); return b.width > 0 && b.height > 0; }).length;
  document.body.dataset.drawnNodes = String(drawn);
  // Labels wider than their box (none should be: boxes grow with their labels, long ones end in an ellipsis)
  var overflowing = 0;
  nodes.forEach(function (n) {
    var box = n.querySelector("rect:not(.behind):not(.strip)");
    n.querySelectorAll("text").forEach(function (t) {
      if (box && t.getComputedTextLength() > box.width.baseVal.value - 4) overflowing++;
    });
  });
  document.body.dataset.overflowingLabels = String(overflowing);
  function rect(el) {
    var r = el.getBoundingClientRect();
    return [r.left + scrollX, r.top + scrollY, r.width, r.height].map(Math.round).join(",");
  }
  if (svg) document.body.dataset.graphRect = rect(svg);
  var blocks = document.querySelector("#graph g.k-blocks");  // the first box of repeated blocks
  if (blocks) document.body.dataset.blocksRect = rect(blocks);
  document.body.dataset.ready = "1";
})();
