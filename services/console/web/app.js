// The console's page: the registry through /api/v1 (docs/console.md), with the caller's token
// (or, where the console asks for client certificates, the browser's certificate).
// Every name and value is put into the page as text (textContent), never as markup, so a model,
// tag or description holding HTML shows as the characters it is. No inline script (the console
// sends Content-Security-Policy: default-src 'self').
'use strict';

const TOKEN_KEY = 'ckpt-console-token';

function token() { return sessionStorage.getItem(TOKEN_KEY) || ''; }

// An element with text and children; `attributes` are set as attributes (never as HTML).
function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
  for (const child of children) {
    node.append(typeof child === 'string' || typeof child === 'number' ? String(child) : child);
  }
  return node;
}

// An SVG element, as el() makes HTML ones.
function svgEl(tag, attributes, ...children) {
  const node = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
  for (const child of children) node.append(child);
  return node;
}

function show(...nodes) {
  const main = document.getElementById('main');
  main.replaceChildren(...nodes);
}

function status(text) { document.getElementById('status').textContent = text; }

class ApiError extends Error {
  constructor(httpStatus, code, message) {
    super(message);
    this.httpStatus = httpStatus;
    this.code = code;
  }
}

// The request headers every call sends: the token when signed in with one.
function authHeaders(extra) {
  const headers = Object.assign({}, extra || {});
  if (token()) headers['Authorization'] = 'Bearer ' + token();
  return headers;
}

async function api(path) {
  const response = await fetch('/api/v1/' + path, { headers: authHeaders() });
  const body = await response.json();
  if (!response.ok) {
    const error = body.error || {};
    throw new ApiError(response.status, error.code || '', error.message || response.statusText);
  }
  return body;
}

// A change (promote, rollback): a JSON POST, which no page of another site can make this browser
// send (docs/console.md, CSRF).
async function post(path, body) {
  const response = await fetch('/api/v1/' + path, {
    method: 'POST',
    headers: authHeaders({ 'Content-Type': 'application/json' }),
    body: JSON.stringify(body),
  });
  const answer = await response.json();
  if (!response.ok) {
    const error = answer.error || {};
    throw new ApiError(response.status, error.code || '', error.message || response.statusText);
  }
  return answer;
}

// Who the store takes the caller to be (and, for `model`, whether it may move its aliases).
async function whoAmI(model) {
  try {
    return await api('me' + (model ? '?model=' + encodeURIComponent(model) : ''));
  } catch (error) {
    // A store that predates ckpt.v1.Identity cannot say: rights unknown, nothing offered (the API
    // still refuses what the store does not allow).
    if (error instanceof ApiError && error.httpStatus === 501) return null;
    throw error;
  }
}

function showIdentity(me) {
  let text = me ? me.identity + ' (' + me.role + ')' : '';
  // A store without identities admits every caller as "anonymous" (admin): say so plainly.
  if (me && me.identity === 'anonymous' && !token()) {
    text += ' \u2014 an open store: no token needed';
  }
  document.getElementById('who').textContent = text;
}

function signIn(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  document.getElementById('signout').hidden = true;
  showIdentity(null);
  status('');
  const input = el('input', { id: 'token', type: 'password', autocomplete: 'off',
                              placeholder: 'bearer token' });
  const form = el('form', { class: 'signin', id: 'signin' },
                  el('h2', {}, 'Sign in'),
                  el('p', {}, 'The token your checkpoint store knows you by. The console sends it ' +
                              'with each request and keeps it only in this tab.'),
                  input, el('button', { type: 'submit' }, 'Sign in'));
  if (message) form.append(el('p', { class: 'error', id: 'signin-error' }, message));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    route();
  });
  show(form);
  input.focus();
}

function failed(error) {
  if (error instanceof ApiError && error.httpStatus === 401) {
    signIn('The store did not accept that token: ' + error.message);
    return;
  }
  show(el('p', { class: 'error', id: 'error' }, error.message));
}

// A cell for a value that can be long (a run id, a description): cut to the column's width with
// an ellipsis, the whole value on hover (title) and in the text itself, so nothing is lost.
function clipped(kind, text) {
  return el('td', { class: kind + ' clipped', title: text }, text);
}

function micros(value) {
  const number = Number(value || 0);
  return number ? new Date(number / 1000).toISOString().replace('.000Z', 'Z') : '';
}

// A line plot of `metric` across `versions` (those that have it), as SVG built element by element.
function metricPlot(versions, metricsOf, metric) {
  const points = versions
      .filter((info) => metric in metricsOf(info))
      .map((info) => [Number(info.version), Number(metricsOf(info)[metric])]);
  const width = 560, height = 220, pad = 40;
  const svg = svgEl('svg', { id: 'plot', width, height, viewBox: `0 0 ${width} ${height}`,
                             role: 'img', 'aria-label': metric + ' across versions' });
  if (!points.length) return svg;
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  const [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  const x = (v) => pad + (x1 === x0 ? 0.5 : (v - x0) / (x1 - x0)) * (width - 2 * pad);
  const y = (v) => height - pad - (y1 === y0 ? 0.5 : (v - y0) / (y1 - y0)) * (height - 2 * pad);
  svg.append(
      svgEl('line', { x1: pad, y1: height - pad, x2: width - pad, y2: height - pad, class: 'axis' }),
      svgEl('line', { x1: pad, y1: pad, x2: pad, y2: height - pad, class: 'axis' }),
      svgEl('text', { x: pad, y: pad - 10, class: 'label' }, metric),
      svgEl('text', { x: 4, y: y(y1) + 4, class: 'label' }, y1.toPrecision(3)),
      svgEl('text', { x: 4, y: y(y0) + 4, class: 'label' }, y0.toPrecision(3)),
      svgEl('polyline', { class: 'series',
                          points: points.map(([v, m]) => `${x(v)},${y(m)}`).join(' ') }));
  for (const [v, m] of points) {
    svg.append(svgEl('circle', { cx: x(v), cy: y(m), r: 3, class: 'point' },
                     svgEl('title', {}, `@${v}: ${m}`)),
               svgEl('text', { x: x(v) - 4, y: height - pad + 16, class: 'label' }, String(v)));
  }
  return svg;
}

// A version's metrics as the registry judges them: annotations over commit-time metrics.
function versionMetrics(info) {
  return Object.assign({}, (info.metadata || {}).metrics || {},
                       (info.annotations || {}).metrics || {});
}

function mebibytes(bytes) {
  const number = Number(bytes || 0);
  return number ? (number / 1048576).toFixed(number < 1048576 ? 3 : 1) : '';
}

async function modelsPage(isCurrent = () => true) {
  const body = await api('models');
  const rows = (body.models || []).map((model) => el('tr', {},
      el('td', {}, el('a', { href: '#/models/' + encodeURIComponent(model.name) }, model.name)),
      el('td', { class: 'number' }, model.latest_version || '0'),
      el('td', { class: 'number' }, model.version_count || '0'),
      el('td', {}, ...Object.entries(model.aliases || {})
                       .map(([alias, version]) => el('span', { class: 'alias' },
                                                     alias + ' \u2192 ' + version)))));
  // A page the user has left (a later route began) must not draw over the current one.
  if (!isCurrent()) return;
  show(el('h2', {}, 'Models'),
       el('table', { id: 'models' },
          el('thead', {}, el('tr', {}, el('th', {}, 'model'), el('th', {}, 'latest'),
                             el('th', {}, 'versions'), el('th', {}, 'aliases'))),
          el('tbody', {}, ...rows)));
  status(rows.length + ' model(s)');
}

async function modelPage(model, isCurrent = () => true) {
  const name = encodeURIComponent(model);
  const [listing, history, me] = await Promise.all([api('models/' + name + '/versions'),
                                                    api('models/' + name + '/history'),
                                                    whoAmI(model)]);
  // Promote and rollback are offered to those the store would let move this model's aliases.
  const mayMove = me !== null && (me.allowed_methods || []).includes('SetAlias');
  const versions = listing.versions || [];
  const metricsOf = versionMetrics;
  const metricNames = [...new Set(versions.flatMap((info) => Object.keys(metricsOf(info))))].sort();
  const rows = versions.map((info) => {
    const metadata = info.metadata || {};
    const annotations = info.annotations || {};
    const metrics = metricsOf(info);
    const previous = versions[versions.indexOf(info) - 1];
    return el('tr', { 'data-version': info.version },
              el('td', { class: 'number' },
                 el('a', { href: '#/models/' + name + '/versions/' + info.version }, info.version)),
              el('td', {}, ...(info.aliases || []).map((a) => el('span', { class: 'alias' }, a))),
              el('td', {}, micros(metadata.created_unix_micros)),
              el('td', { class: 'number' }, metadata.global_step || ''),
              ...metricNames.map((metric) => el('td', { class: 'number' },
                  metric in metrics ? Number(metrics[metric]).toPrecision(4) : '')),
              el('td', { class: 'number' }, mebibytes(info.logical_bytes)),
              clipped('run', (metadata.lineage || {}).run_id || ''),
              el('td', {}, ...Object.entries(annotations.tags || {}).map(
                  ([key, value]) => el('span', { class: 'alias' }, value ? key + '=' + value : key))),
              clipped('description', annotations.description || metadata.description || ''),
              el('td', {}, previous ? el('a', {
                class: 'compare',
                href: '#/models/' + name + '/compare/' + previous.version + '/' + info.version,
              }, 'vs ' + previous.version) : ''),
              ...(mayMove ? [el('td', {}, promoteButton(model, info.version))] : []));
  });
  const moves = (history.events || []).filter(
      (event) => event.kind === 'ALIAS_SET' || event.kind === 'ALIAS_DELETED');
  const timeline = moves.map((event) => el('tr', {},
      el('td', {}, micros(event.unix_micros)),
      el('td', {}, event.alias || ''),
      el('td', {}, (Number(event.previous_version || 0) ? event.previous_version : 'new') + ' \u2192 ' +
                   (event.kind === 'ALIAS_DELETED' ? 'deleted' : event.version)),
      el('td', {}, event.identity || ''),
      el('td', {}, event.reason || '')));
  // A page the user has left (a later route began) must not draw over the current one.
  if (!isCurrent()) return;
  show(el('h2', { id: 'model-name' }, model),
       el('h3', {}, 'Versions'),
       el('table', { id: 'versions' },
          el('thead', {}, el('tr', {}, el('th', {}, 'version'), el('th', {}, 'aliases'),
                             el('th', {}, 'created'), el('th', {}, 'step'),
                             ...metricNames.map((metric) => el('th', {}, metric)),
                             el('th', {}, 'MiB'), el('th', {}, 'run'), el('th', {}, 'tags'),
                             el('th', {}, 'description'), el('th', {}, 'changes'),
                             ...(mayMove ? [el('th', {}, 'promote')] : []))),
          el('tbody', {}, ...rows)),
       el('div', { id: 'change-holder' }),
       ...aliasSection(model, versions, mayMove, me),
       ...compareForm(model, versions),
       ...plotSection(versions, metricsOf, metricNames),
       el('h3', {}, 'Alias timeline'),
       el('table', { id: 'timeline' },
          el('thead', {}, el('tr', {}, el('th', {}, 'when'), el('th', {}, 'alias'),
                             el('th', {}, 'move'), el('th', {}, 'who'), el('th', {}, 'why'))),
          el('tbody', {}, ...timeline)),
       el('p', {}, el('a', { id: 'audit-link', href: '#/models/' + name + '/audit' },
                      'Audit log of ' + model)));
  status(versions.length + ' version(s) of ' + model);
}

// A form under the versions table for one change (promote or roll back): an alias, a reason.
function changeForm(id, title, alias, submitText, submit) {
  const aliasInput = el('input', { id: id + '-alias', value: alias, size: 14 });
  const reason = el('input', { id: id + '-reason', placeholder: 'why (kept in the history)',
                               size: 40 });
  const message = el('span', { id: id + '-message', class: 'error' });
  const form = el('form', { id, class: 'change' }, el('strong', {}, title), ' alias ', aliasInput,
                  ' ', reason, ' ', el('button', { type: 'submit' }, submitText), ' ',
                  el('button', { type: 'button', class: 'cancel' }, 'Cancel'), ' ', message);
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    submit(aliasInput.value.trim(), reason.value.trim()).then(
        () => form.remove(),
        (error) => { message.textContent = error.message; });
  });
  form.querySelector('.cancel').addEventListener('click', () => form.remove());
  document.getElementById('change-holder').replaceChildren(form);
  reason.focus();
}

function promoteButton(model, version) {
  const button = el('button', { type: 'button', class: 'promote', 'data-version': version },
                    'Promote\u2026');
  button.addEventListener('click', () => changeForm(
      'promote-form', 'Promote @' + version + ' to', 'production', 'Promote',
      (alias, reason) => post('models/' + encodeURIComponent(model) + '/promote',
                              { version: Number(version), alias, reason })
                             .then((moved) => status('@' + moved.version + ' is now ' + alias))));
  return button;
}

// The model's aliases with where each points; writers get a rollback button for each.
function aliasSection(model, versions, mayMove, me) {
  const aliases = [];
  for (const info of versions) {
    for (const alias of info.aliases || []) {
      if (alias !== 'latest') aliases.push([alias, info.version]);
    }
  }
  const items = aliases.map(([alias, version]) => {
    const item = el('li', { 'data-alias': alias }, alias + ' \u2192 @' + version);
    if (mayMove) {
      const button = el('button', { type: 'button', class: 'rollback', 'data-alias': alias },
                        'Roll back\u2026');
      button.addEventListener('click', () => changeForm(
          'rollback-form', 'Roll back', alias, 'Roll back',
          (chosen, reason) => post('models/' + encodeURIComponent(model) + '/rollback',
                                   { alias: chosen, reason })
                                  .then((moved) => status(chosen + ' rolled back to @' +
                                                          moved.to_version))));
      item.append(' ', button);
    }
    return item;
  });
  const note = mayMove ? [] : [el('p', { id: 'read-only', class: 'note' }, me === null
      ? 'The store does not say what you may change (it predates ckpt.v1.Identity), so the ' +
        'page offers no promote or rollback; the API and ckpt still do, where the store allows.'
      : 'Signed in as ' + me.identity + ' (' + me.role + '): the store does not let you move ' +
        'this model\'s aliases, so there is nothing to promote or roll back here.')];
  return [el('h3', {}, 'Aliases'), el('ul', { id: 'aliases' }, ...listOrNone(items)), ...note];
}

// The model's audit log: every call that changed it or tried to, with who, from where, the
// outcome.
async function auditPage(model, isCurrent = () => true) {
  const body = await api('models/' + encodeURIComponent(model) + '/audit');
  const records = body.records || [];
  const rows = records.map((record) => el('tr', {},
      el('td', { class: 'number' }, record.sequence || ''),
      el('td', {}, micros(record.unix_micros)),
      el('td', {}, record.identity || ''),
      el('td', {}, record.peer || ''),
      el('td', {}, record.action || ''),
      el('td', {}, record.detail || ''),
      el('td', {}, (record.outcome || '') +
                   (record.error_message ? ': ' + record.error_message : ''))));
  // A page the user has left (a later route began) must not draw over the current one.
  if (!isCurrent()) return;
  show(el('h2', { id: 'audit-name' },
          el('a', { href: '#/models/' + encodeURIComponent(model) }, model), ': audit log'),
       el('table', { id: 'audit' },
          el('thead', {}, el('tr', {}, el('th', {}, '#'), el('th', {}, 'when'),
                             el('th', {}, 'who'), el('th', {}, 'from'), el('th', {}, 'action'),
                             el('th', {}, 'what'), el('th', {}, 'outcome'))),
          el('tbody', {}, ...rows)));
  status(records.length + ' audit record(s) of ' + model);
}

// Two versions to compare (the one before the latest and the latest to begin with).
function compareForm(model, versions) {
  if (versions.length < 2) return [];
  const choice = (id, selected) => {
    const select = el('select', { id },
                      ...versions.map((info) => el('option', { value: info.version },
                                                   '@' + info.version)));
    select.value = selected;
    return select;
  };
  const a = choice('compare-a', versions[versions.length - 2].version);
  const b = choice('compare-b', versions[versions.length - 1].version);
  const form = el('form', { id: 'compare-form' }, 'Compare ', a, ' with ', b, ' ',
                  el('button', { type: 'submit' }, 'Compare'));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    location.hash = '#/models/' + encodeURIComponent(model) + '/compare/' + a.value + '/' + b.value;
  });
  return [form];
}

// The plot of one metric across versions, with a choice of metric ("val_acc" first if there).
function plotSection(versions, metricsOf, metricNames) {
  if (!metricNames.length) return [];
  const chosen = metricNames.includes('val_acc') ? 'val_acc' : metricNames[0];
  const select = el('select', { id: 'metric' },
                    ...metricNames.map((metric) => el('option', { value: metric }, metric)));
  select.value = chosen;
  const holder = el('div', { id: 'plot-holder' }, metricPlot(versions, metricsOf, chosen));
  select.addEventListener('change', () => {
    holder.replaceChildren(metricPlot(versions, metricsOf, select.value));
  });
  return [el('h3', {}, 'Metric across versions'), el('label', {}, 'metric ', select), holder];
}

// The lineage around `label` as a graph: ancestors to the left (nearest next to it), children to
// the right, each a linked box; drawn as SVG element by element.
function lineageGraph(label, ancestors, children) {
  const boxWidth = 190, boxHeight = 34, gap = 100, rowGap = 14;
  const chain = [...ancestors].reverse();  // oldest first, left to right.
  const columns = chain.length + 1 + (children.length ? 1 : 0);
  const rows = Math.max(1, children.length);
  const width = columns * boxWidth + (columns - 1) * gap + 2;
  const height = rows * boxHeight + (rows - 1) * rowGap + 2;
  const svg = svgEl('svg', { id: 'lineage-graph', width, height, viewBox: `0 0 ${width} ${height}`,
                             role: 'img', 'aria-label': 'lineage of ' + label });
  const middle = (height - boxHeight) / 2;
  const box = (entry, x, y, current) => {
    const [model, number] = entry.version.split('@');
    const rect = svgEl('rect', { x, y, width: boxWidth, height: boxHeight, rx: 4,
                                 class: current ? 'node current' : 'node' });
    const text = svgEl('text', { x: x + 8, y: y + 21, class: 'node-label' },
                       entry.version + (entry.state && entry.state !== 'ok'
                                            ? ' (' + entry.state + ')' : ''));
    if (current || entry.state !== 'ok') return svgEl('g', {}, rect, text);
    return svgEl('a', { href: '#/models/' + encodeURIComponent(model) + '/versions/' + number },
                 rect, text);
  };
  const edge = (x1, y1, x2, y2, relation) => svgEl('g', {},
      svgEl('line', { x1, y1, x2, y2, class: 'edge' }),
      svgEl('text', { x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 5, class: 'label',
                      'text-anchor': 'middle' },
            (relation || '').replace(/_from$/, '').replace(/_/g, ' ')));
  let x = 1;
  chain.forEach((entry, index) => {
    svg.append(box(entry, x, middle, false));
    // An ancestor's link says how the version right of it was made from it.
    svg.append(edge(x + boxWidth, middle + boxHeight / 2, x + boxWidth + gap,
                    middle + boxHeight / 2, entry.relation));
    x += boxWidth + gap;
  });
  const centerX = x;
  svg.append(box({ version: label, state: 'ok' }, centerX, middle, true));
  children.forEach((entry, index) => {
    const y = 1 + index * (boxHeight + rowGap);
    svg.append(edge(centerX + boxWidth, middle + boxHeight / 2, centerX + boxWidth + gap,
                    y + boxHeight / 2, entry.relation));
    svg.append(box(entry, centerX + boxWidth + gap, y, false));
  });
  return svg;
}

// List items, or one saying there are none.
function listOrNone(items) { return items.length ? items : [el('li', {}, 'none')]; }

function dtypeName(dtype) { return String(dtype || '').replace(/^DTYPE_/, '').toLowerCase(); }

async function versionPage(model, ref, isCurrent = () => true) {
  const name = encodeURIComponent(model);
  const [manifest, lineage, console_] = await Promise.all([
    api('models/' + name + '/versions/' + encodeURIComponent(ref)),
    api('models/' + name + '/versions/' + encodeURIComponent(ref) + '/lineage'),
    api('console')]);
  const label = model + '@' + manifest.version;
  const tensors = (manifest.tensors || []).map((meta) => el('tr', {},
      el('td', {}, meta.key),
      el('td', {}, dtypeName(meta.dtype)),
      el('td', {}, '[' + (meta.shape || []).join(', ') + ']'),
      el('td', { class: 'number' }, meta.byte_length || '0')));
  const link = (entry) => {
    const [linked, number] = entry.version.split('@');
    const cell = entry.state === 'ok'
        ? el('a', { href: '#/models/' + encodeURIComponent(linked) + '/versions/' + number },
             entry.version)
        : el('span', {}, entry.version + ' (' + entry.state + ')');
    return el('li', {}, cell, entry.relation ? ' (' + entry.relation.replace(/_/g, ' ') + ')' : '',
              entry.run_id ? ' (run ' + entry.run_id + ')' : '');
  };
  const store = console_.store || 'STORE';
  const lines = [
    'ckpt --store=' + store + ' export ' + label + ' model.safetensors',
    'ckpt --store=' + store + ' export ' + label + ' model.pt',
    'ckpt_client.Client(store="' + store + '", token=TOKEN).load_state_dict("' + label + '")',
  ];
  // A page the user has left (a later route began) must not draw over the current one.
  if (!isCurrent()) return;
  show(el('h2', { id: 'version-name' }, label),
       el('h3', {}, 'Load it'),
       el('pre', { id: 'load-lines' }, lines.join('\n')),
       el('h3', {}, 'Lineage'),
       lineageGraph(label, lineage.ancestors || [], lineage.children || []),
       el('p', {}, 'Made from:'),
       el('ul', { id: 'ancestors' }, ...listOrNone((lineage.ancestors || []).map(link))),
       el('p', {}, 'Made from it:'),
       el('ul', { id: 'children' }, ...listOrNone((lineage.children || []).map(link))),
       el('h3', {}, 'Tensors'),
       el('table', { id: 'tensors' },
          el('thead', {}, el('tr', {}, el('th', {}, 'key'), el('th', {}, 'dtype'),
                             el('th', {}, 'shape'), el('th', {}, 'bytes'))),
          el('tbody', {}, ...tensors)));
  status(label + ': ' + tensors.length + ' tensor(s)');
}

async function comparePage(model, a, b, isCurrent = () => true) {
  const name = encodeURIComponent(model);
  const [diff, listing] = await Promise.all([
    api('models/' + name + '/diff?a=' + encodeURIComponent(a) + '&b=' + encodeURIComponent(b)),
    api('models/' + name + '/versions')]);
  // The metrics of both versions side by side, with the change (b - a).
  const infoOf = (label) => (listing.versions || []).find(
      (info) => model + '@' + info.version === label) || {};
  const [metricsA, metricsB] = [versionMetrics(infoOf(diff.a)), versionMetrics(infoOf(diff.b))];
  const metricNames = [...new Set([...Object.keys(metricsA), ...Object.keys(metricsB)])].sort();
  const value = (metrics, metric) =>
      metric in metrics ? Number(metrics[metric]).toPrecision(4) : '';
  const metricRows = metricNames.map((metric) => {
    const change = metric in metricsA && metric in metricsB
        ? Number(metricsB[metric]) - Number(metricsA[metric]) : null;
    return el('tr', { 'data-metric': metric },
              el('td', {}, metric),
              el('td', { class: 'number' }, value(metricsA, metric)),
              el('td', { class: 'number' }, value(metricsB, metric)),
              el('td', { class: 'number' },
                 change === null ? '' : (change >= 0 ? '+' : '') + change.toPrecision(4)));
  });
  const changed = (diff.changed || []).map((change) => el('tr', {},
      el('td', {}, change.key),
      el('td', {}, change.dtype_a + ' [' + change.shape_a.join(', ') + ']'),
      el('td', {}, change.dtype_b + ' [' + change.shape_b.join(', ') + ']'),
      el('td', { class: 'number' }, 'max_abs_difference' in change
                                        ? Number(change.max_abs_difference).toPrecision(4) : '')));
  // A page the user has left (a later route began) must not draw over the current one.
  if (!isCurrent()) return;
  show(el('h2', { id: 'compare-name' }, diff.a + ' \u2192 ' + diff.b),
       el('h3', {}, 'Metrics'),
       el('table', { id: 'metric-changes' },
          el('thead', {}, el('tr', {}, el('th', {}, 'metric'), el('th', {}, diff.a),
                             el('th', {}, diff.b), el('th', {}, 'change'))),
          el('tbody', {}, ...metricRows)),
       el('h3', {}, 'Tensors'),
       el('p', {}, diff.unchanged + ' tensor(s) unchanged.'),
       el('h3', {}, 'Changed'),
       el('table', { id: 'changed' },
          el('thead', {}, el('tr', {}, el('th', {}, 'key'), el('th', {}, diff.a),
                             el('th', {}, diff.b), el('th', {}, 'max |a - b|'))),
          el('tbody', {}, ...changed)),
       el('h3', {}, 'Added'),
       el('ul', { id: 'added' }, ...listOrNone((diff.added || []).map((k) => el('li', {}, k)))),
       el('h3', {}, 'Removed'),
       el('ul', { id: 'removed' }, ...listOrNone((diff.removed || []).map((k) => el('li', {}, k)))));
  status(diff.a + ' against ' + diff.b);
}

// Follows /api/v1/watch for `model` (a fetch stream: EventSource cannot send the token) and calls
// `changed` after each registry event; stops when `isCurrent()` turns false.
async function follow(model, changed, isCurrent) {
  const response = await fetch('/api/v1/watch?model=' + encodeURIComponent(model), {
    headers: authHeaders(),
  });
  if (!response.ok || !response.body) return;
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = '';
  while (isCurrent()) {
    const { value, done } = await reader.read();
    if (done) break;
    buffered += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffered.indexOf('\n\n')) >= 0) {
      const message = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      const data = message.split('\n').find((line) => line.startsWith('data: '));
      if (data && JSON.parse(data.slice(6)).event && isCurrent()) changed();
    }
  }
  reader.cancel();
}

// What a model page does on each registry event: draws the page again, newest data last (an
// older refresh finishing late is dropped), and not while a promote or rollback form is open (the
// user is typing; the page is drawn when the form goes).
function refresher(model, isCurrent) {
  let latest = 0;
  let pending = false;
  const refresh = () => {
    const form = document.querySelector('form.change');
    if (form) {
      if (!pending) {
        pending = true;
        new MutationObserver((changes, observer) => {
          if (document.body.contains(form)) return;
          observer.disconnect();
          pending = false;
          if (isCurrent()) refresh();
        }).observe(document.getElementById('main'), { childList: true, subtree: true });
      }
      return;
    }
    const mine = ++latest;
    const stillCurrent = () => isCurrent() && mine === latest;
    modelPage(model, stillCurrent).catch((error) => { if (stillCurrent()) failed(error); });
  };
  return refresh;
}

let routeGeneration = 0;

async function route() {
  const generation = ++routeGeneration;
  const isCurrent = () => generation === routeGeneration;
  // Signed in by a token, or without one by the browser's client certificate where the console
  // asks for one: the store says whether it knows the caller.
  let me;
  try {
    if (!token()) {
      // Without a token: a browser that presented a client certificate is signed in by it, and
      // a store without identities (every caller "anonymous") needs no token at all; else the
      // page asks for one.
      const info = await api('console');
      if (!isCurrent()) return;
      if (!(info.client_certificate || []).length && !info.store_open) {
        signIn('');
        return;
      }
    }
    me = await whoAmI('');
  } catch (error) {
    if (!isCurrent()) return;
    if (token() || !(error instanceof ApiError && error.httpStatus === 401)) {
      failed(error);
    } else {
      signIn('');
    }
    return;
  }
  if (!isCurrent()) return;
  showIdentity(me);  // null: a store that cannot say
  document.getElementById('signout').hidden = !token();
  const match = location.hash.match(/^#\/models\/([^/]+)$/);
  const audit = location.hash.match(/^#\/models\/([^/]+)\/audit$/);
  const version = location.hash.match(/^#\/models\/([^/]+)\/versions\/([^/]+)$/);
  const compare = location.hash.match(/^#\/models\/([^/]+)\/compare\/([^/]+)\/([^/]+)$/);
  try {
    if (version) {
      await versionPage(decodeURIComponent(version[1]), decodeURIComponent(version[2]),
                        isCurrent);
    } else if (audit) {
      await auditPage(decodeURIComponent(audit[1]), isCurrent);
    } else if (compare) {
      await comparePage(decodeURIComponent(compare[1]), decodeURIComponent(compare[2]),
                        decodeURIComponent(compare[3]), isCurrent);
    } else if (match) {
      const model = decodeURIComponent(match[1]);
      await modelPage(model, isCurrent);
      follow(model, refresher(model, isCurrent), isCurrent).catch(() => {});
    } else {
      await modelsPage(isCurrent);
    }
  } catch (error) {
    if (isCurrent()) failed(error);
  }
}

window.addEventListener('hashchange', route);
window.addEventListener('DOMContentLoaded', () => {
  document.getElementById('signout').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    route();
  });
  route();
});
