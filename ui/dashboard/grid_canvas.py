"""The page side of the block grid: a gr.HTML skeleton with a <canvas>, and a small script that
paints the run-length payload of ui/dashboard/grid_payload.py.

Why a canvas: thousands of grid cells as DOM elements re-laid out every second kept the browser's
main thread busy; painting the same cells with fillRect costs well under a millisecond. The
script keeps nothing but the last payload; it is handed over by the tick's bus
(ui/dashboard/bus.py: `canvas.kvPaint(payload)`) only when the grid changed, so an unchanged
grid is neither sent nor repainted.

Hover text (canvas `title`) is computed on the page from the payload's holder sets: block id,
state, ref_count, tokens filled, holders by title. Colours are the theme's CSS variables
(--kv-free ... from panels.THEME_CSS), read at paint time, so dark mode paints dark colours.
For tests the element exposes `kvCellAt(block)` -> {x, y} (CSS pixels inside the canvas) and
`kvTitleAt(block)` (also on the canvas), and the canvas carries `data-painted` (number of paints).
"""

from __future__ import annotations

import json
from html import escape

from ui.dashboard.bus import STAMP
from ui.dashboard.view import KIND_NAMES, KINDS
from ui.dashboard.vocabulary import BY_CODE, NAMES as VOC_NAMES

TEMPLATE = (
    STAMP + '<div class="kvd kvgc"><div class="kvl"></div><div class="muted kvscale"></div>'
    '<canvas data-painted="0"></canvas></div>'
)

CSS = (
    ".kvgc canvas { display: block; width: 100%; }"
    " .kvl .sel b { outline: 2px solid var(--kv-outline); }"
    " .kvl .kvmode button { font-size: 11px; padding: 0 6px; margin-left: 3px;"
    " border-radius: 3px;"
    " border: 1px solid var(--border-color-primary, #d1d5db); background: transparent;"
    " cursor: pointer; }"
    " .kvl .kvmode button[aria-pressed=true] { background: var(--kv-track, #f3f4f6);"
    " font-weight: 600; }"
)

_NAMES = [KIND_NAMES[k] for k in KINDS]
_VARS = [
    VOC_NAMES[k] for k in KINDS
]  # --kv-<name>: one colour per state (ui/dashboard/vocabulary.py)
# the legend's hover text: each state's one-line meaning
_TIPS = [escape(f"{BY_CODE[k].name}: {BY_CODE[k].meaning}", quote=True) for k in KINDS]

JS = (
    """
const NAMES = __NAMES__, VARS = __VARS__, TIPS = __TIPS__, PITCH = 14, CELL = 13, BAND = 16;
const rootOf = () => element.querySelector('.kvgc') || element;
const st = { p: null, items: [], cols: 1, n: 0, src: null };
// with KV cache groups the grid can be coloured by layer kind, not block state (kept per browser)
const byKind = (p) => !!(p && p.kinds) && localStorage.getItem('kvGridMode') === 'kind';
const kindOfCells = (p) => {
  const out = new Int32Array(Math.ceil(p.n / p.per)); let c = 0;
  const r = p.kinds.runs;
  for (let i = 0; i < r.length; i += 2) { out.fill(r[i], c, c + r[i + 1]); c += r[i + 1]; }
  return out;
};
const fmt = (x) => x.toLocaleString('en-US');
const holders = (p, set) => {
  if (set < 0 || !p.sets[set]) { return ''; }
  const who = p.sets[set].map((h) => p.names[h]);
  return ' · held by ' + who.slice(0, 3).join(', ') + (who.length > 3 ? ` and ${who.length - 3} more` : '');
};
// a band's first and last block (its cells aggregate p.per blocks each above MAX_CELLS)
const bandBlocks = (p, it) => [it.first * p.per, Math.min(p.n, (it.first + it.len) * p.per) - 1];
const layout = (p, width) => {
  const cols = Math.max(8, Math.floor(width / PITCH));
  const items = []; let x = 0, y = 0, cell = 0;
  const r = p.runs;
  for (let i = 0; i < r.length; i += 5) {
    const [k, len, ref, set, fill] = [r[i], r[i + 1], r[i + 2], r[i + 3], r[i + 4]];
    if (k <= 1 && len >= p.band) {                  // a long free / cached run: one counted band
      if (x) { x = 0; y += PITCH; }
      items.push({ band: true, k, first: cell, len, y });
      y += BAND + 1; cell += len; continue;
    }
    for (let j = 0; j < len; j++) {
      items.push({ k, ref, set, fill, first: cell, x: x * PITCH, y });
      cell += 1; x += 1;
      if (x >= cols) { x = 0; y += PITCH; }
    }
  }
  return { items, cols, height: y + (x ? PITCH : 0) + 2 };
};
const lit = (p, cell) => {
  const a = cell * p.per, b = a + p.per;
  for (let i = 0; i < p.hl.length; i += 2) {
    if (p.hl[i] < b && p.hl[i] + p.hl[i + 1] > a) { return true; }
  }
  return false;
};
const paint = (src) => {
  if (typeof src === 'string') { st.src = src; }
  let p = null;
  try { p = JSON.parse(st.src || props.value || window.__kvGrid || 'null'); } catch (e) { return; }
  if (!p || !p.runs) { return; }
  const root = rootOf();
  const cv = root.querySelector('canvas');
  if (!cv) { return; }
  const css = getComputedStyle(root);
  const colour = VARS.map((v) => css.getPropertyValue('--kv-' + v).trim() || '#888');
  const kindMode = byKind(p);
  const kindColour = [0, 1, 2, 3].map((i) =>
    css.getPropertyValue(`--kv-kind-${i}`).trim() || '#888');
  const kindOf = p.kinds ? kindOfCells(p) : null;
  st.kindOf = kindOf;
  const text = css.getPropertyValue('--body-text-color').trim() || '#111';
  const outline = css.getPropertyValue('--kv-outline').trim() || '#111';
  const width = Math.max(200, root.clientWidth || 800);
  const L = layout(p, width);
  const dpr = window.devicePixelRatio || 1;
  cv.width = Math.round(width * dpr); cv.height = Math.round(L.height * dpr);
  cv.style.height = L.height + 'px';
  const g = cv.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, width, L.height);
  g.textBaseline = 'middle';
  let nlit = 0;
  for (const it of L.items) {
    g.fillStyle = colour[it.k];
    if (it.band) {
      g.fillRect(0, it.y, width, BAND);
      g.fillStyle = text; g.font = '500 11px sans-serif'; g.textAlign = 'left';
      const [a, b] = bandBlocks(p, it);
      const label = `${fmt(b - a + 1)} ${NAMES[it.k]} blocks (#${fmt(a)}–#${fmt(b)})`;
      g.fillText(label, 6, it.y + BAND / 2);
      continue;
    }
    if (kindMode && it.k >= 1) {                 // a held or cached block: its layer kind's colour
      g.fillStyle = kindColour[kindOf[it.first] % 4]; g.globalAlpha = it.k === 1 ? 0.4 : 1;
    }
    g.fillRect(it.x, it.y, CELL, CELL);
    g.globalAlpha = 1;
    if (it.ref >= 2 && it.k >= 3) {
      g.fillStyle = '#fff'; g.font = '600 8px sans-serif'; g.textAlign = 'center';
      g.fillText(String(it.ref), it.x + CELL / 2, it.y + CELL / 2 + 0.5);
    }
    if (p.hl.length && lit(p, it.first)) {
      nlit += 1; g.strokeStyle = outline; g.lineWidth = 2; g.strokeRect(it.x + 1, it.y + 1, CELL - 2, CELL - 2);
    }
  }
  st.p = p; st.items = L.items;
  legend(root, p, kindMode ? kindColour : colour, kindMode);
  cv.dataset.mode = kindMode ? 'kind' : 'state';
  root.querySelector('.kvscale').innerHTML = `<span data-k="per_cell" data-v="${p.per}"></span>` + (p.per === 1 ?
    `${fmt(p.n)} blocks, one cell per block; the number in a shared cell is its ref_count; hover a cell for its holders` :
    `${fmt(p.n)} blocks, more than the grid shows: each cell aggregates ${p.per} blocks (colour = the most common state, number = highest ref_count)`);
  cv.kvCellAt = element.kvCellAt; cv.kvTitleAt = element.kvTitleAt; cv.kvPaint = paint;
  cv.dataset.painted = String(Number(cv.dataset.painted || 0) + 1);
  cv.dataset.lit = String(nlit);
};
// The legend is built once and then only its numbers and colours change, in place: rebuilding it
// on every paint replaced its elements under anyone reading them (a test read a swatch's colour
// from an element the next paint had just detached: '' instead of the colour, issue 47).
const legend = (root, p, colour, kindMode) => {
  const box = root.querySelector('.kvl');
  if (!box) { return; }
  const names = kindMode ? p.kinds.names : NAMES;
  const built = `${kindMode ? 'kind' : 'state'}:${names.length}:${p.kinds ? 1 : 0}`;
  if (box.dataset.built !== built) {
    const toggle = p.kinds ? '<span class="kvmode">Colour by: ' +
      `<button type="button" data-m="state" aria-pressed="${!kindMode}">block state</button>` +
      `<button type="button" data-m="kind" aria-pressed="${kindMode}">layer kind</button>` +
      '</span>' : '';
    const key = kindMode ? 'kind_cells' : 'cells', unit = kindMode ? ' in use' : '';
    box.innerHTML = toggle + names.map((name, k) =>
      `<span title="${kindMode ? name : TIPS[k]}"><b></b>${name}: ` +
      `<span data-k="${key}_${k}" data-v=""></span>${unit}</span>`).join('') +
      '<span class="sel" hidden><b></b>selected conversation (' +
      '<span data-k="selected_blocks" data-v=""></span> blocks)</span>';
    for (const b of box.querySelectorAll('.kvmode button')) {
      b.onclick = () => { localStorage.setItem('kvGridMode', b.dataset.m); paint(); };
    }
    box.dataset.built = built;
  }
  const set = (el, v, text) => {
    if (el && el.dataset.v !== String(v)) { el.dataset.v = String(v); el.textContent = text; }
  };
  const spans = box.querySelectorAll(':scope > span:not(.sel):not(.kvmode)');
  const counts = kindMode ? p.kinds.counts : p.counts;
  names.forEach((name, k) => {
    const sw = spans[k].querySelector('b');
    const c = colour[kindMode ? k % 4 : k];
    if (sw.dataset.c !== c) { sw.dataset.c = c; sw.style.background = c; }
    set(spans[k].querySelector('[data-k]'), counts[k], fmt(counts[k]));
  });
  const nsel = p.hl.reduce((s, v, i) => s + (i % 2 ? v : 0), 0);
  const sel = box.querySelector('.sel');
  sel.hidden = !nsel;
  set(sel.querySelector('[data-k]'), nsel, fmt(nsel));
};
const itemOf = (cell) => st.items.find((it) => cell >= it.first && cell < it.first + (it.band ? it.len : 1));
const titleOf = (it) => {
  const p = st.p;
  if (!it) { return ''; }
  if (it.band) {
    const [a, b] = bandBlocks(p, it);
    return `blocks ${fmt(a)}–${fmt(b)} · ${NAMES[it.k]}`;
  }
  if (p.per > 1) {
    const a = it.first * p.per;
    return `blocks ${fmt(a)}–${fmt(a + it.fill - 1)} · mostly ${NAMES[it.k]}` + (it.ref ? ` · max ref_count ${it.ref}` : '');
  }
  if (it.k === 0) { return `block ${it.first} · free`; }
  const kind = p.kinds && st.kindOf ? ` · ${p.kinds.names[st.kindOf[it.first]]} layers` : '';
  return `block ${it.first} · ${NAMES[it.k]}${kind} · ref_count ${it.ref} · ` +
    `${it.fill}/${p.bs} tokens` + holders(p, it.set);
};
element.kvCellAt = (block) => {
  const it = st.p && itemOf(Math.floor(block / st.p.per));
  return it ? (it.band ? { x: 3, y: it.y + BAND / 2 } : { x: it.x + CELL / 2, y: it.y + CELL / 2 }) : null;
};
element.kvTitleAt = (block) => st.p ? titleOf(itemOf(Math.floor(block / st.p.per))) : '';
element.addEventListener('mousemove', (e) => {
  const cv = rootOf().querySelector('canvas');
  if (!cv || e.target !== cv || !st.p) { return; }
  const r = cv.getBoundingClientRect(), x = e.clientX - r.left, y = e.clientY - r.top;
  const it = st.items.find((c) => c.band ? (y >= c.y && y < c.y + BAND) :
    (x >= c.x && x < c.x + CELL && y >= c.y && y < c.y + CELL));
  cv.title = titleOf(it);
});
let resized = 0;
new ResizeObserver(() => { const w = rootOf().clientWidth; if (st.p && Math.abs(w - resized) > 8) { resized = w; paint(); } }).observe(element);
const cv0 = rootOf().querySelector('canvas');
if (cv0) { cv0.kvPaint = paint; }
watch('value', () => paint(props.value));
paint(window.__kvGrid || props.value);
""".replace("__NAMES__", json.dumps(_NAMES))
    .replace("__VARS__", json.dumps(_VARS))
    .replace("__TIPS__", json.dumps(_TIPS))
)
