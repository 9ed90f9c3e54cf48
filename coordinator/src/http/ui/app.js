// The Tessera dashboard: one module, no build step. Every figure it shows
// comes from the coordinator's HTTP API (/v1/…), read with the session
// cookie that signing in gives; every request that changes something
// carries the session's CSRF token. Pages are hash routes:
//   #/farm            workers, queue, burn rate
//   #/jobs?state=&name=&page=   the jobs, filtered and paged
//   #/jobs/ID         one job: frames filling in, the tile mosaic, actions
//   #/workers/ID      one worker: its tasks, telemetry, blocklists, drain, revoke
// Live: the farm's event stream (/v1/events, Server-Sent Events) redraws
// the page shown; a job or worker page also re-reads every few seconds.

const session = { role: null, csrf: null };
const PAGE = 50;
// GPU utilisation readings per worker, for the sparklines (newest last).
const history = new Map();
// Failed attempts' logs the user opened, kept open across redraws.
const openLogs = new Map();
// Priorities typed and not yet set, by job.
const priorityTyped = new Map();
const HISTORY = 60;

// ---- DOM -------------------------------------------------------------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'on') for (const [ev, f] of Object.entries(v)) el.addEventListener(ev, f);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const $ = (id) => document.getElementById(id);
// Images shown, by address: a redraw moves the same element into the new
// page, so a thumbnail is fetched once, not at every redraw.
const images = new Map();
function image(src, attrs) {
  let img = images.get(src);
  if (!img) {
    img = h('img', { ...attrs, src });
    images.set(src, img);
    if (images.size > 2000) images.delete(images.keys().next().value);
  }
  return img;
}

function toast(text, bad, ms) {
  const t = $('toast');
  t.textContent = text;
  t.className = bad ? 'toast bad' : 'toast';
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, ms || (bad ? 8000 : 3000));
}

// ---- formatting ------------------------------------------------------
const usd = (v) => {
  if (v === null || v === undefined) return '—';
  const n = Number(v);
  // Small amounts keep two significant digits: $0.00023, not $0.000.
  if (n > 0 && n < 0.01) return '$' + n.toPrecision(2);
  return '$' + n.toFixed(n < 10 ? 3 : 2);
};
function secs(s) {
  if (s === null || s === undefined) return '—';
  s = Math.round(s);
  if (s < 60) return s + ' s';
  if (s < 3600) return Math.floor(s / 60) + ' min ' + (s % 60) + ' s';
  return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min';
}
const when = (ms) => ms ? new Date(ms).toLocaleString() : '—';
const bytes = (b) => {
  if (!b) return '0 B';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return b.toFixed(i ? 1 : 0) + ' ' + u[i];
};
function jobState(j) {
  if (j.paused && (j.state === 'queued' || j.state === 'running')) return 'paused';
  if (j.waiting_for && j.waiting_for.length && j.state === 'queued') return 'waiting';
  return j.state;
}
const badge = (s) => h('span', { class: 'state ' + s }, s);
function progress(done, total) {
  const pct = total ? Math.floor(100 * done / total) : 0;
  const fill = h('span');
  fill.style.width = pct + '%';
  return h('span', {}, h('span', { class: 'bar', title: pct + '%' }, fill), ' ', `${done}/${total}`);
}
function spark(values) {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('class', 'spark');
  svg.setAttribute('width', '90');
  svg.setAttribute('height', '20');
  svg.setAttribute('viewBox', '0 0 90 20');
  const line = document.createElementNS(ns, 'polyline');
  const n = Math.max(values.length - 1, 1);
  line.setAttribute('points', values.map((v, i) => `${(i * 90 / n).toFixed(1)},${(19 - v * 18 / 100).toFixed(1)}`).join(' '));
  svg.append(line);
  return svg;
}

// ---- the API ---------------------------------------------------------
class Refused extends Error {
  constructor(status, message) { super(message); this.status = status; }
}
async function api(path, method = 'GET', body) {
  return (await apiWithHeaders(path, method, body)).value;
}
async function apiWithHeaders(path, method = 'GET', body) {
  const headers = { Accept: 'application/json' };
  if (method !== 'GET') headers['X-Tessera-CSRF'] = session.csrf || '';
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(path, {
    method, headers, credentials: 'same-origin',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  let value = null;
  try { value = text ? JSON.parse(text) : null; } catch { value = text; }
  if (r.status === 401 && !path.startsWith('/ui/')) {
    signedOut('Your session ended: signed out elsewhere, expired, the coordinator restarted, or the tickets were rotated. Sign in again.');
  }
  if (!r.ok) throw new Refused(r.status, (value && value.error) || `${r.status} ${r.statusText}`);
  return { value, headers: r.headers };
}
async function act(path, what, body) {
  try {
    await api(path, 'POST', body);
    toast(what);
    refresh();
  } catch (e) {
    toast(`${what} refused: ${e.message}`, true);
  }
}
const canAct = () => session.role === 'client';
// A destructive action asks for a second click within 15 s.
let armed = null;
const isArmed = (key) => armed !== null && armed.key === key && Date.now() < armed.until;
function confirmThen(key, what, run) {
  if (isArmed(key)) {
    armed = null;
    run();
    return;
  }
  armed = { key, until: Date.now() + 15000 };
  toast(`Click again within 15 s to ${what}.`, false, 15000);
  refresh();
  setTimeout(refresh, 15100);
}

// ---- sign-in ---------------------------------------------------------
function signedOut(reason) {
  const was = session.role !== null;
  session.role = session.csrf = null;
  $('signin-error').textContent = was && typeof reason === 'string' ? reason : '';
  stopEvents();
  $('bar').hidden = true;
  $('view').replaceChildren();
  $('signin').hidden = false;
  $('secret').focus();
  document.body.dataset.ready = 'signin';
}
function signedIn(s) {
  session.role = s.role;
  session.csrf = s.csrf;
  $('signin').hidden = true;
  $('bar').hidden = false;
  $('role').textContent = s.role === 'client' ? 'client (can act)' : 'viewer (read-only)';
  document.body.dataset.ready = 'app';
  startEvents();
  show();
}
async function signIn(ev) {
  ev.preventDefault();
  $('signin-error').textContent = '';
  try {
    signedIn(await api('/ui/signin', 'POST', { secret: $('secret').value }));
    $('secret').value = '';
  } catch (e) {
    $('signin-error').textContent = e.message;
  }
}
async function signOut() {
  try { await api('/ui/signout', 'POST'); } catch { /* already ended */ }
  signedOut();
}

// ---- live updates ----------------------------------------------------
let events = null;
let timer = null;
function startEvents() {
  stopEvents();
  events = new EventSource('/v1/events');
  events.onopen = () => $('live').classList.add('on');
  events.onerror = () => $('live').classList.remove('on');
  events.onmessage = (m) => {
    let e = null;
    try { e = JSON.parse(m.data); } catch { return; }
    window.tesseraLastEvent = e;
    if (current.job !== undefined && e.job !== undefined && e.job !== current.job) return;
    refresh();
  };
}
function stopEvents() {
  if (events) events.close();
  events = null;
  $('live').classList.remove('on');
}
// One redraw at a time, soon after the last reason for one.
let pending = null;
let drawing = false;
function refresh() {
  clearTimeout(pending);
  pending = setTimeout(async () => {
    if (drawing) { refresh(); return; }
    drawing = true;
    try { await draw(); } finally { drawing = false; }
  }, 150);
}

// ---- routing ---------------------------------------------------------
let current = {};
function parseHash() {
  const [path, query] = (location.hash.slice(1) || '/farm').split('?');
  const params = new URLSearchParams(query || '');
  const parts = path.split('/').filter(Boolean);
  if (parts[0] === 'jobs' && parts[1]) return { page: 'job', job: Number(parts[1]) };
  if (parts[0] === 'jobs') return { page: 'jobs', params };
  if (parts[0] === 'workers' && parts[1]) return { page: 'worker', worker: Number(parts[1]) };
  return { page: 'farm' };
}
function show() {
  current = parseHash();
  for (const [id, page] of [['nav-farm', 'farm'], ['nav-jobs', 'jobs']]) {
    $(id).classList.toggle('current', current.page === page || (page === 'jobs' && current.page === 'job'));
  }
  clearInterval(timer);
  // Events redraw at once; a timer as well, for what no event tells
  // (telemetry, a stitched frame) and for the moments the stream is down.
  timer = setInterval(refresh, { job: 2000, worker: 2000 }[current.page] || 5000);
  $('view').replaceChildren(h('p', { class: 'dim' }, 'Loading…'));
  draw();
}
async function draw() {
  if (!session.role) return;
  // A field being edited is not replaced under the user: the redraw
  // waits until it loses focus (or is set).
  const editing = document.activeElement && document.activeElement.id === 'priority';
  if (editing) { refresh(); return; }
  const shown = current;
  let view;
  try {
    view = await ({ farm: farmPage, jobs: jobsPage, job: jobPage, worker: workerPage })[shown.page](shown);
  } catch (e) {
    if (e instanceof Refused && e.status === 401) return;
    view = h('p', { class: 'error' }, e.message);
  }
  if (shown !== current || !session.role) return;
  $('view').replaceChildren(view);
  document.body.dataset.drawn = String(Date.now());
  if (!window.tesseraFirstPaint) window.tesseraFirstPaint = performance.now();
}

// ---- the farm --------------------------------------------------------
function remember(workers) {
  for (const w of workers) {
    const gpu = w.telemetry && w.telemetry.gpus && w.telemetry.gpus[0];
    if (!gpu) continue;
    const list = history.get(w.id) || [];
    list.push(gpu.utilization_pct);
    if (list.length > HISTORY) list.shift();
    history.set(w.id, list);
  }
}
function gpuCells(w) {
  const gpu = w.telemetry && w.telemetry.gpus && w.telemetry.gpus[0];
  if (!gpu) {
    const note = (w.telemetry && w.telemetry.gpu_note) || 'no GPU telemetry';
    return [h('td', { class: 'dim', title: note }, w.telemetry ? (w.telemetry.host.cpu_model || 'CPU') : '—'), h('td', { class: 'dim' }, '—'), h('td', { class: 'dim' }, '—')];
  }
  return [
    h('td', {}, gpu.name + (w.telemetry.gpus.length > 1 ? ` ×${w.telemetry.gpus.length}` : '')),
    h('td', { class: 'num' }, spark(history.get(w.id) || []), ` ${gpu.utilization_pct}%`),
    h('td', { class: 'num' }, `${bytes(gpu.memory_used_bytes)} / ${bytes(gpu.memory_total_bytes)}`),
  ];
}
function doing(w) {
  if (!w.tasks || !w.tasks.length) return '—';
  return w.tasks.map((t) => {
    const p = t.progress ? ` ${Math.floor(100 * t.progress[0] / Math.max(t.progress[1], 1))}%` : '';
    return h('a', { href: `#/jobs/${t.job}` }, `job ${t.job} frame ${t.frame}${p}`);
  }).flatMap((a, i) => i ? [', ', a] : [a]);
}
async function farmPage() {
  // Counts from the lists' X-Total-Count: one page each, never every job.
  const [workers, active, running, fleet] = await Promise.all([
    api('/v1/workers'),
    apiWithHeaders('/v1/jobs?state=active&limit=20'),
    apiWithHeaders('/v1/jobs?state=running&limit=1'),
    // The rented nodes, when a `tessera fleet run` reports here (404: none).
    api('/v1/fleet').catch((e) => { if (e instanceof Refused && e.status === 404) return null; throw e; }),
  ]);
  remember(workers);
  const burn = workers.reduce((s, w) => s + w.price_per_hour, 0);
  const idle = workers.filter((w) => w.state === 'idle').reduce((s, w) => s + w.price_per_hour, 0);
  const jobs = active.value;
  const activeCount = Number(active.headers.get('X-Total-Count')) || 0;
  const runningCount = Number(running.headers.get('X-Total-Count')) || 0;
  const card = (value, label, id) => h('div', { class: 'card', id }, h('div', { class: 'value' }, value), h('div', { class: 'label' }, label));
  const rows = workers.map((w) => h('tr', { dataset: { worker: w.id } },
    h('td', {}, h('a', { href: `#/workers/${w.id}` }, w.name)),
    h('td', {}, badge(w.state)),
    h('td', { class: 'num' }, `${w.running}/${w.slots}`),
    ...gpuCells(w),
    h('td', { class: 'num' }, usd(w.price_per_hour) + '/h'),
    h('td', {}, doing(w))));
  const queue = jobs.slice(0, 20).map((j) => h('tr', { dataset: { job: j.id } },
    h('td', {}, h('a', { href: `#/jobs/${j.id}` }, `${j.id} ${j.name}`)),
    h('td', {}, badge(jobState(j))),
    h('td', {}, progress(j.frames_done, j.frames_total)),
    h('td', { class: 'num' }, secs(j.eta_secs))));
  const report = fleet && fleet.report;
  const fleetPart = report ? [
    h('h2', {}, `Fleet: ${report.nodes.length} rented nodes, ${usd(report.billed_usd)} billed (${usd(report.attributed_to_jobs_usd)} to jobs, ${usd(report.farm_overhead_usd)} overhead)`,
      h('span', { class: 'dim' }, ` · reported ${secs((Date.now() - fleet.reported_unix_ms) / 1000)} ago`)),
    report.nodes.length ? h('table', { id: 'fleet' },
      h('tr', {}, ...['node', 'state', 'GPU', 'price', 'up', 'billed'].map((c) => h('th', {}, c))),
      ...report.nodes.map((n) => h('tr', { dataset: { node: n.name } },
        h('td', {}, n.name), h('td', {}, badge(n.state)), h('td', {}, n.gpu),
        h('td', { class: 'num' }, usd(n.usd_per_hour) + '/h'), h('td', { class: 'num' }, secs(n.secs)),
        h('td', { class: 'num' }, usd(n.usd))))) : h('p', { class: 'dim' }, 'The fleet rents no node now.'),
  ] : null;
  return h('div', {},
    h('h1', {}, 'Farm'),
    h('div', { class: 'cards' },
      card(String(workers.length), 'workers', 'card-workers'),
      card(usd(burn) + '/h', 'burn rate', 'card-burn'),
      card(usd(idle) + '/h', 'idle cost', 'card-idle'),
      card(`${runningCount} running · ${activeCount - runningCount} queued`, 'active jobs', 'card-queue')),
    h('h2', {}, 'Workers'),
    workers.length ? h('table', { id: 'workers' },
      h('tr', {}, ...['worker', 'state', 'slots', 'GPU', 'utilisation', 'VRAM', 'price', 'rendering'].map((c) => h('th', {}, c))),
      ...rows) : h('p', { class: 'dim' }, 'No worker is connected.'),
    fleetPart,
    h('h2', {}, activeCount > jobs.length ? `Queue (the newest ${jobs.length} of ${activeCount})` : 'Queue'),
    jobs.length ? h('table', { id: 'queue' }, ...queue) : h('p', { class: 'dim' }, 'Nothing to render.'));
}

// ---- the jobs --------------------------------------------------------
async function jobsPage(shown) {
  const p = shown.params;
  const state = p.get('state') || '';
  const name = p.get('name') || '';
  const since = p.get('since') || '';
  const page = Math.max(1, Number(p.get('page')) || 1);
  const q = new URLSearchParams();
  if (state) q.set('state', state);
  if (name) q.set('name', name);
  if (since) {
    const ms = Date.parse(since);
    if (!Number.isNaN(ms)) q.set('since', String(ms));
  }
  q.set('limit', String(PAGE));
  q.set('offset', String((page - 1) * PAGE));
  // One page, newest first; the count of all that match in a header.
  const answer = await apiWithHeaders('/v1/jobs?' + q);
  const shownJobs = answer.value;
  const total = Number(answer.headers.get('X-Total-Count')) || 0;
  const pages = Math.max(1, Math.ceil(total / PAGE));
  const go = (changes) => {
    const next = new URLSearchParams({ state, name, since, page: String(page), ...changes });
    for (const [k, v] of [...next]) if (!v) next.delete(k);
    location.hash = '#/jobs?' + next;
  };
  const stateSelect = h('select', { id: 'filter-state' },
    ...['', 'active', 'queued', 'running', 'done', 'failed', 'canceled', 'finished'].map((s) => h('option', { value: s, selected: s === state }, s || 'any state')));
  const nameInput = h('input', { id: 'filter-name', placeholder: 'name (glob: shot_*)', value: name });
  const sinceInput = h('input', { id: 'filter-since', type: 'date', value: since });
  const form = h('form', { class: 'filters', on: { submit: (e) => { e.preventDefault(); go({ state: stateSelect.value, name: nameInput.value, since: sinceInput.value, page: '1' }); } } },
    stateSelect, nameInput, h('label', { class: 'dim' }, 'since ', sinceInput), h('button', { type: 'submit' }, 'Filter'));
  const rows = shownJobs.map((j) => h('tr', { dataset: { job: j.id } },
    h('td', { class: 'num' }, h('a', { href: `#/jobs/${j.id}` }, j.id)),
    h('td', {}, h('a', { href: `#/jobs/${j.id}` }, j.name)),
    h('td', { class: 'job-state' }, badge(jobState(j))),
    h('td', {}, progress(j.frames_done, j.frames_total)),
    h('td', { class: 'num' }, secs(j.eta_secs)),
    h('td', { class: 'num' }, j.priority),
    h('td', { class: 'num' }, usd(j.cost_usd)),
    h('td', { class: 'num' }, usd(j.cost_to_finish_usd)),
    h('td', { class: 'num' }, j.budget_usd === null ? '—' : usd(j.budget_usd)),
    h('td', {}, j.deadline_unix_ms ? when(j.deadline_unix_ms) : '—'),
    h('td', {}, j.after.length ? j.after.map((a) => h('a', { href: `#/jobs/${a}` }, a)).flatMap((a, i) => i ? [', ', a] : [a]) : '—')));
  return h('div', {},
    h('h1', {}, 'Jobs'),
    form,
    shownJobs.length ? h('table', { id: 'jobs' },
      h('tr', {}, ...['id', 'name', 'state', 'frames', 'ETA', 'priority', 'cost', 'to finish', 'budget', 'deadline', 'after'].map((c) => h('th', {}, c))),
      ...rows) : h('p', { class: 'dim' }, 'No job matches.'),
    h('div', { class: 'pager' },
      h('button', { id: 'page-prev', disabled: page <= 1, on: { click: () => go({ page: String(page - 1) }) } }, '‹ newer'),
      h('span', { class: 'dim', id: 'page-of' }, `page ${page} of ${pages} · ${total} jobs`),
      h('button', { id: 'page-next', disabled: page >= pages, on: { click: () => go({ page: String(page + 1) }) } }, 'older ›')));
}

// ---- a job -----------------------------------------------------------
function mosaic(tiles, job, frame) {
  const width = Math.max(...tiles.map((t) => t.tile.x + t.tile.width));
  const height = Math.max(...tiles.map((t) => t.tile.y + t.tile.height));
  const box = h('div', { class: 'mosaic', id: 'mosaic' });
  box.style.aspectRatio = `${width} / ${height}`;
  for (const t of tiles) {
    const name = typeof t.state === 'string' ? t.state : Object.keys(t.state)[0];
    const samples = (typeof t.state === 'object' && t.state.rendering) ? t.state.rendering : null;
    const index = tiles.indexOf(t);
    // A rendered tile shows its pixels (its preview, at the frame
    // preview's scale); the others their state.
    const picture = name === 'done' ? image(`/v1/jobs/${job}/frames/${frame}/tiles/${index}/preview`, { alt: `tile ${index}`, class: 'tile-image' }) : null;
    const cell = h('div', { class: 'tile ' + name, title: `tile ${index}: ${name}`, dataset: { tile: index } }, picture || (samples ? `${Math.floor(100 * samples[0] / Math.max(samples[1], 1))}%` : ''));
    // A tile's y counts rows from the frame's top, as the stitched frame
    // (and the page) does: each engine turns it into its own convention.
    cell.style.left = (100 * t.tile.x / width) + '%';
    cell.style.top = (100 * t.tile.y / height) + '%';
    cell.style.width = (100 * t.tile.width / width) + '%';
    cell.style.height = (100 * t.tile.height / height) + '%';
    box.append(cell);
  }
  return box;
}
function frameList(detail) {
  const frames = [];
  for (const run of detail.frames) {
    for (let f = run.first, n = 0; n < run.count; f++, n++) frames.push({ frame: f, state: run.state });
  }
  return frames;
}
async function jobPage(shown) {
  const id = shown.job;
  const [detail, outputs] = await Promise.all([api(`/v1/jobs/${id}/detail`), api(`/v1/jobs/${id}/frames`)]);
  const j = detail.status;
  const stitched = new Map(outputs.map((o) => [o.frame, o]));
  const frames = frameList(detail);
  const rendering = frames.find((f) => f.state === 'rendering') || frames.find((f) => f.state === 'waiting');
  let tiles = null;
  if (rendering && !['done', 'failed', 'canceled'].includes(j.state)) {
    try { tiles = await api(`/v1/jobs/${id}/frames/${rendering.frame}/tiles`); } catch { tiles = null; }
  }
  const state = jobState(j);
  const button = (label, path, what, cls, enabled, confirm) => {
    const key = `job ${id} ${path}`;
    const run = () => act(`/v1/jobs/${id}/${path}`, what);
    return h('button', {
      id: 'act-' + label.toLowerCase(), class: cls, disabled: !canAct() || !enabled,
      title: canAct() ? null : 'the viewer ticket can only look',
      on: { click: () => (confirm ? confirmThen(key, `${path} job ${id}`, run) : run()) },
    }, confirm && isArmed(key) ? `Confirm ${path}?` : label);
  };
  const active = j.state === 'queued' || j.state === 'running';
  // The field keeps what the user typed across redraws until it is set.
  const typed = priorityTyped.get(id);
  const priorityInput = h('input', { id: 'priority', type: 'number', step: 1, min: -2147483648, max: 2147483647, value: typed ?? j.priority, class: 'narrow', disabled: !canAct() || !active,
    title: 'higher goes first; tasks already handed out finish where they are',
    on: { input: (e) => priorityTyped.set(id, e.target.value), blur: () => refresh() } });
  const setPriority = (e) => {
    e.preventDefault();
    const priority = Number(priorityInput.value);
    if (!Number.isInteger(priority)) { toast('A priority is a whole number.', true); return; }
    priorityTyped.delete(id);
    act(`/v1/jobs/${id}/priority`, `job ${id} has priority ${priority}`, { priority });
  };
  const actions = h('div', { class: 'actions' },
    button('Pause', 'pause', `job ${id} paused`, '', active && !j.paused),
    button('Resume', 'resume', `job ${id} resumed`, '', active && j.paused),
    button('Cancel', 'cancel', `job ${id} canceled`, 'danger', active, true),
    button('Retry', 'retry', `job ${id} retried`, '', j.state === 'failed'),
    h('form', { class: 'inline', on: { submit: setPriority } }, h('label', { class: 'dim', for: 'priority' }, 'priority '), priorityInput,
      h('button', { type: 'submit', id: 'act-priority', disabled: !canAct() || !active, title: canAct() ? null : 'the viewer ticket can only look' }, 'Set')),
    stitched.size ? h('a', { id: 'download-all', class: 'button', href: `/v1/jobs/${id}/frames.zip`, download: `job_${id}_frames.zip` }, `⤓ all ${stitched.size} frames (zip)`) : null,
    h('a', { href: '#/jobs', class: 'dim' }, '← all jobs'));
  const cards = frames.slice(0, 500).map((f) => {
    const out = stitched.get(f.frame);
    const picture = out
      ? image(`/v1/jobs/${id}/frames/${f.frame}/preview#${out.digest}`, { class: 'thumb', alt: `frame ${f.frame}`, loading: 'lazy' })
      : h('div', { class: 'thumb empty' }, f.state);
    return h('div', { class: 'frame', dataset: { frame: f.frame, state: out ? 'done' : f.state } },
      picture,
      h('div', { class: 'meta' }, h('span', {}, `frame ${f.frame}`),
        out ? h('a', { class: 'download', href: `/v1/jobs/${id}/frames/${f.frame}`, download: out.name || `frame_${String(f.frame).padStart(4, '0')}.${out.format === 'exr' ? 'exr' : 'png'}`, dataset: { frame: f.frame } }, '⤓ ' + bytes(out.size)) : badge(f.state)));
  });
  const attempts = detail.attempts.slice().reverse().map((a) => {
    const key = `${id}:${a.task}:${a.unix_ms}`;
    const log = h('pre', { class: 'log', hidden: !openLogs.has(key) }, openLogs.get(key) || '');
    const show = h('button', { on: { click: async () => {
      if (openLogs.has(key)) {
        openLogs.delete(key);
        log.hidden = true;
        return;
      }
      let text;
      try {
        const logs = await api(`/v1/jobs/${id}/logs?task=${a.task}`);
        const mine = logs.filter((l) => l.unix_ms === a.unix_ms);
        text = (mine.length ? mine : logs).map((l) => `${when(l.unix_ms)} worker ${l.worker}: ${l.error}\n${l.log || '(the renderer printed nothing)'}`).join('\n\n') || 'no log';
      } catch (e) { text = e.message; }
      openLogs.set(key, text);
      log.textContent = text;
      log.hidden = false;
    } } }, 'log');
    return h('tr', {}, h('td', {}, when(a.unix_ms)), h('td', { class: 'num' }, a.task), h('td', { class: 'num' }, a.frame ?? '—'),
      h('td', {}, a.worker_name || `worker ${a.worker}`), h('td', {}, a.error), h('td', {}, show, log));
  });
  const v = j.verification;
  const facts = [
    ['state', h('span', { id: 'job-state' }, badge(state))],
    ['frames', progress(j.frames_done, j.frames_total)],
    ['tasks', `${j.tasks_done}/${j.tasks_total} done, ${j.tasks_running} running`],
    ['ETA', secs(j.eta_secs)],
    ['cost', `${usd(j.cost_usd)} so far, ${usd(j.cost_to_finish_usd)} to finish`],
    ['priority', h('span', { id: 'job-priority' }, String(j.priority))],
    ['budget', j.budget_usd === null ? 'none' : usd(j.budget_usd)],
    ['deadline', j.deadline_unix_ms ? when(j.deadline_unix_ms) : 'none'],
    ['after', j.after.length ? `${j.after.join(', ')}${j.waiting_for.length ? ` (waiting for ${j.waiting_for.join(', ')})` : ''}` : 'nothing'],
    ['submitted', when(j.submitted_unix_ms)],
    ['uploaded', `${bytes(j.bytes_uploaded)} (${bytes(j.bytes_deduplicated)} already stored)`],
  ];
  if (v) facts.push(['verification', `${v.percent}%: ${v.agreed} agreed, ${v.mismatched} differed, ${v.pending} pending`]);
  if (j.blocked) facts.push(['blocked', h('span', { class: 'error' }, j.blocked)]);
  // What the submit's scan warned of, kept with the job.
  if (detail.warnings && detail.warnings.length) facts.push(['warnings', h('ul', { id: 'job-warnings', class: 'warnings' }, ...detail.warnings.map((w) => h('li', {}, w)))]);
  if (j.error) facts.push(['error', h('span', { class: 'error' }, j.error)]);
  return h('div', {},
    h('h1', {}, `Job ${id}: ${j.name}`),
    actions,
    h('dl', { class: 'kv' }, ...facts.flatMap(([k, val]) => [h('dt', {}, k), h('dd', {}, val)])),
    tiles && tiles.length > 1 ? [h('h2', {}, `Frame ${rendering.frame}, tile by tile`), mosaic(tiles, id, rendering.frame)] : null,
    h('h2', {}, `Frames (${stitched.size} of ${frames.length} stitched${frames.length > 500 ? '; the first 500 shown' : ''})`),
    h('div', { class: 'frames', id: 'frames' }, ...cards),
    detail.workers.length ? [h('h2', {}, 'Workers'), h('table', {},
      h('tr', {}, ...['worker', 'tasks done', 'render time', 'running'].map((c) => h('th', {}, c))),
      ...detail.workers.map((w) => h('tr', {}, h('td', {}, w.name), h('td', { class: 'num' }, w.tasks_done), h('td', { class: 'num' }, secs(w.render_ms / 1000)), h('td', { class: 'num' }, w.running))))] : null,
    attempts.length ? [h('h2', {}, `Failed attempts (${detail.attempts_total})`), h('table', { id: 'attempts' },
      h('tr', {}, ...['when', 'task', 'frame', 'worker', 'error', ''].map((c) => h('th', {}, c))), ...attempts)] : null);
}

// ---- a worker --------------------------------------------------------
function historySpark(points, pick, max) {
  const values = points.map(pick).filter((v) => v !== null && v !== undefined);
  if (!values.length) return h('span', { class: 'dim' }, '—');
  return spark(values.map((v) => 100 * v / Math.max(max, 1e-9)));
}
async function workerPage(shown) {
  let detail;
  try {
    detail = await api(`/v1/workers/${shown.worker}`);
  } catch (e) {
    if (e instanceof Refused && e.status === 404) return h('p', {}, `Worker ${shown.worker} is not connected. `, h('a', { href: '#/farm' }, '← farm'));
    throw e;
  }
  const w = detail.status;
  const t = w.telemetry;
  const gpus = (t && t.gpus) || [];
  const key = `drain ${w.id}`;
  const refuse = canAct() ? null : 'the viewer ticket can only look';
  const drain = h('button', {
    id: 'act-drain', class: 'danger', disabled: !canAct() || w.state === 'draining',
    title: refuse || 'finish its tasks, then leave the farm',
    on: { click: () => confirmThen(key, `drain ${w.name}`, () => act(`/v1/workers/${w.id}/drain`, `${w.name} drains: it finishes its tasks and leaves`)) },
  }, isArmed(key) ? 'Confirm drain?' : 'Drain');
  const revokeKey = `revoke ${w.id}`;
  const revoke = h('button', {
    id: 'act-revoke', class: 'danger', disabled: !canAct(),
    title: refuse || `disconnect it now and refuse every worker enrolled as ${w.name} from now on (its tasks go back to the queue)`,
    on: { click: () => confirmThen(revokeKey, `revoke ${w.name} for good`, () => act(`/v1/workers/${w.id}/revoke`, `${w.name} revoked: disconnected and refused from now on`)) },
  }, isArmed(revokeKey) ? 'Confirm revoke?' : 'Revoke');
  const points = detail.history;
  const memTotal = gpus.length ? gpus[0].memory_total_bytes : 0;
  const span = points.length > 1 ? secs((points[points.length - 1].unix_ms - points[0].unix_ms) / 1000) : null;
  return h('div', {},
    h('h1', {}, `Worker ${w.name}`),
    h('div', { class: 'actions' }, drain, revoke, h('a', { href: '#/farm', class: 'dim' }, '← farm')),
    h('dl', { class: 'kv' },
      h('dt', {}, 'state'), h('dd', { id: 'worker-state' }, badge(w.state)),
      h('dt', {}, 'host'), h('dd', {}, w.hostname),
      h('dt', {}, 'slots'), h('dd', {}, `${w.running} of ${w.slots} busy`),
      h('dt', {}, 'engines'), h('dd', {}, w.engines.map((e) => typeof e === 'string' ? e : JSON.stringify(e)).join(', ')),
      h('dt', {}, 'Blender'), h('dd', {}, (w.blenders || []).map((b) => `${b.name} (${b.render_device}${b.oidn ? ', OIDN' : ''})`).join(', ') || '—'),
      h('dt', {}, 'price'), h('dd', {}, usd(w.price_per_hour) + '/h' + (w.interruptible ? ' (interruptible)' : '')),
      h('dt', {}, 'tasks done'), h('dd', {}, w.tasks_done),
      h('dt', {}, 'connected'), h('dd', {}, secs(w.connected_secs)),
      h('dt', {}, 'host load'), h('dd', {}, t ? `${t.host.load_1m.toFixed(2)} on ${t.host.cores} cores, memory ${bytes(t.host.memory_used_bytes)} / ${bytes(t.host.memory_total_bytes)}` : '—'),
      h('dt', {}, 'GPU'), h('dd', {}, gpus.length ? '' : ((t && t.gpu_note) || 'no GPU telemetry')),
      h('dt', {}, 'quarantine'), h('dd', { id: 'worker-quarantine' }, detail.quarantined ? h('span', { class: 'error' }, `quarantined: ${detail.quarantined}`) : 'no'),
      h('dt', {}, 'blocklisted by'), h('dd', { id: 'worker-blocklists' }, detail.blocklisted_by.length
        ? detail.blocklisted_by.map((j) => h('a', { href: `#/jobs/${j}` }, `job ${j}`)).flatMap((a, i) => i ? [', ', a] : [a])
        : 'no job')),
    h('h2', {}, span ? `Telemetry, the last ${span}` : 'Telemetry'),
    h('table', { id: 'worker-history' },
      h('tr', {}, ...['reading', 'history', 'now'].map((c) => h('th', {}, c))),
      h('tr', {}, h('td', {}, 'GPU utilisation'), h('td', {}, historySpark(points, (p) => p.gpu_utilization_pct, 100)), h('td', { class: 'num' }, gpus.length ? `${gpus[0].utilization_pct}%` : '—')),
      h('tr', {}, h('td', {}, 'VRAM'), h('td', {}, historySpark(points, (p) => p.gpu_memory_used_bytes, memTotal)), h('td', { class: 'num' }, gpus.length ? `${bytes(gpus[0].memory_used_bytes)} / ${bytes(memTotal)}` : '—')),
      h('tr', {}, h('td', {}, 'host load'), h('td', {}, historySpark(points, (p) => p.load_1m, Math.max(...points.map((p) => p.load_1m), t ? t.host.cores : 1))), h('td', { class: 'num' }, t ? t.host.load_1m.toFixed(2) : '—'))),
    gpus.length ? h('table', {}, h('tr', {}, ...['GPU', 'utilisation', 'VRAM', 'temperature', 'power'].map((c) => h('th', {}, c))),
      ...gpus.map((g) => h('tr', {}, h('td', {}, g.name), h('td', { class: 'num' }, `${g.utilization_pct}%`),
        h('td', { class: 'num' }, `${bytes(g.memory_used_bytes)} / ${bytes(g.memory_total_bytes)}`), h('td', { class: 'num' }, `${g.temperature_c} °C`),
        h('td', { class: 'num' }, `${g.power_draw_w.toFixed(0)} / ${g.power_limit_w.toFixed(0)} W`)))) : null,
    h('h2', {}, 'Tasks'),
    w.tasks.length ? h('table', { id: 'worker-tasks' }, h('tr', {}, ...['job', 'task', 'frame', 'tile', 'progress', 'stage'].map((c) => h('th', {}, c))),
      ...w.tasks.map((k) => h('tr', {}, h('td', {}, h('a', { href: `#/jobs/${k.job}` }, k.job)), h('td', { class: 'num' }, k.index), h('td', { class: 'num' }, k.frame),
        h('td', {}, `${k.tile.width}×${k.tile.height} at ${k.tile.x},${k.tile.y}`),
        h('td', {}, k.progress ? progress(k.progress[0], k.progress[1]) : '—'), h('td', {}, k.stage || '—')))) : h('p', { class: 'dim' }, 'Idle.'));
}

// ---- start -----------------------------------------------------------
$('signin-form').addEventListener('submit', signIn);
$('signout').addEventListener('click', signOut);
window.addEventListener('hashchange', () => { if (session.role) show(); });
// A page left (or kept in the back/forward cache) lets its event stream
// go: a browser gives a host six connections, and streams held by pages
// no one sees would starve the one shown.
window.addEventListener('pagehide', stopEvents);
window.addEventListener('pageshow', (e) => { if (e.persisted && session.role) startEvents(); });
api('/ui/session').then(signedIn, signedOut);
