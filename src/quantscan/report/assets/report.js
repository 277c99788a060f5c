
(function () {
  // Sort any table.sortable by the clicked column: numbers before text, empty cells last.
  function key(s) {
    s = s.trim();
    if (s === "" || s === "–") return null;
    if (s === "inf") return Infinity;
    if (s === "-inf") return -Infinity;
    var n = Number(s);
    return isNaN(n) ? s.toLowerCase() : n;
  }
  function cmp(a, b) {
    if (a === b) return 0;
    if (a === null) return 1;
    if (b === null) return -1;
    if (typeof a !== typeof b) return typeof a === "number" ? -1 : 1;
    return a < b ? -1 : 1;
  }
  document.querySelectorAll("table.sortable").forEach(function (t) {
    t.tHead.addEventListener("click", function (e) {
      var th = e.target.closest("th");
      if (!th) return;
      var i = th.cellIndex, asc = th.dataset.dir !== "asc";
      t.tHead.querySelectorAll("th").forEach(function (h) { delete h.dataset.dir; });
      th.dataset.dir = asc ? "asc" : "desc";
      var body = t.tBodies[0];
      var keyed = Array.prototype.map.call(body.rows, function (r, j) {
        return [key(r.cells[i] ? r.cells[i].textContent : ""), j, r];
      });
      keyed.sort(function (a, b) {
        var c = cmp(a[0], b[0]);
        if (a[0] !== null && b[0] !== null && !asc) c = -c;
        return c || a[1] - b[1];
      });
      var f = document.createDocumentFragment();
      keyed.forEach(function (k) { f.appendChild(k[2]); });
      body.appendChild(f);
    });
  });
  // Filter the layer table by op type and free text.
  var t = document.getElementById("layertable");
  if (!t) return;
  var op = document.getElementById("opfilter"), tx = document.getElementById("textfilter");
  var cnt = document.getElementById("rowcount"), oc = parseInt(t.dataset.opcol, 10);
  function apply() {
    var want = op.value, q = tx.value.trim().toLowerCase(), n = 0, rows = t.tBodies[0].rows;
    for (var j = 0; j < rows.length; j++) {
      var r = rows[j];
      var ok = (!want || (oc >= 0 && r.cells[oc].textContent === want)) &&
               (!q || r.textContent.toLowerCase().indexOf(q) >= 0);
      r.hidden = !ok;
      if (ok) n++;
    }
    cnt.textContent = n + " of " + rows.length + " sites";
  }
  op.addEventListener("change", apply);
  tx.addEventListener("input", apply);
})();
