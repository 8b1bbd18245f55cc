/*
 * memtrace flame graph: a small, dependency-free renderer inlined into every HTML page memtrace
 * writes.  Data comes from a <script type="application/json"> element; every name is put in the
 * page with textContent (or as an attribute value), never as markup, so a symbol such as
 * "<script>" stays text.
 *
 *   data: {title, view, by_line, names: [...], wheres: [...],
 *          views: {name: {missing, unit, nodes: [parent, name, where, bytes, count, folded] * n}},
 *          timeline: {t, series, unit, panels, peak: {t, bytes}, stacks: [{frames: [[name, where]], live}]}}
 *   The tree is built by memtrace (memtrace/views/flame.py): merged by function, small nodes folded
 *   into "other", depth-first with every parent before its children, children largest first.
 */
(function () {
  'use strict';
  var ROW = 18;
  var FIELDS = 6;
  var COLORS = ['#f4a261', '#e9c46a', '#f6bd60', '#f28482', '#f5cac3', '#ffb4a2', '#e5989b', '#fec89a'];
  var LINES = ['#1d3557', '#2a9d8f', '#6d597a', '#e76f51', '#457b9d', '#8d99ae'];
  var SVG = 'http://www.w3.org/2000/svg';
  var SHORT = 48;         // names longer than this have their template arguments collapsed

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function svgEl(tag, attrs) {
    var e = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    return e;
  }

  function fmtBytes(n) {
    var u = ['B', 'KB', 'MB', 'GB', 'TB'], i = 0, v = Math.abs(n);
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (n < 0 ? '\u2212' : '') + (i === 0 ? v.toFixed(0) : v.toFixed(1)) + ' ' + u[i];
  }

  function fmtSeconds(s) {
    return s < 1 ? (s * 1000).toFixed(0) + ' ms' : s.toFixed(s < 10 ? 2 : 1) + ' s';
  }

  /* A long C++ name for a box: every template argument list collapsed to <…>, so
     "std::vector<std::string, std::allocator<…>>::_M_realloc_insert" reads std::vector<…>::_M_realloc_insert.
     The full name is in the tooltip.  "operator<", "operator<<" and "operator<=" are not lists. */
  function shortName(name) {
    if (name.length <= SHORT || name.indexOf('<') < 0) return name;
    var out = '', depth = 0;
    for (var i = 0; i < name.length; i++) {
      var c = name.charAt(i);
      // A list opens after a name (vector<); "operator<", "a < b" or "<script>" are not lists.
      if (c === '<' && depth === 0 && (!/[\w:]$/.test(name.slice(0, i)) || /operator\s*<*$/.test(name.slice(0, i)))) {
        out += c;
        continue;
      }
      if (c === '<') { if (depth === 0) out += '<\u2026'; depth++; continue; }
      if (c === '>' && depth > 0) { depth--; if (depth === 0) out += '>'; continue; }
      if (depth === 0) out += c;
    }
    return depth === 0 ? out : name;      // unbalanced (a comparison operator): as it is
  }

  function hash(s) {
    var h = 0;
    for (var i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) | 0;
    return Math.abs(h);
  }

  /* The flat rows into node objects {name, where, bytes, count, folded, parent, kids, depth}. */
  function decode(data, nodes) {
    var out = [];
    for (var i = 0; i + FIELDS <= nodes.length; i += FIELDS) {
      var parent = nodes[i] < 0 ? null : out[nodes[i]];
      var n = { name: data.names[nodes[i + 1]], where: data.wheres[nodes[i + 2]], bytes: nodes[i + 3],
                count: nodes[i + 4], folded: nodes[i + 5], parent: parent, kids: [],
                depth: parent ? parent.depth + 1 : 0 };
      if (parent) parent.kids.push(n);
      out.push(n);
    }
    return out[0] || { name: 'all', where: '', bytes: 0, count: 0, folded: 0, parent: null, kids: [], depth: 0 };
  }

  /* The timeline's stacks (root-first [name, where] pairs) weighed by `value(stack)`, as a tree. */
  function stacksTree(data, stacks, value) {
    var root = { name: 'all', where: '', bytes: 0, count: 0, folded: 0, parent: null, kids: [], depth: 0,
                 index: {} };
    stacks.forEach(function (st) {
      var v = value(st);
      if (!(v > 0)) return;
      root.bytes += v;
      var node = root;
      st.frames.forEach(function (f) {
        var key = data.by_line ? f[0] + ':' + f[1] : String(f[0]);
        var kid = node.index[key];
        if (!kid) {
          kid = node.index[key] = { name: data.names[f[0]], where: data.wheres[f[1]], bytes: 0, count: 0,
                                    folded: 0, parent: node, kids: [], depth: node.depth + 1, index: {} };
          node.kids.push(kid);
        }
        kid.bytes += v;
        node = kid;
      });
    });
    (function sort(n) { n.kids.sort(function (a, b) { return b.bytes - a.bytes; }); n.kids.forEach(sort); })(root);
    return root;
  }

  /* The timeline: one panel per group of series, each on its own scale from zero, the peak
     marked; dragging across a panel selects a time range (onRange(t0, t1), or null to clear). */
  function timeline(box, tl, onRange) {
    box.textContent = '';
    var names = tl && tl.series ? Object.keys(tl.series) : [];
    if (!names.length || !tl.t || tl.t.length < 2) {
      box.appendChild(el('div', 'mt-note', 'memory timeline: not in this capture (fewer than two samples)'));
      return;
    }
    var t0 = tl.t[0], t1 = tl.t[tl.t.length - 1], span = (t1 - t0) || 1;
    var bytes = tl.unit === 'bytes';
    var panels = tl.panels && tl.panels.length ? tl.panels : names.map(function (n) { return [n]; });
    var fmt = function (name, v) { return bytes || /bytes/.test(name) ? fmtBytes(v) : v.toLocaleString(); };
    var x = function (t) { return 1000 * (t - t0) / span; };
    var few = tl.t.length <= 40;                    // a short run: every sample is a visible dot
    var k = 0, selects = [];
    panels.forEach(function (group) {
      var svg = svgEl('svg', { viewBox: '0 0 1000 100', preserveAspectRatio: 'none', 'class': 'mt-panel' });
      var max = 0;
      group.forEach(function (n) { tl.series[n].forEach(function (v) { if (v > max) max = v; }); });
      max = max || 1;
      var legend = el('div', 'mt-legend');
      group.forEach(function (name) {
        var color = LINES[k++ % LINES.length], ys = tl.series[name], pts = [], top = 0;
        ys.forEach(function (v, i) {
          if (v === null || v === undefined) return;     // not read at this sample
          if (v > top) top = v;
          var px = x(tl.t[i]).toFixed(1), py = (98 - 96 * v / max).toFixed(1);
          pts.push(px + ',' + py);
          if (few) svg.appendChild(svgEl('circle', { cx: px, cy: py, r: 2.5, fill: color, 'class': 'mt-dot',
                                                      'vector-effect': 'non-scaling-stroke' }));
        });
        // tracked live is drawn thicker and last in its panel: never hidden under in-use.
        var line = svgEl('polyline', { points: pts.join(' '), fill: 'none', stroke: color,
                                       'stroke-width': name === 'tracked live' ? 3 : 1.5,
                                       'vector-effect': 'non-scaling-stroke', 'data-series': name });
        if (name === 'tracked live') svg.appendChild(line); else svg.insertBefore(line, svg.firstChild);
        var item = el('span', null, '\u25a0 ' + name + ' (max ' + fmt(name, top) + ')');
        item.style.color = color;
        legend.appendChild(item);
      });
      legend.appendChild(el('span', 'mt-note', 'scale 0 to ' + fmt(group[0], max)));
      if (tl.peak && tl.peak.t !== null && tl.peak.t !== undefined && group.indexOf('tracked live') >= 0) {
        var px = x(tl.peak.t).toFixed(1);
        svg.appendChild(svgEl('line', { x1: px, x2: px, y1: 0, y2: 100, stroke: '#d62828', 'stroke-dasharray': '4 3',
                                        'vector-effect': 'non-scaling-stroke', 'class': 'mt-peak' }));
        legend.appendChild(el('span', 'mt-peak-label', '\u2503 peak ' + fmtBytes(tl.peak.bytes) + ' at ' +
                              fmtSeconds(tl.peak.t)));
      }
      var sel = svgEl('rect', { x: 0, y: 0, width: 0, height: 100, fill: 'rgba(69,123,157,0.18)', 'class': 'mt-sel' });
      svg.appendChild(sel);
      selects.push(sel);
      box.appendChild(svg);
      box.appendChild(legend);
      drag(svg);
    });
    box.appendChild(el('div', 'mt-note', 'over ' + fmtSeconds(span) + ', ' + tl.t.length + ' samples' +
      (tl.stacks && tl.stacks.length ? '; drag across the timeline to see a time range\u2019s flame graph' : '')));

    function show(a, b) {
      selects.forEach(function (r) {
        r.setAttribute('x', Math.min(a, b));
        r.setAttribute('width', Math.abs(b - a));
      });
    }

    function drag(svg) {
      var start = null;
      function at(ev) {
        var r = svg.getBoundingClientRect();
        return Math.max(0, Math.min(1000, 1000 * (ev.clientX - r.left) / (r.width || 1)));
      }
      svg.addEventListener('mousedown', function (ev) { start = at(ev); show(start, start); ev.preventDefault(); });
      svg.addEventListener('mousemove', function (ev) { if (start !== null) show(start, at(ev)); });
      window.addEventListener('mouseup', function (ev) {
        if (start === null) return;
        var end = at(ev), a = Math.min(start, end), b = Math.max(start, end);
        start = null;
        if (b - a < 3) { show(0, 0); onRange(null); return; }
        onRange(t0 + span * a / 1000, t0 + span * b / 1000);
      });
    }
    return { clear: function () { show(0, 0); } };
  }

  function flame(container, data) {
    var tip = el('div', 'mt-tip');
    document.body.appendChild(tip);
    var bar = el('div', 'mt-bar');
    var select = el('select');
    var search = el('input');
    search.type = 'search';
    search.placeholder = 'search functions (regexp)';
    var reset = el('button', null, 'reset zoom');
    var status = el('span', 'mt-note');
    Object.keys(data.views).forEach(function (v) {
      var o = el('option', null, v + (data.views[v].missing ? ' (not in this capture)' : ''));
      o.value = v;
      select.appendChild(o);
    });
    select.value = data.view in data.views ? data.view : Object.keys(data.views)[0];
    bar.appendChild(el('label', null, 'view '));
    bar.appendChild(select);
    bar.appendChild(search);
    bar.appendChild(reset);
    bar.appendChild(status);
    var tl = el('div', 'mt-timeline');
    var chart = el('div', 'mt-chart');
    container.appendChild(tl);
    container.appendChild(bar);
    container.appendChild(chart);

    var root = null, zoom = null, unit = 'bytes', range = null, rangeOption = null, folded = false;
    var tlData = data.timeline || {};
    var lines = timeline(tl, tlData, function (a, b) {
      if (a === null) { clearRange(); return; }
      setRange(a, b);
    });

    function fmt(v) { return unit === 'bytes' ? fmtBytes(v) : v.toLocaleString(); }
    function what() { return unit === 'bytes' ? 'allocations' : 'objects'; }

    function clearRange() {
      range = null;
      if (rangeOption) { select.removeChild(rangeOption); rangeOption = null; }
      if (select.value === '' || !(select.value in data.views)) select.value = data.view in data.views ? data.view : Object.keys(data.views)[0];
      load();
    }

    /* The flame graph of [a, b]: each timeline stack's live bytes at the last sample in the range
       (the capture keeps per-time data for its largest stacks only: the page says so). */
    function setRange(a, b) {
      var t = tlData.t || [], last = -1, first = -1;
      for (var i = 0; i < t.length; i++) if (t[i] >= a && t[i] <= b) { if (first < 0) first = i; last = i; }
      range = { a: a, b: b, first: first, last: last };
      if (!rangeOption) { rangeOption = el('option'); rangeOption.value = '@range'; select.appendChild(rangeOption); }
      rangeOption.textContent = 'time range ' + fmtSeconds(a) + '\u2013' + fmtSeconds(b);
      select.value = '@range';
      load();
    }

    function render() {
      chart.textContent = '';
      tip.style.display = 'none';     // its node is gone, and with it the mouseleave that would hide it
      var view = select.value === '@range' ? null : data.views[select.value];
      if (view && view.missing) {
        chart.style.height = 'auto';
        chart.appendChild(el('div', 'mt-note', select.value + ': ' + view.missing));
        status.textContent = '';
        return;
      }
      if (!view && (!range || range.last < 0 || !root.bytes)) {
        chart.style.height = 'auto';
        chart.appendChild(el('div', 'mt-note', !tlData.stacks || !tlData.stacks.length ?
          'time range: this capture keeps no per-stack data over time (an aggregate capture\u2019s timeline has it)' :
          'time range: no sample of the largest stacks in this range'));
        status.textContent = '';
        return;
      }
      var total = zoom.bytes || 1, width = chart.clientWidth || 1000, maxDepth = 0;
      var re = null;
      if (search.value) {
        try { re = new RegExp(search.value, 'i'); } catch (e) { re = null; }
      }
      var matched = 0;
      // The zoomed node's ancestors, full width above it.
      var chain = [];
      for (var a = zoom.parent; a; a = a.parent) chain.unshift(a);
      chain.forEach(function (n, i) { place(n, i, 0, 1, true); });
      (function walk(n, depth, x0, frac) {
        place(n, depth, x0, frac, false);
        if (re && re.test(n.name) && !matchedAbove(n)) matched += n.bytes;
        var x = x0;
        n.kids.forEach(function (k) {
          var f = k.bytes / total;
          if (f * width >= 0.5) walk(k, depth + 1, x, f);
          x += f;
        });
      })(zoom, chain.length, 0, 1);
      chart.style.height = ((maxDepth + 1) * ROW + 2) + 'px';
      var head = view ? '' : 'live at ' + fmtSeconds(tlData.t[range.last]) + ' of the ' + tlData.stacks.length +
        ' largest stacks (the capture\u2019s per-time data): ';
      status.textContent = head + (re ? ('matched ' + fmt(matched) + ' (' + (100 * matched / (root.bytes || 1)).toFixed(1) +
        '% of ' + fmt(root.bytes) + ')' + (folded ? '; callees folded into \u201cother\u201d are not searched' : '')) :
        ('total ' + fmt(root.bytes) + (view ? ' in ' + root.count.toLocaleString() + ' ' + what() : '')));

      function matchedAbove(n) {
        for (var p = n.parent; p; p = p.parent) if (re.test(p.name)) return true;
        return false;
      }

      function place(n, depth, x0, frac, ancestor) {
        maxDepth = Math.max(maxDepth, depth);
        var d = el('div', 'mt-node', shortName(n.name));
        d.title = n.name;
        d.style.left = (100 * x0) + '%';
        d.style.width = (100 * frac) + '%';
        d.style.top = (depth * ROW) + 'px';
        d.style.background = n === root ? '#ddd' : n.folded ? '#e0e0e0' : COLORS[hash(n.name) % COLORS.length];
        if (ancestor) d.classList.add('mt-dim');
        if (frac * width < 8) d.classList.add('mt-thin');     // no padding: a thin box never overlaps its neighbour
        if (n.folded) d.classList.add('mt-other');
        if (re && re.test(n.name)) d.classList.add('mt-match');
        d.addEventListener('click', function () { zoom = n; render(); });
        d.addEventListener('mousemove', function (ev) {
          tip.textContent = n.name + '\n' + fmt(n.bytes) + (unit === 'bytes' ? ' (' + n.bytes.toLocaleString() + ' B, ' : ' (') +
            (100 * n.bytes / (root.bytes || 1)).toFixed(2) + '%)' +
            (view ? '\n' + n.count.toLocaleString() + ' ' + what() : '') +
            (n.folded ? '\n' + n.folded.toLocaleString() + ' smaller callees folded together' : '') +
            (n.where ? '\n' + n.where : '');
          tip.style.display = 'block';
          tip.style.left = Math.min(ev.clientX + 12, window.innerWidth - 660) + 'px';
          tip.style.top = (ev.clientY + 14) + 'px';
        });
        d.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
        chart.appendChild(d);
      }
    }

    function load() {
      if (select.value === '@range') {
        unit = 'bytes';
        root = stacksTree(data, tlData.stacks || [], function (st) {
          return range && range.last >= 0 ? st.live[range.last] : 0;
        });
      } else {
        if (range) { range = null; if (rangeOption) { select.removeChild(rangeOption); rangeOption = null; } if (lines) lines.clear(); }
        var view = data.views[select.value];
        unit = view.unit || 'bytes';
        root = decode(data, view.nodes || []);
        folded = false;
        for (var i = FIELDS - 1; i < (view.nodes || []).length; i += FIELDS) if (view.nodes[i]) { folded = true; break; }
      }
      zoom = root;
      render();
    }

    select.addEventListener('change', load);
    search.addEventListener('input', render);
    reset.addEventListener('click', function () { zoom = root; render(); });
    window.addEventListener('resize', render);
    load();
    return { root: function () { return root; }, render: render, range: setRange };
  }

  window.MT = { flame: flame, fmtBytes: fmtBytes, shortName: shortName, flames: [] };
  document.querySelectorAll('script[type="application/json"][data-mt-flame]').forEach(function (s) {
    var box = document.getElementById(s.getAttribute('data-mt-flame'));
    window.MT.flames.push(flame(box, JSON.parse(s.textContent)));
  });
})();
