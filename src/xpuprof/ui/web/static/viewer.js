/* xpuprof trace viewer: one <canvas>, fed by the server's window queries.
 *
 * The server answers a time window at the canvas's width in pixels: events at least one pixel
 * wide as they are, thinner ones merged into per-pixel summaries (docs/web.md). Times on the
 * wire are ns from the trace's first event (exact in a JavaScript number). Names are drawn
 * with fillText or put in the page with textContent: never as HTML.
 *
 * With "simulated" on (``sim=1`` in the address) the replay's simulated timeline is drawn
 * too: after each replayed thread and stream, a track "sim: <name>" (tinted) holding the same
 * events at their simulated times; a click on one shows the event with its simulated start,
 * duration and deviation, and both places are outlined. With ``whatif=CHANGES`` too (the
 * what-if page's link) those tracks are the what-if's: "what-if: <name>", the events at the
 * times of the trace replayed with the changes.
 *
 * Keys (canvas focused): W/S zoom in/out, A/D pan, arrows scroll, F fit the selection,
 * 0 the whole trace, Esc clear the selection. Mouse: wheel zooms at the pointer (shift+wheel
 * or wheel over the track names scrolls), drag pans, click selects.
 *
 * window.xpuprofViewer exposes the state tests read: the window, the last query's time,
 * the items drawn, whether a query is pending.
 */
'use strict';
(function () {
  const GUTTER = 230;
  /** The share of the window's height the side panel takes under the timeline on a narrow
   * screen (style.css's max-height of .xp-panel there). */
  const PANEL_BELOW = 0.3;
  const AXIS = 24;
  const STRIP = 12;
  const LANE = 18;
  const COUNTER_H = 40;
  const GROUP_H = 20;
  const GAP = 4;
  const MIN_SPAN = 1000;  // ns: a microsecond across the canvas at most zoom
  const DEBOUNCE = 40;

  const colorCache = new Map();
  function color(name) {
    let c = colorCache.get(name);
    if (!c) {
      let h = 2166136261;
      for (let i = 0; i < name.length; i++) { h ^= name.charCodeAt(i); h = Math.imul(h, 16777619); }
      const hue = ((h >>> 0) % 360);
      c = `hsl(${hue},55%,${58 + ((h >>> 9) % 14)}%)`;
      colorCache.set(name, c);
      if (colorCache.size > 20000) colorCache.clear();
    }
    return c;
  }
  const CP_COLORS = {};
  function cpColor(cat) {
    if (!CP_COLORS[cat]) CP_COLORS[cat] = color('cp:' + cat);
    return CP_COLORS[cat];
  }

  /** A time in the unit of its size, with the decimals that tell apart times ``step`` ns
   *  apart: ticks 200 µs apart at 41 s read 41.4012 s, 41.4014 s… */
  function fmtAt(ns, step) {
    const a = Math.abs(ns);
    const [scale, unit] = a >= 1e9 ? [1e9, 's'] : a >= 1e6 ? [1e6, 'ms'] : a >= 1e3 ? [1e3, 'µs'] : [1, 'ns'];
    const decimals = Math.max(0, Math.min(9, Math.ceil(-Math.log10(Math.max(step, 1e-9) / scale))));
    return `${(ns / scale).toFixed(decimals)} ${unit}`;
  }

  function niceStep(raw) {
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }

  window.xpuprofViewerPage = function mount(ctx) {
    const X = window.xpuprof;
    const {el, api, fmtNs} = X;
    const main = ctx.main;
    const params = ctx.params;

    // ------------------------------------------------------------------- state
    const S = {
      tracks: null, byId: new Map(), groups: [], collapsed: new Set(), rows: [], rowOf: new Map(),
      contentH: 0, view: {ts0: 0, ts1: 1}, scrollY: 0, data: null, index: new Map(),
      selected: null, highlight: new Map(), overlays: null, cp: params.get('cp') === '1',
      findings: params.get('fd') === '1', flows: params.get('flows') !== '0',
      sim: params.get('sim') === '1', whatif: (params.get('whatif') || '').trim(),
      ctrl: null, timer: null, pending: 0, requests: 0, errors: 0, lastQueryMs: null,
      serverMs: null, drawnItems: 0, queries: [], hover: null, w: 0, h: 0,
    };
    const pub = window.xpuprofViewer = {
      get window() { return {ts0: S.view.ts0, ts1: S.view.ts1, width: plotW()}; },
      get lastQueryMs() { return S.lastQueryMs; },
      get serverMs() { return S.serverMs; },
      get drawnItems() { return S.drawnItems; },
      get requests() { return S.requests; },
      get errors() { return S.errors; },
      get idle() { return S.pending === 0 && S.timer === null && S.tracks !== null; },
      get queries() { return S.queries.slice(); },
      get selected() { return S.selected; },
      get highlighted() { return [...S.highlight.keys()]; },
      get items() { return S.data ? S.data.items : 0; },
      get origin() { return S.tracks ? S.tracks.origin_text : null; },
      get tracks() { return S.tracks ? S.tracks.tracks.length : 0; },
      get sim() { return S.sim; },
      get simTracks() { return S.tracks ? S.tracks.tracks.filter(t => t.sim).length : 0; },
      get whatif() { return S.whatif; },
      /** Turn the simulated tracks on or off (what the checkbox does). */
      setSim: on => setSim(on),
      get overlayError() { return S.overlayError || null; },
      get overlays() {
        const o = S.overlays;
        return o ? {critical_path: (o.critical_path || []).length, findings: (o.findings || []).length} : null;
      },
      zoom: f => zoomAt(f, GUTTER + plotW() / 2),
      pan: f => panBy(f * span()),
      setWindow: (a, b) => setView(a, b),
      select: id => selectId(id, true),
      /** Where on the canvas (CSS px) the event drawn with this id is (on ``track`` when
       * given: its simulated span is drawn with the same id): for tests. */
      locate: (id, track) => locate(id, track),
    };

    // --------------------------------------------------------------------- DOM
    const search = el('input', {type: 'search', id: 'xp-search', placeholder: 'search events by name…',
                                'aria-label': 'search events by name', autocomplete: 'off'});
    const results = el('ul', {class: 'xp-results', id: 'xp-results', hidden: true});
    const cpBox = el('input', {type: 'checkbox', id: 'xp-ov-cp', checked: S.cp});
    const fdBox = el('input', {type: 'checkbox', id: 'xp-ov-findings', checked: S.findings});
    const flowBox = el('input', {type: 'checkbox', id: 'xp-ov-flows', checked: S.flows});
    const simBox = el('input', {type: 'checkbox', id: 'xp-ov-sim', checked: S.sim});
    const status = el('span', {class: 'xp-status', id: 'xp-viewer-status'});
    const toolbar = el('div', {class: 'xp-toolbar'},
      el('div', {class: 'xp-search-box'}, search, results),
      el('label', {title: 'outline the critical path'}, cpBox, ' critical path'),
      el('label', {title: "outline the advisor's findings"}, fdBox, ' findings'),
      el('label', {title: 'arrows from launches to kernels'}, flowBox, ' flows'),
      el('label', {title: S.whatif ? `the timeline replayed with the changes ${S.whatif}: a track beside each replayed thread and stream`
                                   : "the replay's simulated timeline: a track beside each replayed thread and stream"},
         simBox, S.whatif ? ' what-if' : ' simulated'),
      S.whatif ? el('code', {class: 'xp-whatif-tag', id: 'xp-viewer-whatif', title: 'the changes of the what-if tracks', text: S.whatif}) : '',
      el('button', {type: 'button', id: 'xp-zoom-in', title: 'zoom in (W)', text: '+'}),
      el('button', {type: 'button', id: 'xp-zoom-out', title: 'zoom out (S)', text: '−'}),
      el('button', {type: 'button', id: 'xp-zoom-fit', title: 'the whole trace (0)', text: 'fit'}),
      status);
    const canvas = el('canvas', {id: 'xp-canvas', tabindex: 0,
                                 'aria-label': 'trace timeline: W/S zoom, A/D pan, click selects'});
    const tip = el('div', {class: 'xp-tip', hidden: true});
    const stage = el('div', {class: 'xp-stage'}, canvas, tip);
    const panel = el('aside', {class: 'xp-panel', id: 'xp-panel'},
                     el('p', {class: 'xp-help', text: 'Click an event to see its fields, args, ancestry and flows.'}));
    const body = el('div', {class: 'xp-viewer-body'}, stage, panel);
    main.classList.add('xp-viewer');
    main.append(toolbar, body);
    const g = canvas.getContext('2d');

    // ------------------------------------------------------------------ layout
    function plotW() { return Math.max(1, S.w - GUTTER); }
    function plotTop() { return AXIS + (S.cp ? STRIP : 0); }
    function plotH() { return Math.max(1, S.h - plotTop()); }
    function span() { return S.view.ts1 - S.view.ts0; }
    function nsPerPx() { return span() / plotW(); }
    function xOf(ts) { return GUTTER + (ts - S.view.ts0) / nsPerPx(); }

    function layout() {
      S.rows = [];
      S.rowOf = new Map();
      let y = 0;
      for (const grp of S.groups) {
        S.rows.push({kind: 'group', label: grp.label, y, h: GROUP_H, group: grp.label});
        y += GROUP_H;
        if (S.collapsed.has(grp.label)) continue;
        for (const t of grp.tracks) {
          const h = t.kind === 'counter' ? COUNTER_H : Math.max(1, t.lanes) * LANE;
          const row = {kind: 'track', t, y, h};
          S.rows.push(row);
          S.rowOf.set(t.track, row);
          y += h + GAP;
        }
      }
      S.contentH = y;
      clampScroll();
    }

    function clampScroll() {
      S.scrollY = Math.max(0, Math.min(S.scrollY, Math.max(0, S.contentH - plotH() + 8)));
    }

    function visibleTracks() {
      const top = S.scrollY, bottom = S.scrollY + plotH();
      return S.rows.filter(r => r.kind === 'track' && r.y + r.h > top && r.y < bottom).map(r => r.t.track);
    }

    function laneY(track, depth) {
      const row = S.rowOf.get(track);
      if (!row) return null;
      return plotTop() + row.y - S.scrollY + (depth || 0) * LANE;
    }

    function resize() {
      const rect = stage.getBoundingClientRect();
      const w = Math.max(300, Math.floor(rect.width));
      // on a narrow screen the side panel sits under the timeline (style.css): leave it room
      const below = getComputedStyle(body).flexDirection === 'column';
      const room = below ? Math.round(window.innerHeight * PANEL_BELOW) + 8 : 0;
      const h = Math.max(240, Math.floor(window.innerHeight - rect.top - 12 - room));
      const dpr = window.devicePixelRatio || 1;
      if (w === S.w && h === S.h && canvas.width === Math.round(w * dpr)) return false;
      S.w = w; S.h = h;
      canvas.style.width = `${w}px`;
      canvas.style.height = `${h}px`;
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      clampScroll();
      return true;
    }

    // -------------------------------------------------------------------- view
    function setView(ts0, ts1, quiet) {
      const total = S.tracks ? Math.max(MIN_SPAN, S.tracks.t1 - S.tracks.t0) : 1e9;
      let s = Math.max(MIN_SPAN, Math.min(ts1 - ts0, total * 1.5));
      let a = (ts0 + ts1) / 2 - s / 2;
      const lo = (S.tracks ? S.tracks.t0 : 0) - total * 0.25;
      const hi = (S.tracks ? S.tracks.t1 : total) + total * 0.25;
      if (a < lo) a = lo;
      if (a + s > hi) a = Math.max(lo, hi - s);
      S.view = {ts0: a, ts1: a + s};
      draw();
      if (!quiet) { schedule(); saveHash(); }
    }

    function zoomAt(factor, px) {
      const at = S.view.ts0 + (Math.min(Math.max(px, GUTTER), S.w) - GUTTER) * nsPerPx();
      setView(at - (at - S.view.ts0) * factor, at + (S.view.ts1 - at) * factor);
    }

    function panBy(ns) { setView(S.view.ts0 + ns, S.view.ts1 + ns); }

    function scrollBy(dy) {
      const before = S.scrollY;
      S.scrollY += dy;
      clampScroll();
      if (S.scrollY !== before) { draw(); schedule(); }
    }

    function fitAll() {
      const t0 = S.tracks.t0, t1 = S.tracks.t1;
      const pad = Math.max(MIN_SPAN, t1 - t0) * 0.02;
      setView(t0 - pad, t1 + pad);
    }

    // ------------------------------------------------------------------- fetch
    /** What every question asks for the simulated tracks: the replay's, or the what-if's. */
    function simParams() {
      if (!S.sim) return null;
      return S.whatif ? {sim: 1, whatif: S.whatif} : {sim: 1};
    }

    function schedule() {
      if (S.timer !== null) clearTimeout(S.timer);
      S.timer = setTimeout(() => { S.timer = null; fetchWindow(); }, DEBOUNCE);
    }

    async function fetchWindow() {
      if (!S.tracks) return;
      if (S.ctrl) S.ctrl.abort();
      const ctrl = S.ctrl = new AbortController();
      const visible = visibleTracks();
      const all = S.tracks.tracks.length;
      const q = {ts0: Math.floor(S.view.ts0), ts1: Math.ceil(S.view.ts1), width: Math.floor(plotW())};
      if (q.ts1 <= q.ts0) q.ts1 = q.ts0 + 1;
      if (visible.length < all) q.tracks = visible.join(',');
      Object.assign(q, simParams() || {});
      if (!visible.length) { S.data = null; draw(); return; }
      S.pending++;
      S.requests++;
      const t = performance.now();
      try {
        const d = await api(X.storeApi('view/window'), q, ctrl.signal);
        if (ctrl !== S.ctrl) return;
        S.lastQueryMs = performance.now() - t;
        S.serverMs = d.elapsed_ms;
        S.queries.push({ms: S.lastQueryMs, server: d.elapsed_ms, items: d.items});
        if (S.queries.length > 1000) S.queries.shift();
        S.data = d;
        buildIndex();
        draw();
      } catch (e) {
        if (e.name !== 'AbortError') { S.errors++; status.textContent = `error: ${e.message}`; }
      } finally {
        S.pending--;
      }
    }

    function buildIndex() {
      S.index = new Map();
      const ev = S.data.events;
      for (let i = 0; i < ev.id.length; i++) {
        const k = ev.track[i] * 4096 + ev.depth[i];
        let list = S.index.get(k);
        if (!list) S.index.set(k, list = []);
        list.push(i);
      }
      for (const list of S.index.values()) list.sort((a, b) => ev.ts[a] - ev.ts[b]);
    }

    // -------------------------------------------------------------------- draw
    let frame = null;
    function draw() {
      if (frame === null) frame = requestAnimationFrame(() => { frame = null; paint(); });
    }

    function clipText(text, w) {
      if (w < 14) return '';
      const avg = 6.2;
      const n = Math.floor((w - 6) / avg);
      if (n <= 1) return '';
      return text.length <= n ? text : text.slice(0, n - 1) + '…';
    }

    function paint() {
      const W = S.w, H = S.h;
      g.clearRect(0, 0, W, H);
      g.fillStyle = '#fff';
      g.fillRect(0, 0, W, H);
      if (!S.tracks) return;
      const top = plotTop();
      const npp = nsPerPx();
      let drawn = 0;
      g.font = '11px system-ui, sans-serif';
      g.textBaseline = 'middle';
      // rows: stripes and names
      for (const r of S.rows) {
        const y = top + r.y - S.scrollY;
        if (y + r.h < top || y > H) continue;
        if (r.kind === 'group') {
          g.fillStyle = '#e8ecf4';
          g.fillRect(0, y, W, r.h);
          g.fillStyle = '#223';
          g.font = 'bold 11px system-ui, sans-serif';
          g.fillText(`${S.collapsed.has(r.group) ? '▸' : '▾'} ${clipText(r.label, W - 20)}`, 6, y + r.h / 2);
          g.font = '11px system-ui, sans-serif';
        } else {
          g.fillStyle = r.t.sim ? '#f6f1fb' : (r.t.track % 2) ? '#fafbfd' : '#f3f5f9';
          g.fillRect(GUTTER, y, W - GUTTER, r.h);
          g.fillStyle = r.t.sim ? '#ede4f7' : '#f7f7f7';
          g.fillRect(0, y, GUTTER, r.h);
          g.fillStyle = r.t.sim ? '#5b2d8a' : '#333';
          g.fillText(clipText(r.t.label, GUTTER - 16), 14, y + Math.min(r.h, LANE) / 2);
        }
      }
      g.save();
      g.beginPath();
      g.rect(GUTTER, top, W - GUTTER, H - top);
      g.clip();
      const d = S.data;
      if (d) {
        // summaries: shaded by busy fraction
        const sm = d.summaries;
        for (let i = 0; i < sm.track.length; i++) {
          const y = laneY(sm.track[i], sm.depth[i]);
          if (y === null || y + LANE < top || y > H) continue;
          const x = xOf(sm.ts[i]);
          const w = Math.max(1, sm.dur[i] / npp);
          g.globalAlpha = 0.25 + 0.75 * Math.max(0, Math.min(1, sm.busy[i]));
          g.fillStyle = color(sm.name[i] || '');
          g.fillRect(x, y + 1, w, LANE - 2);
          drawn++;
        }
        g.globalAlpha = 1;
        // events
        const ev = d.events;
        for (let i = 0; i < ev.id.length; i++) {
          const y = laneY(ev.track[i], ev.depth[i]);
          if (y === null || y + LANE < top || y > H) continue;
          const x = xOf(ev.ts[i]);
          const w = Math.max(1, (ev.dur[i] || 0) / npp);
          if (x + w < GUTTER || x > W) continue;
          g.fillStyle = color(ev.name[i]);
          g.fillRect(x, y + 1, w, LANE - 2);
          drawn++;
          if (w > 24) {
            const x0 = Math.max(x, GUTTER);
            const t = clipText(ev.name[i], Math.min(x + w, W) - x0);
            if (t) { g.fillStyle = '#111'; g.fillText(t, x0 + 3, y + LANE / 2); }
          }
        }
        drawn += paintCounters(d, top, H);
        if (S.flows) paintFlows(d);
      }
      paintOverlays(top, H);
      paintMarks();
      g.restore();
      paintAxis();
      S.drawnItems = drawn;
      const it = d ? `${d.items.toLocaleString()} items` : 'no data';
      const q = S.lastQueryMs === null ? '' : ` · ${S.lastQueryMs.toFixed(0)} ms (server ${(S.serverMs || 0).toFixed(0)} ms)`;
      const prec = span() / 10;
      status.textContent = `${fmtAt(S.view.ts0, prec)} – ${fmtAt(S.view.ts1, prec)} · ${fmtNs(npp)}/px · ${it}${q}`;
    }

    function paintCounters(d, top, H) {
      const c = d.counters;
      const per = new Map();
      for (let i = 0; i < c.track.length; i++) {
        let p = per.get(c.track[i]);
        if (!p) per.set(c.track[i], p = []);
        p.push(i);
      }
      let n = 0;
      for (const [track, idx] of per) {
        const row = S.rowOf.get(track);
        if (!row) continue;
        const y0 = top + row.y - S.scrollY;
        if (y0 + row.h < top || y0 > H) continue;
        idx.sort((a, b) => c.ts[a] - c.ts[b]);
        let max = 0;
        for (const i of idx) max = Math.max(max, Math.abs(c.value[i] || 0));
        const yOf = v => y0 + row.h - 3 - (max ? (v / max) * (row.h - 6) : 0);
        g.beginPath();
        g.moveTo(xOf(c.ts[idx[0]]), y0 + row.h - 3);
        let last = y0 + row.h - 3;
        for (const i of idx) {
          const x = xOf(c.ts[i]);
          g.lineTo(x, last);
          last = yOf(c.value[i] || 0);
          g.lineTo(x, last);
          n++;
        }
        g.lineTo(S.w, last);
        g.lineTo(S.w, y0 + row.h - 3);
        g.closePath();
        g.fillStyle = 'rgba(70,130,180,0.35)';
        g.fill();
        g.strokeStyle = 'steelblue';
        g.stroke();
        g.fillStyle = '#335';
        g.fillText(`max ${max.toLocaleString()}`, GUTTER + 4, y0 + 8);
      }
      return n;
    }

    function paintFlows(d) {
      const f = d.flows;
      g.strokeStyle = 'rgba(40,60,140,0.55)';
      g.fillStyle = 'rgba(40,60,140,0.75)';
      g.lineWidth = 1;
      for (let i = 0; i < f.src.length; i++) {
        const ys = laneY(f.src_track[i], f.src_depth[i]);
        const yd = laneY(f.dst_track[i], f.dst_depth[i]);
        if (ys === null || yd === null) continue;
        const x1 = xOf(f.src_ts[i]), y1 = ys + LANE / 2;
        const x2 = xOf(f.dst_ts[i]), y2 = yd + LANE / 2;
        g.beginPath();
        g.moveTo(x1, y1);
        const mx = (x1 + x2) / 2;
        g.bezierCurveTo(mx, y1, mx, y2, x2, y2);
        g.stroke();
        g.beginPath();
        g.moveTo(x2, y2);
        g.lineTo(x2 - 6, y2 - 3);
        g.lineTo(x2 - 6, y2 + 3);
        g.closePath();
        g.fill();
      }
    }

    function outline(ev, style, width, dash) {
      const y = laneY(ev.track, ev.depth);
      if (y === null) return;
      const x = xOf(ev.ts);
      const w = Math.max(2, (ev.dur || 0) / nsPerPx());
      g.strokeStyle = style;
      g.lineWidth = width;
      g.setLineDash(dash || []);
      g.strokeRect(x - 1, y, w + 2, LANE);
      g.setLineDash([]);
    }

    function paintOverlays(top) {
      const o = S.overlays;
      if (!o) return;
      if (S.cp && o.critical_path) {
        for (const seg of o.critical_path) {
          const x = xOf(seg.ts), w = Math.max(1, (seg.dur || 0) / nsPerPx());
          if (x + w < GUTTER || x > S.w) continue;
          g.fillStyle = cpColor(seg.category || '?');
          g.fillRect(x, AXIS + 1, w, STRIP - 2);
          if (seg.track !== null && seg.track !== undefined) outline(seg, '#d00', 2);
        }
      }
      if (S.findings && o.findings) {
        for (const f of o.findings) for (const ev of f.events || []) outline(ev, '#e07000', 2, [4, 2]);
      }
    }

    function paintMarks() {
      for (const ev of S.highlight.values()) if (ev) outline(ev, '#f0a000', 3);
      if (S.selected) outline(S.selected, '#000', 2);
      if (S.selected && S.selected.simulated && S.sim) outline(S.selected.simulated, '#7a3db8', 2, [5, 3]);
    }

    function paintAxis() {
      g.fillStyle = '#fff';
      g.fillRect(0, 0, S.w, AXIS);
      g.fillStyle = '#eef';
      g.fillRect(0, 0, GUTTER, AXIS);
      g.fillStyle = '#335';
      g.fillText(S.cp ? 'time · critical path ↓' : 'time from the first event', 6, AXIS / 2);
      const step = niceStep(span() / Math.max(1, plotW() / 110));
      g.strokeStyle = '#ccd';
      g.lineWidth = 1;
      g.fillStyle = '#333';
      for (let t = Math.ceil(S.view.ts0 / step) * step; t < S.view.ts1; t += step) {
        const x = xOf(t);
        if (x < GUTTER) continue;
        g.beginPath();
        g.moveTo(x + 0.5, AXIS - 6);
        g.lineTo(x + 0.5, AXIS);
        g.stroke();
        g.fillText(fmtAt(t, step), x + 3, AXIS / 2 - 1);
      }
      g.beginPath();
      g.moveTo(0, AXIS + 0.5);
      g.lineTo(S.w, AXIS + 0.5);
      g.stroke();
    }

    // -------------------------------------------------------------- hit tests
    function hit(px, py) {
      if (!S.data || px < GUTTER || py < plotTop()) return null;
      const contentY = py - plotTop() + S.scrollY;
      const row = S.rows.find(r => r.kind === 'track' && contentY >= r.y && contentY < r.y + r.h);
      if (!row || row.t.kind === 'counter') return null;
      const depth = Math.floor((contentY - row.y) / LANE);
      const ts = S.view.ts0 + (px - GUTTER) * nsPerPx();
      const slack = 2 * nsPerPx();
      const ev = S.data.events;
      const list = S.index.get(row.t.track * 4096 + depth) || [];
      let best = null;
      for (const i of list) {
        if (ev.ts[i] - slack > ts) break;
        const end = ev.ts[i] + Math.max(ev.dur[i] || 0, nsPerPx());
        if (end + slack >= ts) best = i;
      }
      if (best !== null) {
        return {kind: 'event', id: ev.id[best], name: ev.name[best], ts: ev.ts[best], dur: ev.dur[best],
                track: ev.track[best], depth: ev.depth[best], level: ev.level[best]};
      }
      const sm = S.data.summaries;
      for (let i = 0; i < sm.track.length; i++) {
        if (sm.track[i] === row.t.track && sm.depth[i] === depth && sm.ts[i] - slack <= ts &&
            sm.ts[i] + sm.dur[i] + slack >= ts) {
          return {kind: 'summary', ts: sm.ts[i], dur: sm.dur[i], count: sm.count[i], busy: sm.busy[i],
                  name: sm.name[i]};
        }
      }
      return null;
    }

    function rowAt(py) {
      const contentY = py - plotTop() + S.scrollY;
      return S.rows.find(r => contentY >= r.y && contentY < r.y + r.h) || null;
    }

    function locate(id, track) {
      const ev = S.data && S.data.events;
      if (!ev) return null;
      let i = -1;
      for (let k = 0; k < ev.id.length && i < 0; k++) {
        if (ev.id[k] === id && (track === undefined || ev.track[k] === track)) i = k;
      }
      if (i < 0) return null;
      const y = laneY(ev.track[i], ev.depth[i]);
      const x0 = Math.max(GUTTER, xOf(ev.ts[i]));
      const x1 = Math.min(S.w, xOf(ev.ts[i]) + Math.max(1, (ev.dur[i] || 0) / nsPerPx()));
      const rect = canvas.getBoundingClientRect();
      return {x: rect.left + (x0 + x1) / 2, y: rect.top + y + LANE / 2, visible: y >= plotTop() && y < S.h};
    }

    // -------------------------------------------------------------- selection
    async function selectId(id, jump, track) {
      S.selected = Object.assign({id}, S.selected && S.selected.id === id ? S.selected : {});
      panel.replaceChildren(el('p', {class: 'xp-loading', text: 'Loading the event…'}));
      let e;
      try {
        e = await api(X.storeApi(`view/event/${encodeURIComponent(id)}`), simParams(),
                      ctx.abort.signal);
      } catch (err) {
        if (err.name === 'AbortError') return;
        panel.replaceChildren(el('p', {class: 'xp-error', text: err.message}));
        return;
      }
      S.selected = e;
      const onSim = track !== undefined && S.byId.get(track) && S.byId.get(track).sim;
      showEvent(e, onSim);
      if (jump) reveal(e);
      draw();
      saveHash();
    }

    function reveal(e) {
      const row = S.rowOf.get(e.track);
      if (!row && e.track !== null) {
        for (const grp of S.groups) {
          if (grp.tracks.some(t => t.track === e.track)) S.collapsed.delete(grp.label);
        }
        layout();
      }
      const dur = e.dur || 0;
      const x0 = xOf(e.ts), x1 = xOf(e.ts + dur);
      if (!(x0 >= GUTTER && x1 <= S.w && x1 - x0 >= 2)) {
        const s = Math.max(dur * 3, MIN_SPAN * 20);
        setView(e.ts + dur / 2 - s / 2, e.ts + dur / 2 + s / 2);
      }
      const r = S.rowOf.get(e.track);
      if (r) {
        const y = r.y + (e.depth || 0) * LANE;
        if (y < S.scrollY || y + LANE > S.scrollY + plotH()) {
          S.scrollY = y - plotH() / 3;
          clampScroll();
          schedule();
        }
      }
      draw();
    }

    function field(dl, name, value) {
      dl.append(el('dt', {text: name}), el('dd', {data: {field: name}, text: value === null || value === undefined ? '–' : value}));
    }

    function eventButton(a, extra) {
      const b = el('button', {type: 'button', class: 'xp-link', data: {id: a.id},
                              text: `${a.level || a.kind || ''} ${a.name}`.trim()});
      if (extra) b.append(el('span', {class: 'xp-dim', text: ` ${extra}`}));
      b.addEventListener('click', () => selectId(a.id, true));
      return b;
    }

    function showEvent(e, onSim) {
      const dl = el('dl', {class: 'xp-fields', id: 'xp-event-fields'});
      field(dl, 'id', e.id);
      field(dl, 'level', e.level);
      field(dl, 'category', e.category);
      field(dl, 'rank', e.rank);
      // the track as its name reads (string pids and tids are negative numbers in the store)
      const tr = S.byId.get(e.track);
      field(dl, 'track', tr ? `${tr.group} · ${tr.label}` : e.track);
      field(dl, 'pid', e.pid);
      field(dl, 'tid', e.tid);
      field(dl, 'device', e.device);
      field(dl, 'stream', e.stream);
      field(dl, 'start', `${fmtNs(e.ts)} from the first event`);
      field(dl, 'duration', e.dur === null ? 'instant' : fmtNs(e.dur));
      field(dl, 'dur_ns', e.dur);
      const sim = e.simulated;
      if (S.sim && sim) {
        const sign = v => (v > 0 ? '+' : v < 0 ? '−' : '±') + fmtNs(Math.abs(v));
        field(dl, 'simulated start', `${fmtNs(sim.ts)} from the first event`);
        field(dl, 'simulated duration', fmtNs(sim.dur));
        field(dl, 'start deviation', sign(sim.start_deviation_ns));
        field(dl, 'duration change', sign(sim.duration_change_ns));
      } else if (S.sim && 'simulated' in e) {
        field(dl, 'simulated', 'not replayed');
      }
      field(dl, 'step', e.step);
      field(dl, 'flops', e.flops);
      field(dl, 'bytes', e.bytes);
      const args = el('table', {class: 'xp-args', id: 'xp-event-args'});
      const a = e.args && typeof e.args === 'object' ? e.args : {};
      for (const [k, v] of Object.entries(a)) {
        args.append(el('tr', {data: {arg: k}}, el('th', {text: k}),
                        el('td', {text: typeof v === 'string' ? v : JSON.stringify(v)})));
      }
      const anc = el('ol', {class: 'xp-ancestry', id: 'xp-event-ancestry'});
      for (const x of e.ancestry || []) {
        anc.append(el('li', {data: {id: x.id, level: x.level}},
                      eventButton(x, `${x.dur === null ? '' : fmtNs(x.dur)}${x.via && x.via !== 'parent' ? ' · via ' + x.via : ''}`)));
      }
      const flows = el('ul', {class: 'xp-flows', id: 'xp-event-flows'});
      for (const f of e.flows || []) {
        flows.append(el('li', {data: {id: f.id, kind: f.kind, direction: f.direction}},
                        `${f.direction === 'in' ? '← from' : '→ to'} `, eventButton(f, `(${f.kind})`)));
      }
      panel.replaceChildren(
        el('h2', {id: 'xp-event-name', text: e.name}),
        onSim ? el('p', {class: 'xp-dim', id: 'xp-event-sim', text: 'simulated span of this event (the fields are the measured event\'s)'}) : '',
        el('p', {}, el('button', {type: 'button', class: 'xp-link', id: 'xp-focus', text: 'zoom to it (F)',
                                  onclick: () => focusSelected()})),
        dl,
        el('h3', {text: 'args'}), Object.keys(a).length ? args : el('p', {class: 'xp-dim', text: '(none)'}),
        el('h3', {text: 'ancestry'}), (e.ancestry || []).length ? anc : el('p', {class: 'xp-dim', text: '(none)'}),
        el('h3', {text: 'flows'}), (e.flows || []).length ? flows : el('p', {class: 'xp-dim', text: '(none)'}));
      panel.dataset.event = String(e.id);
    }

    function focusSelected() {
      const e = S.selected;
      if (!e || e.ts === undefined) return;
      const dur = Math.max(e.dur || 0, MIN_SPAN);
      setView(e.ts - dur * 0.1, e.ts + dur * 1.1);
      reveal(e);
    }

    // -------------------------------------------------------------- highlights
    async function highlightIds(ids) {
      ids = ids.slice(0, 200);
      S.highlight = new Map(ids.map(id => [id, null]));
      const got = await Promise.all(ids.map(id => api(X.storeApi(`view/event/${id}`), null, ctx.abort.signal)
        .catch(e => (e.name === 'AbortError' ? Promise.reject(e) : null))));
      const evs = got.filter(Boolean);
      for (const e of evs) S.highlight.set(e.id, e);
      if (!evs.length) return;
      let a = Infinity, b = -Infinity;
      for (const e of evs) { a = Math.min(a, e.ts); b = Math.max(b, e.ts + (e.dur || 0)); }
      const pad = Math.max(MIN_SPAN, b - a) * 0.05;
      setView(a - pad, b + pad);
      const r = S.rowOf.get(evs[0].track);
      if (r) { S.scrollY = r.y - plotH() / 3; clampScroll(); }
      panel.replaceChildren(el('h2', {text: `${evs.length} highlighted event${evs.length > 1 ? 's' : ''}`}),
        el('ul', {class: 'xp-flows', id: 'xp-highlights'}, evs.map(e => el('li', {data: {id: e.id}}, eventButton(e, fmtNs(e.dur || 0))))));
      draw();
      schedule();
    }

    // ----------------------------------------------------------------- overlays
    async function loadOverlays() {
      if (S.overlays || !(S.cp || S.findings)) { draw(); return; }
      status.textContent = 'computing the overlays…';
      try {
        S.overlays = await api(X.storeApi('view/overlays'), null, ctx.abort.signal);
      } catch (e) {
        if (e.name !== 'AbortError') {
          S.overlayError = e.message;
          status.textContent = `overlays: ${e.message}`;
        }
        return;
      }
      if (S.findings) showFindings();
      draw();
    }

    function showFindings() {
      const o = S.overlays;
      if (!o || !o.findings) return;
      const list = el('ol', {class: 'xp-findings-list', id: 'xp-viewer-findings'});
      for (const f of o.findings) {
        const b = el('button', {type: 'button', class: 'xp-link', text: f.title});
        b.addEventListener('click', () => highlightIds(f.ids || []));
        list.append(el('li', {}, b, el('div', {class: 'xp-dim', text: f.recommendation || ''})));
      }
      if (!S.selected) panel.replaceChildren(el('h2', {text: 'findings'}), list);
    }

    // --------------------------------------------------------------------- hash
    let hashTimer = null;
    function saveHash() {
      clearTimeout(hashTimer);
      hashTimer = setTimeout(() => {
        const p = new URLSearchParams();
        p.set('ts0', String(Math.round(S.view.ts0)));
        p.set('ts1', String(Math.round(S.view.ts1)));
        if (S.selected && S.selected.id !== undefined) p.set('sel', String(S.selected.id));
        if (S.highlight.size) p.set('ids', [...S.highlight.keys()].join(','));
        if (S.cp) p.set('cp', '1');
        if (S.findings) p.set('fd', '1');
        if (!S.flows) p.set('flows', '0');
        if (S.sim) p.set('sim', '1');
        if (S.whatif) p.set('whatif', S.whatif);
        history.replaceState(null, '', `#/viewer?${p}`);
      }, 250);
    }

    // ------------------------------------------------------------------- input
    let drag = null;
    canvas.addEventListener('mousedown', e => {
      canvas.focus();
      const r = canvas.getBoundingClientRect();
      const x = e.clientX - r.left, y = e.clientY - r.top;
      if (x < GUTTER && y >= plotTop()) {
        const row = rowAt(y);
        if (row && row.kind === 'group') {
          if (S.collapsed.has(row.group)) S.collapsed.delete(row.group); else S.collapsed.add(row.group);
          layout(); draw(); schedule();
        }
        return;
      }
      drag = {x, y, ts0: S.view.ts0, ts1: S.view.ts1, scrollY: S.scrollY, moved: false};
    });
    window.addEventListener('mousemove', onMove);
    window.addEventListener('mouseup', onUp);
    function onMove(e) {
      const r = canvas.getBoundingClientRect();
      const x = e.clientX - r.left, y = e.clientY - r.top;
      S.mouse = {x, y};
      if (drag) {
        const dx = x - drag.x, dy = y - drag.y;
        if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
        if (drag.moved) {
          const s = drag.ts1 - drag.ts0;
          const shift = -dx * s / plotW();
          S.scrollY = drag.scrollY - dy;
          clampScroll();
          setView(drag.ts0 + shift, drag.ts1 + shift);
        }
        return;
      }
      if (x < 0 || y < 0 || x > S.w || y > S.h) { tip.hidden = true; return; }
      const h = hit(x, y);
      if (!h) { tip.hidden = true; return; }
      tip.textContent = h.kind === 'event' ? `${h.name} · ${h.dur === null ? 'instant' : fmtNs(h.dur)}`
        : `${h.count} events, ${(h.busy * 100).toFixed(0)}% busy (mostly ${h.name}) · click to zoom`;
      tip.style.left = `${Math.min(x + 12, S.w - 240)}px`;
      tip.style.top = `${y + 14}px`;
      tip.hidden = false;
    }
    function onUp(e) {
      if (!drag) return;
      const d = drag;
      drag = null;
      if (d.moved) return;
      const h = hit(d.x, d.y);
      if (!h) return;
      if (h.kind === 'event') selectId(h.id, false, h.track);
      else setView(h.ts - h.dur * 0.5, h.ts + h.dur * 1.5);
    }
    canvas.addEventListener('wheel', e => {
      e.preventDefault();
      const r = canvas.getBoundingClientRect();
      const x = e.clientX - r.left;
      const unit = e.deltaMode === 1 ? 16 : e.deltaMode === 2 ? S.h : 1;
      const dy = e.deltaY * unit, dx = e.deltaX * unit;
      if (x < GUTTER || e.shiftKey) scrollBy(dy || dx);
      else if (Math.abs(dx) > Math.abs(dy)) panBy(dx * nsPerPx());
      else zoomAt(Math.exp(dy * 0.0015), x);
    }, {passive: false});
    canvas.addEventListener('keydown', e => {
      if (e.ctrlKey || e.metaKey || e.altKey) return;
      const px = S.mouse && S.mouse.x > GUTTER && S.mouse.x < S.w ? S.mouse.x : GUTTER + plotW() / 2;
      const k = e.key.toLowerCase();
      if (k === 'w' || k === '+' || k === '=') zoomAt(0.8, px);
      else if (k === 's' || k === '-') zoomAt(1.25, px);
      else if (k === 'a') panBy(-0.15 * span());
      else if (k === 'd') panBy(0.15 * span());
      else if (k === 'arrowleft') panBy(-0.05 * span());
      else if (k === 'arrowright') panBy(0.05 * span());
      else if (k === 'arrowup') scrollBy(-3 * LANE);
      else if (k === 'arrowdown') scrollBy(3 * LANE);
      else if (k === 'f') focusSelected();
      else if (k === '0') fitAll();
      else if (k === 'escape') { S.selected = null; panel.replaceChildren(); draw(); saveHash(); }
      else return;
      e.preventDefault();
    });
    toolbar.querySelector('#xp-zoom-in').addEventListener('click', () => zoomAt(0.5, GUTTER + plotW() / 2));
    toolbar.querySelector('#xp-zoom-out').addEventListener('click', () => zoomAt(2, GUTTER + plotW() / 2));
    toolbar.querySelector('#xp-zoom-fit').addEventListener('click', fitAll);
    cpBox.addEventListener('change', () => { S.cp = cpBox.checked; layout(); loadOverlays(); saveHash(); });
    fdBox.addEventListener('change', () => { S.findings = fdBox.checked; loadOverlays(); saveHash(); if (S.findings) showFindings(); });
    flowBox.addEventListener('change', () => { S.flows = flowBox.checked; draw(); saveHash(); });
    simBox.addEventListener('change', () => setSim(simBox.checked));

    function simError(message) {
      panel.replaceChildren(el('p', {class: 'xp-error', id: 'xp-sim-error', text: `no simulated tracks: ${message}`}));
    }

    /** Show or hide the simulated tracks: the tracks are asked again (with or without them),
     * the window kept. */
    async function setSim(on) {
      S.sim = !!on;
      simBox.checked = S.sim;
      saveHash();
      try {
        await loadTracks();
      } catch (e) {
        if (e.name === 'AbortError') return;
        S.errors++;
        simError(e.message);
        S.sim = false;
        simBox.checked = false;
        return;
      }
      if (S.selected && S.selected.id !== undefined) selectId(S.selected.id, false);
      draw();
      schedule();
    }

    let searchTimer = null;
    let searchCtrl = null;
    search.addEventListener('input', () => {
      clearTimeout(searchTimer);
      searchTimer = setTimeout(runSearch, 200);
    });
    search.addEventListener('keydown', e => {
      if (e.key === 'Escape') { results.hidden = true; }
      if (e.key === 'Enter') { clearTimeout(searchTimer); runSearch(); }
    });
    async function runSearch() {
      const q = search.value.trim();
      if (searchCtrl) searchCtrl.abort();
      if (!q) { results.hidden = true; return; }
      searchCtrl = new AbortController();
      let r;
      try {
        r = await api(X.storeApi('view/search'), {q, limit: 100}, searchCtrl.signal);
      } catch (e) {
        if (e.name === 'AbortError') return;
        results.replaceChildren(el('li', {class: 'xp-error', text: e.message}));
        results.hidden = false;
        return;
      }
      results.replaceChildren(el('li', {class: 'xp-dim', text: `${r.total.toLocaleString()} match${r.total === 1 ? '' : 'es'}${r.total > r.matches.length ? `, first ${r.matches.length}` : ''}`}));
      for (const m of r.matches) {
        const b = el('button', {type: 'button', class: 'xp-link', data: {id: m.id}, text: m.name});
        b.append(el('span', {class: 'xp-dim', text: ` ${m.level} · at ${fmtNs(m.ts)} · ${m.dur === null ? 'instant' : fmtNs(m.dur)}`}));
        b.addEventListener('click', () => { results.hidden = true; selectId(m.id, true); });
        results.append(el('li', {}, b));
      }
      results.hidden = false;
    }

    const observer = new ResizeObserver(() => { if (resize()) { layout(); draw(); schedule(); } });

    // --------------------------------------------------------------------- start
    /** The tracks (with the simulated ones when S.sim), grouped, laid out. */
    async function loadTracks() {
      S.pending++;
      let doc;
      try {
        doc = await api(X.storeApi('view/tracks'), simParams(), ctx.abort.signal);
      } finally {
        S.pending--;
      }
      S.tracks = doc;
      S.byId = new Map();
      const groups = new Map();
      for (const t of doc.tracks) {
        S.byId.set(t.track, t);
        if (!groups.has(t.group)) groups.set(t.group, {label: t.group, tracks: []});
        groups.get(t.group).tracks.push(t);
      }
      S.groups = [...groups.values()];
      S.data = null;
      layout();
    }

    async function start() {
      resize();
      try {
        await loadTracks();
      } catch (e) {
        if (!S.sim || e.name === 'AbortError') throw e;
        S.sim = false;  // the replay failed: show the measured tracks and say why
        simBox.checked = false;
        await loadTracks();
        simError(e.message);
        S.errors++;
      }
      observer.observe(stage);
      const ts0 = Number(params.get('ts0')), ts1 = Number(params.get('ts1'));
      const ids = (params.get('ids') || '').split(',').map(Number).filter(Number.isInteger).filter(x => x > 0 || x === 0);
      const sel = params.get('sel');
      if (params.get('ts0') !== null && Number.isFinite(ts0) && Number.isFinite(ts1) && ts1 > ts0) setView(ts0, ts1);
      else fitAll();
      if (ids.length && params.get('ids')) await highlightIds(ids);
      if (sel !== null && sel !== '' && Number.isInteger(Number(sel))) await selectId(Number(sel), params.get('ts0') === null);
      loadOverlays();
      schedule();
      canvas.focus();
      main.dataset.ready = '1';
    }

    const stop = () => {
      observer.disconnect();
      window.removeEventListener('mousemove', onMove);
      window.removeEventListener('mouseup', onUp);
      if (S.ctrl) S.ctrl.abort();
      clearTimeout(S.timer);
      clearTimeout(hashTimer);
      if (window.xpuprofViewer === pub) delete window.xpuprofViewer;
    };
    ctx.destroy = stop;  // also when the page is left before start() is done
    return start().then(() => stop);
  };
})();
