/* xpuprof web UI: the router, tables, charts and the pages of a store.
 *
 * Everything shown comes from the server's JSON (tools' answers, formatted tables, Plotly
 * figures); this script computes nothing. Every string from a trace goes into the page as
 * text (textContent, createTextNode, setAttribute): never innerHTML.
 */
'use strict';
(function () {
  const cfg = JSON.parse(document.body.dataset.config || '{}');
  const ROWS_SHOWN = 100;

  // ------------------------------------------------------------------------- helpers

  /** An element: el('td', {class: 'num', text: '1', data: {v: '1'}}, child, 'text', ...). */
  function el(tag, props, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = String(v);
      else if (k === 'data') for (const [dk, dv] of Object.entries(v)) e.dataset[dk] = String(dv);
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const kid of kids.flat()) {
      if (kid === undefined || kid === null || kid === false) continue;
      e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return e;
  }

  /** GET JSON from the API (a list value: the parameter repeated); an Error with the
   * server's message (and .status) otherwise. */
  async function api(path, params, signal) {
    const url = new URL(path, location.origin);
    for (const [k, v] of Object.entries(params || {})) {
      if (Array.isArray(v)) v.forEach(x => url.searchParams.append(k, String(x)));
      else if (v !== undefined && v !== null && v !== '') url.searchParams.set(k, String(v));
    }
    const r = await fetch(url, {signal, credentials: 'same-origin',
                                headers: {Accept: 'application/json'}});
    let body = null;
    try { body = await r.json(); } catch (e) { body = null; }
    if (!r.ok) {
      const err = new Error((body && body.error) || `HTTP ${r.status}`);
      err.status = r.status;
      throw err;
    }
    return body;
  }

  function fmtNs(ns) {
    const a = Math.abs(ns);
    if (a < 1e3) return `${+ns.toFixed(0)} ns`;
    if (a < 1e6) return `${+(ns / 1e3).toFixed(a < 1e4 ? 3 : 2)} µs`;
    if (a < 1e9) return `${+(ns / 1e6).toFixed(a < 1e7 ? 3 : 2)} ms`;
    return `${+(ns / 1e9).toFixed(3)} s`;
  }

  function storeApi(rest) { return cfg.api + rest; }

  // -------------------------------------------------------------------------- charts

  let plotlyLoading = null;
  function loadPlotly() {
    if (window.Plotly) return Promise.resolve(window.Plotly);
    if (!plotlyLoading) {
      plotlyLoading = new Promise((resolve, reject) => {
        const s = document.createElement('script');
        s.src = '/static/plotly.min.js';
        s.onload = () => resolve(window.Plotly);
        s.onerror = () => reject(new Error('could not load /static/plotly.min.js'));
        document.head.append(s);
      });
    }
    return plotlyLoading;
  }

  function renderFigures(figs, only) {
    const wanted = (figs || []).filter(f => !only || only.includes(f.id));
    const box = el('section', {class: 'xp-charts'});
    for (const f of wanted) {
      const div = el('div', {class: 'xp-chart', data: {figure: f.id}});
      box.append(div);
      loadPlotly().then(P => P.newPlot(div, f.data, f.layout,
                                       {displaylogo: false, responsive: true}))
        .then(() => { div.dataset.drawn = '1'; })
        .catch(e => div.replaceChildren(el('p', {class: 'xp-error', text: e.message})));
    }
    return box;
  }

  // -------------------------------------------------------------------------- tables

  const ID_COLUMNS = new Set(['event', 'events', 'id']);

  function viewerLink(ids) {
    const list = (Array.isArray(ids) ? ids : [ids]).filter(Number.isInteger);
    if (!list.length) return null;
    return el('a', {class: 'xp-show', href: `#/viewer?ids=${list.slice(0, 200).join(',')}`,
                    title: 'show in the trace viewer', text: '↗'});
  }

  function cell(tv, row, j, tag, across) {
    const col = tv.columns[j];
    const raw = tv.raw[row][j];
    const text = tv.text[row][j];
    const full = col.numeric ? null : fullText(raw);
    const td = el(tag || 'td', {class: col.numeric ? 'num' : !across && longColumns(tv).has(j) ? 'text long' : 'text',
                                title: full !== null && full !== text ? full : null,
                                data: {col: col.name, v: raw, row: row, table: tv.name}},
                  text);
    if (ID_COLUMNS.has(col.name)) {
      let ids = null;
      try { ids = JSON.parse(raw); } catch (e) { ids = null; }
      const link = ids !== null ? viewerLink(ids) : null;
      if (link) td.append(' ', link);
    }
    return td;
  }

  /** The text columns of a table with a value longer than LONG_TEXT characters (kernel
   * names): they get a wider minimum so that a name wraps over a few lines, not dozens. */
  const LONG_TEXT = 24;
  const longCache = new WeakMap();
  function longColumns(tv) {
    if (!longCache.has(tv)) {
      const out = new Set();
      tv.columns.forEach((c, j) => {
        if (!c.numeric && tv.text.some(r => String(r[j]).length > LONG_TEXT)) out.add(j);
      });
      longCache.set(tv, out);
    }
    return longCache.get(tv);
  }

  /** The whole text of a raw string value (a name the cell shows short), else null. */
  function fullText(raw) {
    if (typeof raw !== 'string' || raw[0] !== '"') return null;
    try { return JSON.parse(raw); } catch (e) { return null; }
  }

  function rawNumber(text) {
    if (text === 'null') return null;
    const n = Number(text);
    return Number.isNaN(n) ? null : n;
  }

  /** One table of a tool's answer: sortable by any column, filterable, its first rows. */
  function renderTable(tv, opts) {
    opts = opts || {};
    const wrap = el('section', {class: 'xp-table-wrap', data: {table: tv.name}});
    wrap.append(el('h3', {text: tv.title}));
    if (!tv.rows) {
      wrap.append(el('p', {class: 'xp-note', text: '(no rows)'}));
      return wrap;
    }
    if (tv.layout === 'paragraphs' && tv.paragraphs) {
      const ol = el('ol', {class: 'xp-paragraphs', data: {table: tv.name}});
      tv.paragraphs.forEach((lines, i) => {
        ol.append(el('li', {data: {row: i}}, el('strong', {text: lines[0]}),
                     lines.slice(1).map(l => el('div', {text: l}))));
      });
      wrap.append(ol);
      return wrap;
    }
    let shown = tv.columns.map((c, j) => j).filter(j => !tv.columns[j].blank);
    if (!shown.length) shown = tv.columns.map((c, j) => j);
    const blank = tv.columns.filter(c => c.blank).map(c => c.header);
    if (tv.layout === 'transpose' && tv.rows <= 8) {
      wrap.append(el('div', {class: 'xp-scroll'}, transposed(tv, shown)));
    } else {
      wrap.append(records(tv, shown, opts));
    }
    if (blank.length) {
      wrap.append(el('p', {class: 'xp-note', text: `(0 or empty in every row: ${blank.join(', ')})`}));
    }
    return wrap;
  }

  function transposed(tv, shown) {
    const key = tv.columns.findIndex(c => c.name === tv.label);
    const table = el('table', {class: 'xp-table xp-transposed', data: {table: tv.name}});
    const head = el('tr', {}, el('th'));
    for (let i = 0; i < tv.rows; i++) {
      head.append(el('th', {class: 'num', text: key >= 0 ? `${tv.label} ${tv.text[i][key]}` : 'value'}));
    }
    table.append(el('thead', {}, head));
    const body = el('tbody');
    for (const j of shown) {
      if (j === key) continue;
      const tr = el('tr', {}, el('th', {text: tv.columns[j].header}));
      for (let i = 0; i < tv.rows; i++) tr.append(cell(tv, i, j, 'td', true));
      body.append(tr);
    }
    table.append(body);
    return table;
  }

  function records(tv, shown, opts) {
    const box = el('div', {class: 'xp-records'});
    let order = [...Array(tv.rows).keys()];
    let limit = opts.limit || ROWS_SHOWN;
    let sortCol = -1;
    let sortDir = 1;
    let query = '';
    const filter = el('input', {type: 'search', class: 'xp-filter', placeholder: 'filter rows…',
                                'aria-label': `filter ${tv.title}`});
    const count = el('span', {class: 'xp-count'});
    const table = el('table', {class: 'xp-table', data: {table: tv.name}});
    const headRow = el('tr');
    for (const j of shown) {
      const col = tv.columns[j];
      const th = el('th', {class: col.numeric ? 'num' : null, data: {col: col.name},
                           title: 'sort', tabindex: 0, text: col.header});
      const sort = () => {
        sortDir = sortCol === j ? -sortDir : (col.numeric ? -1 : 1);
        sortCol = j;
        headRow.querySelectorAll('th').forEach(h => h.removeAttribute('aria-sort'));
        th.setAttribute('aria-sort', sortDir > 0 ? 'ascending' : 'descending');
        const key = i => (col.numeric ? rawNumber(tv.raw[i][j]) : tv.text[i][j]);
        order.sort((a, b) => {
          const x = key(a), y = key(b);
          if (x === y) return a - b;
          if (x === null) return 1;
          if (y === null) return -1;
          return (x < y ? -1 : 1) * sortDir;
        });
        draw();
      };
      th.addEventListener('click', sort);
      th.addEventListener('keydown', e => { if (e.key === 'Enter') sort(); });
      headRow.append(th);
    }
    table.append(el('thead', {}, headRow));
    const body = el('tbody');
    table.append(body);
    const more = el('button', {type: 'button', class: 'xp-more'});
    more.addEventListener('click', () => { limit = Infinity; draw(); });
    function draw() {
      const q = query.toLowerCase();
      const hit = i => shown.some(j => tv.text[i][j].toLowerCase().includes(q) ||
                                   (!tv.columns[j].numeric && (fullText(tv.raw[i][j]) || '').toLowerCase().includes(q)));
      const rows = q ? order.filter(hit) : order;
      const frag = document.createDocumentFragment();
      for (const i of rows.slice(0, limit)) {
        const tr = el('tr', {data: {row: i}});
        for (const j of shown) tr.append(cell(tv, i, j));
        frag.append(tr);
      }
      body.replaceChildren(frag);
      count.textContent = rows.length === tv.rows ? `${tv.rows.toLocaleString()} rows`
        : `${rows.length.toLocaleString()} of ${tv.rows.toLocaleString()} rows`;
      more.hidden = rows.length <= limit;
      more.textContent = `show all ${rows.length.toLocaleString()} rows`;
    }
    filter.addEventListener('input', () => { query = filter.value; draw(); });
    if (tv.rows > 5) box.append(el('div', {class: 'xp-table-tools'}, filter, count));
    box.append(el('div', {class: 'xp-scroll'}, table), more);
    draw();
    return box;
  }

  function viewTable(data, name) {
    return (data.view.tables || []).find(t => t.name === name);
  }

  function renderNotes(notes) {
    if (!notes || !notes.length) return null;
    return el('ul', {class: 'xp-notes'}, notes.map(n => el('li', {}, el('b', {text: 'note: '}), n)));
  }

  function renderHeadline(data) {
    const h = data.view && data.view.headline;
    return h ? el('p', {class: 'xp-headline', id: 'xp-headline', text: h}) : null;
  }

  /** A tool's whole answer: headline, charts, every table, notes. */
  function renderResult(data, skip) {
    skip = skip || [];
    const box = el('div', {class: 'xp-result'});
    box.append(renderHeadline(data) || '');
    if (data.figures && data.figures.length) box.append(renderFigures(data.figures));
    for (const tv of data.view.tables) if (!skip.includes(tv.name)) box.append(renderTable(tv));
    box.append(renderNotes(data.view.notes) || '');
    return box;
  }

  // ------------------------------------------------------------------------ the frame

  function hashParams() {
    const h = location.hash.replace(/^#\/?/, '');
    const q = h.indexOf('?');
    return {name: q < 0 ? h : h.slice(0, q), params: new URLSearchParams(q < 0 ? '' : h.slice(q + 1))};
  }

  function setHash(name, params) {
    const q = params.toString();
    location.hash = `#/${name}${q ? '?' + q : ''}`;
  }

  /** The title, help and the tool's option form of a page. */
  function pageHeader(ctx) {
    const {page, params} = ctx;
    const head = el('div', {class: 'xp-page-head'}, el('h1', {text: page.title}));
    if (page.help) head.append(el('p', {class: 'xp-help', text: page.help}));
    const controls = (page.controls || []).filter(c => !(c.name in (page.options || {})));
    if (!controls.length) return head;
    const form = el('form', {class: 'xp-controls'});
    for (const c of controls) {
      const value = params.get(c.name);
      let input;
      if (c.type === 'bool') {
        input = el('input', {type: 'checkbox', name: c.name,
                             checked: value === null ? !!c.default : value === 'true'});
      } else {
        input = el('input', {type: 'text', name: c.name, size: c.name === 'steps' ? 10 : 8,
                             value: value === null ? '' : value,
                             placeholder: c.default === null ? '' : String(c.default)});
      }
      form.append(el('label', {title: c.help}, `${c.name.replace(/_/g, ' ')} `, input));
    }
    form.append(el('button', {type: 'submit', text: 'apply'}));
    form.addEventListener('submit', e => {
      e.preventDefault();
      const p = new URLSearchParams();
      for (const c of controls) {
        const input = form.elements[c.name];
        if (c.type === 'bool') { if (input.checked !== !!c.default) p.set(c.name, String(input.checked)); }
        else if (input.value.trim()) p.set(c.name, input.value.trim());
      }
      setHash(page.name, p);
    });
    head.append(form);
    return head;
  }

  function toolParams(ctx) {
    const out = Object.assign({}, ctx.page.options || {});
    for (const c of ctx.page.controls || []) {
      const v = ctx.params.get(c.name);
      if (v !== null && v !== '') out[c.name] = v;
    }
    return out;
  }

  async function fetchTool(ctx, tool, extra) {
    // another tool than the page's (the hierarchy's kernels) takes the page's ranks only
    const own = toolParams(ctx);
    const base = tool === ctx.page.tool ? own : (own.ranks ? {ranks: own.ranks} : {});
    const params = Object.assign(base, extra || {});
    return api(storeApi(`tools/${encodeURIComponent(tool)}`), params, ctx.abort.signal);
  }

  function loading(ctx, text) {
    const p = el('p', {class: 'xp-loading', text: text || 'Computing…'});
    ctx.main.append(p);
    return p;
  }

  /** The page is drawn (charts may still be loading): tests and benchmarks wait for this. */
  function done(ctx) {
    ctx.main.dataset.readyMs = String(Math.round(performance.now()));
    ctx.main.dataset.ready = '1';
  }

  // -------------------------------------------------------------------------- pages

  async function toolPage(ctx) {
    ctx.main.append(pageHeader(ctx));
    const wait = loading(ctx);
    const data = await fetchTool(ctx, ctx.page.tool);
    wait.remove();
    ctx.main.append(renderResult(data));
    done(ctx);
  }

  function findingCard(tv, i) {
    const col = name => tv.columns.findIndex(c => c.name === name);
    const text = name => (col(name) >= 0 ? tv.text[i][col(name)] : '');
    const raw = name => (col(name) >= 0 ? tv.raw[i][col(name)] : 'null');
    const card = el('article', {class: 'xp-finding', data: {row: i}});
    card.append(el('h3', {data: {col: 'recommendation'}, text: text('recommendation')}));
    card.append(el('p', {class: 'xp-finding-what'}, el('b', {text: 'finding: '}),
                    el('span', {data: {col: 'finding'}, text: text('finding')})));
    card.append(el('p', {class: 'xp-evidence'}, el('b', {text: 'evidence: '}),
                    el('span', {data: {col: 'evidence'}, text: text('evidence')})));
    card.append(el('p', {class: 'xp-saving'},
                    el('span', {data: {col: 'saving'}, text: text('saving')}), ' ',
                    el('span', {class: 'xp-badge', data: {col: 'saved_ms_per_step',
                                                          v: raw('saved_ms_per_step')},
                                text: `${text('saved_ms_per_step')} ms/step`})));
    let ids = [];
    try { ids = JSON.parse(raw('events')) || []; } catch (e) { ids = []; }
    if (ids.length) {
      card.append(el('a', {class: 'xp-button xp-finding-link', data: {ids: ids.join(',')},
                           href: `#/viewer?ids=${ids.slice(0, 200).join(',')}`,
                           text: `show ${ids.length} event${ids.length > 1 ? 's' : ''} in the viewer`}));
    }
    return card;
  }

  async function overviewPage(ctx) {
    ctx.main.append(pageHeader(ctx));
    const wait = loading(ctx);
    const data = await fetchTool(ctx, 'overview');
    wait.remove();
    const box = el('div', {class: 'xp-result'});
    box.append(renderHeadline(data) || '');
    const recs = viewTable(data, 'recommendations');
    if (recs && recs.rows) {
      const list = el('section', {class: 'xp-findings', id: 'xp-findings'},
                      el('h2', {text: 'Findings and recommendations'}));
      for (let i = 0; i < recs.rows; i++) list.append(findingCard(recs, i));
      box.append(list);
    }
    for (const name of ['summary', 'steps']) {
      const tv = viewTable(data, name);
      if (tv) box.append(renderTable(tv));
    }
    box.append(renderFigures(data.figures, ['step-breakdown']));
    const tops = el('div', {class: 'xp-columns'});
    for (const [name, fig] of [['top_ops', 'top-ops'], ['top_kernels', 'top-kernels']]) {
      const tv = viewTable(data, name);
      if (tv) tops.append(el('div', {}, renderTable(tv), renderFigures(data.figures, [fig])));
    }
    box.append(tops);
    for (const tv of data.view.tables) {
      if (!['recommendations', 'summary', 'steps', 'top_ops', 'top_kernels'].includes(tv.name)) {
        box.append(renderTable(tv));
      }
    }
    box.append(renderNotes(data.view.notes) || '');
    ctx.main.append(box);
    done(ctx);
  }

  async function multirankPage(ctx) {
    ctx.main.append(pageHeader(ctx));
    const wait = loading(ctx);
    const data = await fetchTool(ctx, ctx.page.tool);
    wait.remove();
    const box = el('div', {class: 'xp-result'});
    if (data.figures.some(f => f.id === 'step-heatmap')) {
      box.append(renderFigures(data.figures, ['step-heatmap']));
    } else {
      box.append(el('p', {class: 'xp-note', text: 'One rank only: no heat map of step time per rank.'}));
    }
    for (const name of ['steps', 'summary']) {
      const tv = viewTable(data, name);
      if (tv) box.append(renderTable(tv));
    }
    box.append(renderNotes(data.view.notes) || '');
    ctx.main.append(box);
    done(ctx);
  }

  async function criticalPathPage(ctx) {
    ctx.main.append(pageHeader(ctx));
    ctx.main.append(el('p', {}, el('a', {class: 'xp-button', id: 'xp-cp-show', href: '#/viewer?cp=1',
                                         text: 'show the critical path in the viewer'})));
    const wait = loading(ctx);
    const data = await fetchTool(ctx, ctx.page.tool);
    wait.remove();
    ctx.main.append(renderResult(data));
    done(ctx);
  }

  /** The replay: simulated vs measured per step (chart and tables), edges per kind, what was
   * not modelled, the largest deviations; links open the viewer with the simulated tracks. */
  async function replayPage(ctx) {
    ctx.main.append(pageHeader(ctx));
    ctx.main.append(el('p', {}, el('a', {class: 'xp-button', id: 'xp-replay-show', href: '#/viewer?sim=1',
                                         text: 'show the simulated timeline in the viewer'})));
    const wait = loading(ctx, 'Replaying…');
    const data = await fetchTool(ctx, ctx.page.tool);
    wait.remove();
    const box = renderResult(data);
    // an event of the replay is best seen beside its simulated twin
    box.querySelectorAll('a.xp-show').forEach(a => { a.setAttribute('href', `${a.getAttribute('href')}&sim=1`); });
    // an empty table of the replay is good news: say so rather than "(no rows)"
    const EMPTY = {unmodelled: 'nothing: every replayed event was modelled',
                   deviations: 'none: every simulated start is its measured start'};
    for (const [name, text] of Object.entries(EMPTY)) {
      const note = box.querySelector(`section[data-table="${name}"] .xp-note`);
      if (note && note.textContent === '(no rows)') note.textContent = text;
    }
    ctx.main.append(box);
    done(ctx);
  }

  async function diffPage(ctx) {
    ctx.main.append(pageHeader(ctx));
    const others = cfg.stores.filter(s => s !== cfg.store);
    if (!others.length) {
      ctx.main.append(el('p', {class: 'xp-note', text: 'No other store in this directory to compare with.'}));
      done(ctx);
      return;
    }
    const other = ctx.params.get('with') || '';
    const asBaseline = ctx.params.get('this') !== 'new';
    const select = el('select', {name: 'with', id: 'xp-diff-with'},
                      el('option', {value: '', text: '(choose a store)'}),
                      others.map(s => el('option', {value: s, text: s, selected: s === other})));
    const role = el('select', {name: 'this', id: 'xp-diff-role'},
                    el('option', {value: 'baseline', text: 'this store is the baseline (a)',
                                  selected: asBaseline}),
                    el('option', {value: 'new', text: 'this store is the new trace (b)',
                                  selected: !asBaseline}));
    const form = el('form', {class: 'xp-controls'}, el('label', {}, 'compare with ', select), role,
                    el('button', {type: 'submit', text: 'compare'}));
    form.addEventListener('submit', e => {
      e.preventDefault();
      const p = new URLSearchParams(ctx.params);
      p.set('with', select.value);
      p.set('this', role.value);
      setHash(ctx.page.name, p);
    });
    ctx.main.append(form);
    if (!other) { done(ctx); return; }
    const wait = loading(ctx);
    const params = toolParams(ctx);
    params.a = asBaseline ? cfg.store : other;
    params.b = asBaseline ? other : cfg.store;
    const data = await api('/api/diff', params, ctx.abort.signal);
    wait.remove();
    ctx.main.append(el('p', {class: 'xp-note', text: `a (baseline): ${params.a} · b (new): ${params.b}`}));
    ctx.main.append(renderResult(data));
    done(ctx);
  }


  // ------------------------------------------------------------------------ the what-if

  /** Colours of the critical path's categories (``sim/paths.py``), fixed across pages. */
  const CP_CATEGORY_COLORS = {host: '#8c6bb1', launch: '#ff7f0e', 'device compute': '#1f77b4',
                              communication: '#2ca02c', waiting: '#d62728', 'late start': '#bcbd22'};
  const CP_OTHER_COLORS = ['#17becf', '#8c564b', '#e377c2', '#7f7f7f'];

  /** The critical path before and after the changes: a bar each (per rank, when there are
   * several), stacked by category, so the shift between kinds of work shows as the bars'
   * make-up; from the tool's ``critical_path`` table as it is (ns drawn in ms). Categories at
   * 0 before and after on every rank are left out (the subtitle names them). */
  function criticalPathFigure(tv) {
    const col = name => tv.columns.findIndex(c => c.name === name);
    const [r, c, b, p, d] = ['rank', 'category', 'baseline_ns', 'predicted_ns', 'shift_ns'].map(col);
    if (c < 0 || b < 0 || p < 0) return null;
    const val = (i, j) => (j < 0 ? null : JSON.parse(tv.raw[i][j]));
    const rows = [...Array(tv.rows).keys()];
    const categories = [...new Set(rows.map(i => val(i, c)))];
    const used = categories.filter(k => rows.some(i => val(i, c) === k && (val(i, b) || val(i, p))));
    if (!used.length) return null;
    const ranks = [...new Set(rows.map(i => val(i, r)))];
    const bars = ranks.flatMap(k => ['baseline', 'predicted'].map(w => (ranks.length > 1 ? `rank ${k} · ${w}` : w)));
    const data = used.map((cat, n) => {
      const x = [], shift = [];
      for (const k of ranks) {
        const i = rows.find(j => val(j, r) === k && val(j, c) === cat);
        const v = i === undefined ? [0, 0, 0] : [val(i, b), val(i, p), d < 0 ? 0 : val(i, d)];
        x.push(v[0] / 1e6, v[1] / 1e6);
        const sh = `shift ${v[2] > 0 ? '+' : ''}${fmtNs(v[2])}`;
        shift.push(sh, sh);
      }
      return {type: 'bar', orientation: 'h', name: cat, x, y: bars, customdata: shift,
              marker: {color: CP_CATEGORY_COLORS[cat] || CP_OTHER_COLORS[n % CP_OTHER_COLORS.length]},
              hovertemplate: `${cat}: %{x:.3f} ms<br>%{customdata}<extra>%{y}</extra>`};
    });
    const left = categories.filter(k => !used.includes(k));
    return {
      id: 'whatif-critical-path',
      data,
      layout: {
        title: {text: 'critical path by category, before and after' +
                (left.length ? `<br><sub>at 0 before and after: ${left.join(', ')}</sub>` : '')},
        barmode: 'stack', height: 170 + 34 * bars.length,
        xaxis: {title: {text: 'time on the critical path (ms)'}, rangemode: 'tozero'},
        yaxis: {automargin: true, autorange: 'reversed'}, showlegend: true, legend: {traceorder: 'normal'},
        margin: {t: 70, r: 20, b: 50, l: 20},
      },
    };
  }
  /** What the what-if page offers to try: the common changes that can select something in
   * this store, then the advisor's changes with their predicted gain (loaded after). */
  function whatifPicks(ctx, add) {
    const box = el('section', {class: 'xp-picks', id: 'xp-whatif-picks'});
    const common = el('div', {class: 'xp-pick-row', id: 'xp-whatif-common'},
                      el('span', {class: 'xp-dim', text: 'common changes: loading…'}));
    const advisor = el('div', {class: 'xp-pick-row', id: 'xp-whatif-advisor'});
    box.append(common, advisor);
    const pick = (change, title, extra, source) => el('button', {
      type: 'button', class: 'xp-pick', title, data: {change, source},
      onclick: () => add(change)}, change, extra ? el('span', {class: 'xp-pick-gain', text: extra}) : '');
    api(storeApi('whatif/picks'), null, ctx.abort.signal).then(doc => {
      common.replaceChildren(el('span', {class: 'xp-dim', text: 'common changes:'}),
                             ...doc.common.map(p => pick(p.change, p.help, null, 'common')));
      common.dataset.ready = '1';
    }).catch(e => {
      if (e.name !== 'AbortError') common.replaceChildren(el('span', {class: 'xp-error', text: e.message}));
    });
    return {box, loadAdvisor() {
      advisor.replaceChildren(el('span', {class: 'xp-dim', text: "the advisor's changes: replaying each recommendation…"}));
      const own = toolParams(ctx);
      const params = {predict: true};
      if (own.ranks) params.ranks = own.ranks;
      if (own.steps) params.steps = own.steps;
      return api(storeApi('tools/overview'), params, ctx.abort.signal).then(data => {
        const tv = viewTable(data, 'recommendations');
        const j = name => (tv ? tv.columns.findIndex(c => c.name === name) : -1);
        const val = (i, name) => (j(name) < 0 ? null : JSON.parse(tv.raw[i][j(name)]));
        const seen = new Set();
        const picks = [];
        for (let i = 0; tv && i < tv.rows; i++) {
          const change = val(i, 'change');
          if (!change || seen.has(change)) continue;
          seen.add(change);
          const gain = val(i, 'predicted_gain_pct');
          picks.push(pick(change, `${val(i, 'rule')}: ${val(i, 'recommendation')}`,
                          gain === null ? null : `${(-gain).toFixed(1)} %`, 'advisor'));
        }
        advisor.replaceChildren(el('span', {class: 'xp-dim', text: "the advisor's changes (predicted change of the step):"}),
                                ...(picks.length ? picks : [el('span', {class: 'xp-dim',
                                  text: 'none (no recommendation that a change expresses)'})]));
        advisor.dataset.ready = '1';
      }).catch(e => {
        if (e.name === 'AbortError') return;
        advisor.replaceChildren(el('span', {class: 'xp-error', text: `the advisor's changes: ${e.message}`}));
        advisor.dataset.ready = 'error';
      });
    }};
  }

  /** The what-if: changes to choose (a field each, added and removed; quick picks), then
   * the tool's answer — the headline, per rank and per step, the critical path's shift as a
   * chart and a table, the notes — and a link to the viewer with the changed timeline. */
  async function whatifPage(ctx) {
    const {page, params} = ctx;
    const changes = params.getAll('change').map(c => c.trim()).filter(Boolean);
    const head = el('div', {class: 'xp-page-head'}, el('h1', {text: page.title}));
    if (page.help) head.append(el('p', {class: 'xp-help', text: page.help}));
    const fields = el('div', {class: 'xp-changes', id: 'xp-whatif-changes'});
    const changeHelp = (page.controls.find(c => c.name === 'change') || {}).help || '';
    function field(value) {
      const input = el('input', {type: 'text', name: 'change', class: 'xp-change', size: 44,
                                 value: value || '', placeholder: 'e.g. host-gaps=0.5',
                                 title: changeHelp, 'aria-label': 'a change', autocomplete: 'off'});
      const row = el('div', {class: 'xp-change-row'}, input,
        el('button', {type: 'button', class: 'xp-remove', title: 'remove this change', text: '×',
                      onclick: () => { row.remove(); if (!fields.children.length) fields.append(field('')); }}));
      return row;
    }
    for (const c of changes.length ? changes : ['']) fields.append(field(c));
    const add = change => {
      const empty = [...fields.querySelectorAll('input.xp-change')].find(i => !i.value.trim());
      if (empty) empty.value = change; else fields.append(field(change));
    };
    const others = page.controls.filter(c => c.name !== 'change');
    const form = el('form', {class: 'xp-whatif-form', id: 'xp-whatif-form'},
      el('label', {class: 'xp-changes-label', text: 'changes (applied together)'}), fields,
      el('div', {class: 'xp-controls'},
        el('button', {type: 'button', id: 'xp-whatif-add', text: '+ add a change', onclick: () => {
          fields.append(field('')); fields.lastChild.querySelector('input').focus(); }}),
        others.map(c => el('label', {title: c.help}, `${c.name} `,
          el('input', {type: 'text', name: c.name, size: 8, value: params.get(c.name) || '',
                       placeholder: c.default === null ? '' : String(c.default)}))),
        el('button', {type: 'submit', class: 'xp-button', id: 'xp-whatif-run', text: 'predict'})));
    form.addEventListener('submit', e => {
      e.preventDefault();
      const p = new URLSearchParams();
      for (const i of form.querySelectorAll('input.xp-change')) if (i.value.trim()) p.append('change', i.value.trim());
      for (const c of others) { const v = form.elements[c.name].value.trim(); if (v) p.set(c.name, v); }
      if (p.toString() === params.toString()) route(); else setHash(page.name, p);
    });
    const picks = whatifPicks(ctx, add);
    head.append(form, picks.box);
    ctx.main.append(head);
    if (!changes.length) {
      ctx.main.append(el('p', {class: 'xp-note', id: 'xp-whatif-hint', text: 'Choose a change (type ' +
        'it, or pick one above) and press predict: the trace is replayed with it and compared ' +
        'with its replay as measured (docs/whatif.md).'}));
      picks.loadAdvisor();
      done(ctx);
      return;
    }
    const wait = loading(ctx, 'Replaying with the changes…');
    let data;
    try {
      data = await fetchTool(ctx, 'whatif', {change: changes});
    } catch (e) {
      wait.remove();
      if (e.name === 'AbortError' || e.status !== 400) throw e;
      // a change the tool cannot read or apply: its one line, the form kept to fix it
      ctx.main.append(el('p', {class: 'xp-error', id: 'xp-whatif-error', text: e.message}));
      picks.loadAdvisor();
      ctx.main.dataset.ready = 'error';
      return;
    }
    wait.remove();
    const box = el('div', {class: 'xp-result', id: 'xp-whatif-answer'});
    // without steps the tool has no step time to compare (its notes say why): the critical
    // path over each rank's span is the answer
    box.append(renderHeadline(data) || el('p', {class: 'xp-note', id: 'xp-whatif-nostep', text:
      'No step time to predict (see the notes): the critical path over each rank\'s span, ' +
      'before and after the changes, is below.'}));
    const key = changes.join('; ');
    box.append(el('p', {}, el('a', {class: 'xp-button', id: 'xp-whatif-show',
      href: `#/viewer?sim=1&whatif=${encodeURIComponent(key)}`,
      text: 'show the changed timeline in the viewer'}),
      el('span', {class: 'xp-dim', text: ' the whole store replayed with the changes, a track beside each measured one'})));
    const table = name => {
      const tv = viewTable(data, name);
      return tv && tv.rows ? renderTable(tv) : null;  // an empty table: the notes say why
    };
    box.append(table('summary') || '');
    const cp = viewTable(data, 'critical_path');
    const fig = cp && cp.rows ? criticalPathFigure(cp) : null;
    if (fig) box.append(renderFigures([fig]));
    box.append(table('critical_path') || '', table('steps') || '');
    box.append(renderNotes(data.view.notes) || '');
    ctx.main.append(box);
    done(ctx);
    picks.loadAdvisor();
  }

  // ------------------------------------------------------------------ the hierarchy

  const HIER_COLUMNS = ['calls', 'kernels', 'device_ns', 'device_exclusive_ns', 'device_pct',
                        'forward_ns', 'backward_ns'];

  async function hierarchyPage(ctx) {
    ctx.main.append(pageHeader(ctx));
    const by = ctx.params.get('by') || 'step';
    if (by !== 'step') {  // one level as a table
      const wait = loading(ctx);
      const data = await fetchTool(ctx, 'hierarchy', {by});
      wait.remove();
      ctx.main.append(renderResult(data));
      done(ctx);
      return;
    }
    const wait = loading(ctx);
    const steps = await fetchTool(ctx, 'hierarchy', {by: 'step'});
    wait.remove();
    const tv = viewTable(steps, 'step');
    ctx.main.append(el('p', {class: 'xp-help', text: 'Expand a step for its layers (or, without ' +
      'layers, its ops), a layer for the layers inside it, an op for its kernels. Inclusive: ' +
      'device time under the node; exclusive: not under a child of the same level.'}));
    if (!tv || !tv.rows) {
      ctx.main.append(renderNotes(steps.view.notes) || el('p', {text: 'no steps'}));
      done(ctx);
      return;
    }
    const table = el('table', {class: 'xp-table xp-tree', id: 'xp-tree'});
    const head = el('tr', {}, el('th', {text: 'node'}));
    for (const name of HIER_COLUMNS) {
      const j = tv.columns.findIndex(c => c.name === name);
      const label = name === 'device_ns' ? 'inclusive' : name === 'device_exclusive_ns'
        ? 'exclusive' : (j >= 0 ? tv.columns[j].header : name);
      const unit = j >= 0 && tv.columns[j].header.match(/\(([^)]+)\)$/);
      head.append(el('th', {class: 'num', data: {col: name},
                            text: unit && !label.includes('(') ? `${label} (${unit[1]})` : label}));
    }
    table.append(el('thead', {}, head));
    const body = el('tbody');
    table.append(body);
    for (let i = 0; i < tv.rows; i++) {
      const step = JSON.parse(tv.raw[i][tv.columns.findIndex(c => c.name === 'step')]);
      body.append(treeRow(ctx, tv, i, 'step', `step ${step}`, 0, {step}));
    }
    ctx.main.append(table, renderNotes(steps.view.notes) || '');
    done(ctx);
  }

  function treeRow(ctx, tv, i, level, label, depth, node) {
    const tr = el('tr', {class: 'xp-node', data: {level, depth, row: i, table: tv.name}});
    const toggle = el('button', {type: 'button', class: 'xp-toggle', 'aria-expanded': 'false',
                                 text: '▸', title: 'expand'});
    const name = el('td', {class: 'xp-node-name', style: `padding-left:${0.4 + depth * 1.2}em`},
                    node.leaf ? el('span', {class: 'xp-toggle-space'}) : toggle, ' ',
                    el('span', {class: `xp-level xp-level-${level}`, text: level}), ' ',
                    el('span', {class: 'xp-label', text: label}));
    tr.append(name);
    for (const c of HIER_COLUMNS) {
      const j = tv.columns.findIndex(x => x.name === c);
      if (j < 0) tr.append(el('td', {class: 'num'}));
      else tr.append(cell(tv, i, j));
    }
    let children = null;
    toggle.addEventListener('click', async () => {
      const open = toggle.getAttribute('aria-expanded') === 'true';
      if (open) {
        toggle.setAttribute('aria-expanded', 'false');
        toggle.textContent = '▸';
        (children || []).forEach(r => r.remove());
        children = null;
        return;
      }
      toggle.setAttribute('aria-expanded', 'true');
      toggle.textContent = '▾';
      toggle.disabled = true;
      try {
        children = await expand(ctx, level, node, depth + 1);
      } catch (e) {
        children = [el('tr', {}, el('td', {colspan: 8, class: 'xp-error', text: e.message}))];
      }
      toggle.disabled = false;
      let after = tr;
      for (const r of children) { after.after(r); after = r; }
      if (!children.length) {
        const none = el('tr', {class: 'xp-node-empty'}, el('td', {colspan: 8, class: 'xp-note',
          style: `padding-left:${1.6 + (depth + 1) * 1.2}em`, text: '(nothing below)'}));
        tr.after(none);
        children = [none];
      }
    });
    return tr;
  }

  function column(tv, i, name) {
    const j = tv.columns.findIndex(c => c.name === name);
    return j < 0 ? null : JSON.parse(tv.raw[i][j]);
  }

  async function expand(ctx, level, node, depth) {
    const rows = [];
    if (level === 'step' || level === 'layer') {
      let layers = node.layers;
      if (!layers) {
        const data = await fetchTool(ctx, 'hierarchy', {by: 'layer', steps: node.step});
        layers = viewTable(data, 'layer');
      }
      if (layers && layers.rows) {
        for (let i = 0; i < layers.rows; i++) {
          const name = column(layers, i, 'layer');
          const parent = column(layers, i, 'parent');
          const under = level === 'step' ? (parent === null || !hasLayer(layers, parent)) : parent === node.layer;
          if (!under || name === node.layer) continue;
          const leaf = !layersUnder(layers, name);
          rows.push(treeRow(ctx, layers, i, 'layer', name, depth,
                            {step: node.step, layer: name, layers, leaf}));
        }
        return rows;
      }
      if (level === 'layer') return rows;
      const data = await fetchTool(ctx, 'hierarchy', {by: 'op', steps: node.step});
      const ops = viewTable(data, 'op');
      for (let i = 0; ops && i < ops.rows; i++) {
        const name = column(ops, i, 'op');
        rows.push(treeRow(ctx, ops, i, 'op', name, depth, {step: node.step, op: name}));
      }
      return rows;
    }
    if (level === 'op') {
      const data = await fetchTool(ctx, 'stats', {kernels: true, by_op: true, steps: node.step});
      const kernels = viewTable(data, 'kernels');
      for (let i = 0; kernels && i < kernels.rows; i++) {
        if (column(kernels, i, 'op') !== node.op) continue;
        rows.push(kernelRow(kernels, i, depth));
      }
    }
    return rows;
  }

  function hasLayer(tv, name) {
    for (let i = 0; i < tv.rows; i++) if (column(tv, i, 'layer') === name) return true;
    return false;
  }

  function layersUnder(tv, name) {
    for (let i = 0; i < tv.rows; i++) if (column(tv, i, 'parent') === name) return true;
    return false;
  }

  function kernelRow(tv, i, depth) {
    const tr = el('tr', {class: 'xp-node', data: {level: 'kernel', depth, row: i, table: tv.name}});
    tr.append(el('td', {class: 'xp-node-name', style: `padding-left:${0.4 + depth * 1.2}em`},
                 el('span', {class: 'xp-toggle-space'}), ' ',
                 el('span', {class: 'xp-level xp-level-kernel', text: 'kernel'}), ' ',
                 el('span', {class: 'xp-label', text: column(tv, i, 'name')})));
    const map = {calls: 'count', device_ns: 'total_ns', device_pct: 'pct'};
    for (const c of HIER_COLUMNS) {
      const j = tv.columns.findIndex(x => x.name === (map[c] || '-'));
      tr.append(j < 0 ? el('td', {class: 'num'}) : cell(tv, i, j));
    }
    return tr;
  }

  // -------------------------------------------------------------------------- router

  const RENDERERS = {
    tool: toolPage,
    overview: overviewPage,
    multirank: multirankPage,
    critical_path: criticalPathPage,
    replay: replayPage,
    whatif: whatifPage,
    diff: diffPage,
    hierarchy: hierarchyPage,
    viewer: ctx => window.xpuprofViewerPage(ctx),
  };

  let current = null;

  function route() {
    const {name, params} = hashParams();
    const page = cfg.pages.find(p => p.name === name) || cfg.pages[0];
    if (current) {
      current.abort.abort();
      if (current.destroy) current.destroy();
    }
    const main = document.getElementById('xp-main');
    main.replaceChildren();
    delete main.dataset.ready;
    main.dataset.page = page.name;
    document.querySelectorAll('#xp-nav a').forEach(a => {
      if (a.dataset.page === page.name) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
    });
    document.title = `xpuprof: ${cfg.store} · ${page.title}`;
    const ctx = {page, params, main, abort: new AbortController(), destroy: null};
    current = ctx;
    const render = RENDERERS[page.renderer] || RENDERERS.tool;
    Promise.resolve().then(() => render(ctx)).then(destroy => {
      if (typeof destroy === 'function') ctx.destroy = destroy;
    }).catch(err => {
      if (err.name === 'AbortError' || ctx.abort.signal.aborted) return;
      main.querySelectorAll('.xp-loading').forEach(e => e.remove());
      main.append(el('p', {class: 'xp-error', id: 'xp-error', text: err.message}));
      main.dataset.ready = 'error';
    });
  }

  window.xpuprof = {cfg, el, api, fmtNs, storeApi, renderTable, renderFigures};
  if (cfg.pages) {
    window.addEventListener('hashchange', route);
    document.addEventListener('DOMContentLoaded', route);
  }
})();
