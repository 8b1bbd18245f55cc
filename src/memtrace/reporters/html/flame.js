/*
 * memtrace flame graph: a small, dependency-free renderer inlined into every HTML page memtrace
 * writes.  Data comes from a <script type="application/json"> element; every name is put in the
 * page with textContent, never as markup, so a symbol such as "<script>" stays text.
 *
 *   MT.flame(container, data)  data: {title, views: {name: {samples: [{frames, bytes, count}],
 *                              missing}}, view, timeline: {t, series, unit}}; frames root first, each
 *                              {name, where}.
 */
(function () {
  'use strict';
  var ROW = 18;
  var COLORS = ['#f4a261', '#e9c46a', '#f6bd60', '#f28482', '#f5cac3', '#ffb4a2', '#e5989b', '#fec89a'];

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function fmtBytes(n) {
    var u = ['B', 'KB', 'MB', 'GB', 'TB'], i = 0, v = Math.abs(n);
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (n < 0 ? '\u2212' : '') + (i === 0 ? v.toFixed(0) : v.toFixed(1)) + ' ' + u[i];
  }

  function hash(s) {
    var h = 0;
    for (var i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) | 0;
    return Math.abs(h);
  }

  /* Samples (root-first frames) into a tree of {name, where, bytes, count, kids: Map}. */
  function buildTree(samples) {
    var root = { name: 'all', where: '', bytes: 0, count: 0, kids: new Map(), parent: null, depth: 0 };
    samples.forEach(function (s) {
      var node = root;
      root.bytes += s.bytes;
      root.count += s.count;
      s.frames.forEach(function (f) {
        var key = f.name + '\u0000' + (f.where || '');
        var kid = node.kids.get(key);
        if (!kid) {
          kid = { name: f.name, where: f.where || '', bytes: 0, count: 0, kids: new Map(), parent: node,
                  depth: node.depth + 1 };
          node.kids.set(key, kid);
        }
        kid.bytes += s.bytes;
        kid.count += s.count;
        node = kid;
      });
    });
    return root;
  }

  function timeline(box, tl) {
    box.textContent = '';
    var names = tl && tl.series ? Object.keys(tl.series) : [];
    if (!names.length || !tl.t || tl.t.length < 2) {
      box.appendChild(el('div', 'mt-note', 'memory timeline: not in this capture (fewer than two samples)'));
      return;
    }
    var ns = 'http://www.w3.org/2000/svg';
    var svg = document.createElementNS(ns, 'svg');
    svg.setAttribute('viewBox', '0 0 1000 100');
    svg.setAttribute('preserveAspectRatio', 'none');
    var t0 = tl.t[0], t1 = tl.t[tl.t.length - 1] || 1;
    var bytes = tl.unit === 'bytes';
    function top(ys) { return Math.max.apply(null, ys.map(function (v) { return v || 0; })) || 1; }
    // Byte series share one scale from zero, so their lines compare; other series each fill the height.
    var shared = bytes ? Math.max.apply(null, names.map(function (n) { return top(tl.series[n]); })) : 0;
    var legend = el('div', 'mt-legend');
    names.forEach(function (name, k) {
      var ys = tl.series[name], max = bytes ? shared : top(ys);
      var pts = [];
      ys.forEach(function (v, i) {
        if (v === null || v === undefined) return;    // not read at this sample
        pts.push((1000 * (tl.t[i] - t0) / ((t1 - t0) || 1)).toFixed(1) + ',' + (98 - 96 * v / max).toFixed(1));
      });
      var line = document.createElementNS(ns, 'polyline');
      line.setAttribute('points', pts.join(' '));
      line.setAttribute('fill', 'none');
      line.setAttribute('stroke', COLORS[(k * 3) % COLORS.length].replace('#f', '#a'));
      line.setAttribute('stroke-width', '2');
      line.setAttribute('vector-effect', 'non-scaling-stroke');
      svg.appendChild(line);
      var peak = top(ys);
      var item = el('span', null, '\u25a0 ' + name + ' (max ' + (bytes || /bytes/.test(name) ? fmtBytes(peak) : peak.toLocaleString()) + ')');
      item.style.color = COLORS[(k * 3) % COLORS.length].replace('#f', '#a');
      legend.appendChild(item);
    });
    box.appendChild(svg);
    var span = t1 - t0;
    legend.appendChild(el('span', 'mt-note', (bytes ? 'scale 0 to ' + fmtBytes(shared) + ', ' : '') + 'over ' +
      (span < 1 ? (span * 1000).toFixed(0) + ' ms' : span.toFixed(1) + ' s')));
    box.appendChild(legend);
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
    timeline(tl, data.timeline);

    var root = null, zoom = null;

    function render() {
      chart.textContent = '';
      tip.style.display = 'none';     // its node is gone, and with it the mouseleave that would hide it
      var view = data.views[select.value];
      if (view.missing) {
        chart.style.height = 'auto';
        chart.appendChild(el('div', 'mt-note', select.value + ': ' + view.missing));
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
        Array.from(n.kids.values()).sort(function (p, q) { return q.bytes - p.bytes; }).forEach(function (k) {
          var f = k.bytes / total;
          if (f * width >= 0.5) walk(k, depth + 1, x, f);
          x += f;
        });
      })(zoom, chain.length, 0, 1);
      chart.style.height = ((maxDepth + 1) * ROW + 2) + 'px';
      status.textContent = re ? ('matched ' + fmtBytes(matched) + ' (' + (100 * matched / (root.bytes || 1)).toFixed(1) +
        '% of ' + fmtBytes(root.bytes) + ')') : ('total ' + fmtBytes(root.bytes) + ' in ' + root.count.toLocaleString() +
        ' allocations');

      function matchedAbove(n) {
        for (var p = n.parent; p; p = p.parent) if (re.test(p.name)) return true;
        return false;
      }

      function place(n, depth, x0, frac, ancestor) {
        maxDepth = Math.max(maxDepth, depth);
        var d = el('div', 'mt-node', n.name);
        d.style.left = (100 * x0) + '%';
        d.style.width = (100 * frac) + '%';
        d.style.top = (depth * ROW) + 'px';
        d.style.background = n === root ? '#ddd' : COLORS[hash(n.name) % COLORS.length];
        if (ancestor) d.classList.add('mt-dim');
        if (re && re.test(n.name)) d.classList.add('mt-match');
        d.addEventListener('click', function () { zoom = n; render(); });
        d.addEventListener('mousemove', function (ev) {
          tip.textContent = n.name + '\n' + fmtBytes(n.bytes) + ' (' + n.bytes.toLocaleString() + ' B, ' +
            (100 * n.bytes / (root.bytes || 1)).toFixed(2) + '%)\n' + n.count.toLocaleString() + ' allocations' +
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
      var view = data.views[select.value];
      root = buildTree(view.samples || []);
      zoom = root;
      render();
    }

    select.addEventListener('change', load);
    search.addEventListener('input', render);
    reset.addEventListener('click', function () { zoom = root; render(); });
    window.addEventListener('resize', render);
    load();
    return { root: function () { return root; }, render: render };
  }

  window.MT = { flame: flame, fmtBytes: fmtBytes };
  document.querySelectorAll('script[type="application/json"][data-mt-flame]').forEach(function (s) {
    var box = document.getElementById(s.getAttribute('data-mt-flame'));
    flame(box, JSON.parse(s.textContent));
  });
})();
