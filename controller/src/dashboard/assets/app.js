// tb's dashboard. The token lives in sessionStorage (this tab only) and goes out only as an
// Authorization header to /ui/api/. One change stream tells which kinds changed; only the
// views showing them are fetched again. Everything is built with textContent (no HTML from
// data), so object names cannot inject markup.
'use strict';

const TOKEN = 'tb.token';
const SVG = 'http://www.w3.org/2000/svg';
const $ = (id) => document.getElementById(id);
// Which views show which kinds.
const VIEWS_OF = {
  Node: ['lab'], Link: ['lab'], Allocation: ['lab', 'jobs'],
  TrainingJob: ['jobs', 'queues'], InferenceService: ['jobs', 'queues'],
  Queue: ['queues', 'jobs'], Event: ['events'], Model: ['models'],
};
const ALL_VIEWS = ['lab', 'jobs', 'queues', 'models', 'events'];

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function token() { return sessionStorage.getItem(TOKEN); }

async function call(path, options = {}) {
  const headers = { Authorization: 'Bearer ' + token() };
  const r = await fetch('/ui/api/' + path, { ...options, headers, cache: 'no-store' });
  if (r.status === 401) {
    const body = await r.json().catch(() => ({}));
    signOut('Signed out: ' + (body.error || 'the token was not accepted'));
    throw new ApiError(401, body.error || 'unauthorized');
  }
  if (!r.ok) {
    const body = await r.json().catch(() => ({}));
    throw new ApiError(r.status, body.error || r.statusText);
  }
  return r;
}

async function getJson(path) { return (await call(path)).json(); }

// Reads a Server-Sent Events response (fetch, so the token can go in a header).
async function readEvents(response, onEvent) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = 'message';
      let data = '';
      for (const line of block.split('\n')) {
        if (line.startsWith('event:')) name = line.slice(6).trim();
        else if (line.startsWith('data:')) data += line.slice(5).trimStart();
      }
      if (data) onEvent(name, JSON.parse(data));
    }
  }
}

// --- small builders -------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : String(c ?? ''));
  return e;
}

function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function fill(section, rows, empty) {
  const body = $(section).querySelector('tbody');
  const cols = $(section).querySelectorAll('th').length;
  body.replaceChildren(...(rows.length ? rows : [el('tr', {}, el('td', { colspan: cols, class: 'empty' }, empty))]));
}

function gib(bytes) { return typeof bytes === 'number' ? (bytes / 2 ** 30).toFixed(1) + ' GiB' : '-'; }
function num(v, digits = 1) { return typeof v === 'number' ? v.toFixed(digits) : '-'; }
// What the placement predicts for one stream at the context the observed streams held.
function observedTitle(p) {
  if (typeof p.predictedAtObservedTokensPerSecond !== 'number') return {};
  return { title: `${num(p.predictedAtObservedTokensPerSecond)} predicted at the ${p.observedContextTokens} tokens of context observed` };
}
function age(ts) {
  if (!ts) return '-';
  const s = Math.max(0, (Date.now() - Date.parse(ts)) / 1000);
  if (s < 120) return Math.round(s) + 's';
  if (s < 7200) return Math.round(s / 60) + 'm';
  if (s < 172800) return Math.round(s / 3600) + 'h';
  return Math.round(s / 86400) + 'd';
}
function ready(node) {
  const c = (node.status?.conditions || []).find((c) => c.type === 'Ready');
  return c?.status === 'True';
}
function say(message) { const n = $('notice'); n.textContent = message; n.hidden = !message; }

// --- views ----------------------------------------------------------------------------------

const render = {
  async lab() {
    const { nodes, links } = await getJson('lab');
    const picture = $('lab-picture');
    const width = 800;
    const height = nodes.length > 2 ? 420 : 260;
    picture.setAttribute('viewBox', `0 0 ${width} ${height}`);
    const at = new Map();
    const r = Math.min(width, height) / 2 - 60;
    nodes.forEach((n, i) => {
      const a = (2 * Math.PI * i) / Math.max(1, nodes.length) - Math.PI / 2;
      const x = nodes.length === 1 ? width / 2 : width / 2 + (nodes.length === 2 ? 1.6 : 1.4) * r * Math.cos(a);
      const y = nodes.length === 1 ? height / 2 : height / 2 + r * Math.sin(a);
      at.set(n.metadata.name, { x, y });
    });
    const parts = [];
    const pairs = new Map();
    for (const l of links) {
      const a = at.get(l.spec?.a?.node);
      const b = at.get(l.spec?.b?.node);
      if (!a || !b) continue;
      const pair = [l.spec.a.node, l.spec.b.node].sort().join('|');
      const k = pairs.get(pair) || 0;
      pairs.set(pair, k + 1);
      const off = k * 14;
      const s = l.status || {};
      const measured = typeof s.bandwidthGbps === 'number';
      const cls = 'cable' + (l.spec.rdma ? ' rdma' : '') + (measured ? '' : ' unmeasured');
      parts.push(svg('line', { class: cls, x1: a.x, y1: a.y + off, x2: b.x, y2: b.y + off }));
      const label = measured
        ? `${num(s.bandwidthGbps)} Gb/s · ${num(s.latencyUsP50, 0)} µs${l.spec.rdma ? ' · RDMA' : ''}`
        : `${num(l.spec.nominalGbps)} Gb/s nominal${l.spec.rdma ? ' · RDMA' : ''}`;
      parts.push(svg('text', { class: 'cable', x: (a.x + b.x) / 2, y: (a.y + b.y) / 2 + off - 4, 'text-anchor': 'middle' }, label));
    }
    for (const n of nodes) {
      const { x, y } = at.get(n.metadata.name);
      const st = n.status || {};
      const cap = st.capacity || {};
      const total = cap.allocatableBytes || cap.memoryBytes || 0;
      const used = st.allocatedBytes || 0;
      const g = svg('g', { class: 'mac' + (ready(n) ? '' : ' notready'), 'data-node': n.metadata.name });
      g.append(svg('rect', { class: 'box', x: x - 80, y: y - 38, width: 160, height: 76, rx: 8 }));
      g.append(svg('text', { x: x - 70, y: y - 20 }, n.metadata.name + (ready(n) ? '' : ' (not ready)')));
      g.append(svg('text', { class: 'sub', x: x - 70, y: y - 5 }, cap.chip || cap.hardwareModel || ''));
      g.append(svg('rect', { class: 'bar', x: x - 70, y: y + 4, width: 140, height: 8 }));
      const w = total ? Math.min(140, (140 * used) / total) : 0;
      g.append(svg('rect', { class: 'used', x: x - 70, y: y + 4, width: w, height: 8 }));
      g.append(svg('text', { class: 'sub', x: x - 70, y: y + 28 }, `${gib(used)} of ${gib(total)}`));
      parts.push(g);
    }
    if (!nodes.length) parts.push(svg('text', { x: 20, y: 30 }, 'No Macs have joined yet.'));
    picture.replaceChildren(...parts);
  },

  async jobs() {
    const { jobs } = await getJson('jobs');
    const services = [];
    const rows = [];
    for (const j of jobs) {
      const s = j.status || {};
      const id = `${j.metadata.namespace}/${j.metadata.name}`;
      const phase = s.phase || 'Pending';
      const actions = el('td', {}, logButton(j), deleteButton(j));
      if (j.kind === 'InferenceService') {
        const p = s.modelPlacement || {};
        const layers = (p.stages || []).map((st) => `${st.node} ${st.firstLayer}–${st.firstLayer + st.layers - 1}`).join(' · ');
        services.push(el('tr', { 'data-job': id, 'data-phase': phase },
          el('td', {}, id), el('td', { class: phase }, phase), el('td', {}, layers || '-'),
          el('td', {}, num(p.predictedTokensPerSecond)), el('td', observedTitle(p), num(p.observedTokensPerSecond)),
          el('td', {}, staging(s.staging)), el('td', {}, s.url || '-'), actions));
        continue;
      }
      const why = phase === 'Pending' || phase === 'Failed' ? [s.reason, s.message].filter(Boolean).join(': ') : '';
      rows.push(el('tr', { 'data-job': id, 'data-phase': phase },
        el('td', {}, id), el('td', { class: 'phase ' + phase }, phase), el('td', {}, s.queue || '-'),
        el('td', {}, s.position ?? '-'), el('td', { class: 'why' }, why), el('td', {}, (s.nodes || []).join(', ') || '-'),
        el('td', {}, s.restarts ?? 0), el('td', {}, age(j.metadata.creationTimestamp)), actions));
    }
    fill('jobs', rows, 'No training jobs.');
    fill('services', services, 'No inference services.');
  },

  async queues() {
    const { queues } = await getJson('queues');
    fill('queues', queues.map((q) => el('tr', {},
      el('td', {}, q.queue.metadata.name), el('td', {}, q.queue.spec?.weight ?? 1),
      el('td', {}, q.pending), el('td', {}, q.running))), 'No queues.');
  },

  async models() {
    const { models } = await getJson('models');
    fill('models', models.map((m) => el('tr', {},
      el('td', {}, `${m.metadata.namespace}/${m.metadata.name}`), el('td', {}, m.spec?.format || '-'),
      el('td', {}, m.spec?.totalBytes || '-'), el('td', {}, (m.heldBy || []).join(', ') || '-'))), 'No models.');
  },

  async events() {
    const { events } = await getJson('events');
    fill('events', events.slice(0, 50).map((e) => {
      const s = e.spec || {};
      const o = s.involvedObject || {};
      return el('tr', {}, el('td', {}, age(s.lastTimestamp || s.firstTimestamp)), el('td', {}, s.type || ''),
        el('td', {}, `${o.kind || ''} ${o.namespace ? o.namespace + '/' : ''}${o.name || ''}`),
        el('td', {}, s.reason || ''), el('td', {}, (s.count > 1 ? `(×${s.count}) ` : '') + (s.message || '')));
    }), 'No events.');
  },
};

function staging(s) {
  if (!s) return '-';
  const p = el('progress', { max: s.stageBytes, value: s.stagedBytes });
  return el('span', {}, p, ` ${Math.floor((100 * s.stagedBytes) / s.stageBytes)}%`);
}

function deleteButton(job) {
  const b = el('button', { type: 'button', class: 'danger', 'data-action': 'delete' }, 'Delete');
  let armed = null;
  b.addEventListener('click', async () => {
    if (!armed) {
      b.textContent = 'Confirm delete';
      armed = setTimeout(() => { armed = null; b.textContent = 'Delete'; }, 4000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    b.textContent = 'Delete';
    const { kind, metadata: m } = job;
    try {
      await call(`jobs/${kind}/${encodeURIComponent(m.namespace)}/${encodeURIComponent(m.name)}`, { method: 'DELETE' });
      say('');
    } catch (e) {
      say(`Refused (${e.status}): ${e.message}`);
    }
  });
  return b;
}

// --- logs -----------------------------------------------------------------------------------

const MAX_LOG_LINES = 1000;
let following = null;

function logButton(job) {
  const b = el('button', { type: 'button', 'data-action': 'logs' }, 'Logs');
  b.addEventListener('click', () => followLogs(job));
  return b;
}

async function followLogs(job) {
  if (following) following.abort();
  const control = new AbortController();
  following = control;
  const { kind, metadata: m } = job;
  $('logs-of').textContent = `of ${m.namespace}/${m.name}`;
  const pre = $('log-lines');
  pre.textContent = '';
  const losses = [];
  const add = (text) => {
    pre.append(text + '\n');
    while (pre.childNodes.length > MAX_LOG_LINES) pre.firstChild.remove();
    pre.scrollTop = pre.scrollHeight;
  };
  drawLoss(losses);
  try {
    const r = await call(`logs/${kind}/${encodeURIComponent(m.namespace)}/${encodeURIComponent(m.name)}?tail=200`, { signal: control.signal });
    await readEvents(r, (name, data) => {
      if (name === 'failed') add(`-- ${data.error}`);
      else if (name === 'end') add(`-- ${data.why}`);
      if (name !== 'line') return;
      add(`[rank ${data.rank}] ${data.line}`);
      const loss = data.rank === 0 && LOSS.exec(data.line);
      if (loss) {
        losses.push(Number(loss[1]));
        if (losses.length > MAX_LOSS_POINTS) losses.splice(0, losses.length - MAX_LOSS_POINTS);
        drawLoss(losses);
      }
    });
  } catch (e) {
    if (e.name !== 'AbortError') add(`-- ${e.message}`);
  }
}

// Training loss, as rank 0 logs it: a number after the word "loss" ("loss 2.31", "Train loss
// 2.310", "loss=2.31"), the form MLX's and most trainers' logs take.
const LOSS = /\bloss\b\s*[:=]?\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)/i;
const MAX_LOSS_POINTS = 2000;

function drawLoss(losses) {
  const curve = $('loss-curve');
  // An <svg> has no `hidden` property: the attribute it is.
  curve.toggleAttribute('hidden', losses.length < 2);
  if (losses.length < 2) return;
  const [w, h, pad] = [600, 140, 28];
  const lo = Math.min(...losses);
  const hi = Math.max(...losses);
  const span = hi - lo || 1;
  const points = losses.map((v, i) =>
    `${(pad + ((w - 2 * pad) * i) / (losses.length - 1)).toFixed(1)},${(h - pad - ((h - 2 * pad) * (v - lo)) / span).toFixed(1)}`);
  curve.replaceChildren(
    svg('polyline', { class: 'loss', points: points.join(' ') }),
    svg('text', { x: 4, y: pad - 6 }, `loss ${hi.toPrecision(4)}`),
    svg('text', { x: 4, y: h - 8 }, `${lo.toPrecision(4)}`),
    svg('text', { x: w - 4, y: pad - 6, 'text-anchor': 'end' }, `last ${losses[losses.length - 1].toPrecision(4)} · ${losses.length} points`),
  );
}

// --- updates --------------------------------------------------------------------------------

const busy = new Map(); // view → 'running' | 'again'

async function refresh(view) {
  if (busy.has(view)) { busy.set(view, 'again'); return; }
  busy.set(view, 'running');
  try {
    do {
      busy.set(view, 'running');
      try { await render[view](); } catch (e) { if (e.status !== 401) say(`${view}: ${e.message}`); }
    } while (busy.get(view) === 'again');
  } finally { busy.delete(view); }
}

let stream = null;

async function watchChanges() {
  let delay = 1000;
  while (token()) {
    stream = new AbortController();
    try {
      const r = await call('changes', { signal: stream.signal });
      $('live').textContent = 'live';
      $('live').className = 'live on';
      delay = 1000;
      await readEvents(r, (name, data) => {
        if (name === 'ready') ALL_VIEWS.forEach(refresh);
        if (name === 'signed-out') signOut('Signed out: the token is no longer valid');
        if (name !== 'changed') return;
        const views = new Set(data.resync ? ALL_VIEWS : data.kinds.flatMap((k) => VIEWS_OF[k] || []));
        views.forEach(refresh);
      });
    } catch (e) {
      if (e.name === 'AbortError' || e.status === 401) return;
    }
    $('live').textContent = 'reconnecting';
    $('live').className = 'live off';
    await new Promise((ok) => setTimeout(ok, delay));
    delay = Math.min(30000, delay * 2);
  }
}

// --- signing in -----------------------------------------------------------------------------

async function start() {
  let me;
  try { me = await getJson('whoami'); } catch (e) { if (e.status !== 401) say(e.message); return; }
  $('who').textContent = `${me.user} (${me.role}${me.namespaces?.length ? ': ' + me.namespaces.join(', ') : ''})`;
  $('signin').hidden = true;
  $('main').hidden = false;
  $('signout').hidden = false;
  watchChanges();
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN);
  if (stream) stream.abort();
  if (following) following.abort();
  $('main').hidden = true;
  $('signout').hidden = true;
  $('signin').hidden = false;
  $('who').textContent = '';
  $('live').textContent = 'offline';
  $('live').className = 'live off';
  say(message || '');
}

document.addEventListener('DOMContentLoaded', () => {
  $('signin').addEventListener('submit', (e) => {
    e.preventDefault();
    const t = $('token').value.trim();
    $('token').value = '';
    if (!t) return;
    sessionStorage.setItem(TOKEN, t);
    say('');
    start();
  });
  $('signout').addEventListener('click', () => signOut(''));
  if (token()) start(); else $('signin').hidden = false;
});
