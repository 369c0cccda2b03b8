"""One output per tick: the panels that changed, as one small JSON message applied by a page script.

Why: measured in Chromium (loadgen/bench_dashboard_browser.py), a tick that updated 13 Gradio
outputs kept the page's main thread ~20% busy even when most outputs were gr.skip(): every output
of an event goes through Gradio's per-component status and state bookkeeping. The fast tick now
has a single output, this hidden "bus"; its script puts each changed panel's HTML into that
panel's body (`#kv-story .kvbody`, ...) and hands the grid payload to the canvas painter
(ui/dashboard/grid_canvas.py). Panels that did not change are not in the message at all. The
plots, the picker's choices and the demo status (which change at most every few seconds) go
through Gradio on a slower timer.

Freshness (issue 47): every message carries the time of the snapshot its panels show and the
server's time when it was sent ("kv-asof"), even when no panel changed, so each panel's corner says
"as of 0.4 s ago" and a page that stopped receiving ticks shows it ageing instead of looking live.
The page keeps the age running between ticks from its own monotonic clock; `data-snap` on each
stamp is the snapshot time itself (server clock), which tests compare with /api/kv's.
"""

from __future__ import annotations

import json

PANELS = {
    "story": "kv-story",
    "headline": "kv-headline",
    "grid": "kv-grid",
    "tables": "kv-tables",
    "feed": "kv-feed",
    "arith": "kv-arith",
    "whatif": "kv-whatif",
    "who": "kv-who",
    "tier": "kv-tier",
    "demo": "kv-demo-status",
}
ASOF = "kv-asof"
STAMP_FAST = '<span class="kv-asof" data-src="fast" title="{tip}"></span>'
STAMP_SLOW = '<span class="kv-asof" data-src="slow" title="{tip}"></span>'
_TIP = (
    "How old these numbers are: the time since the engine's snapshot they were drawn from. "
    "It keeps counting if the page stops receiving updates."
)
STAMP = STAMP_FAST.format(tip=_TIP)
# a panel's html_template: its freshness stamp, then the body the bus fills
BODY = STAMP + '<div class="kvbody"></div>'

TEMPLATE = '<div class="kvbus" style="display:none"></div>'

JS = """
const fmtAge = (s) => s < 10 ? `${s.toFixed(1)} s`
  : s < 120 ? `${Math.round(s)} s` : `${Math.round(s / 60)} min`;
const stamp = () => {
  const m = window.__kvAsOf;
  if (!m) { return; }
  const dash = document.querySelector('#kv-dashboard');
  if (!dash || dash.offsetParent === null) { return; }        // the Memory tab is hidden
  const since = (performance.now() - m.recv) / 1000;
  for (const e of dash.querySelectorAll('.kv-asof')) {
    const snap = e.dataset.src === 'slow' ? m.slow : m.snap;
    if (!snap) { continue; }
    const age = Math.max(0, m.at - snap + since);
    e.textContent = `as of ${fmtAge(age)} ago`;
    e.dataset.snap = String(snap);
    e.classList.toggle('old', age > 10);
  }
};
if (!window.__kvStampTimer) { window.__kvStampTimer = setInterval(stamp, 500); }
const apply = () => {
  let d = null;
  try { d = JSON.parse(props.value || 'null'); } catch (e) { return; }
  if (!d) { return; }
  const meta = d['kv-asof'];
  if (meta) {
    delete d['kv-asof'];
    const slow = meta.slow || (window.__kvAsOf || {}).slow;
    window.__kvAsOf = { snap: meta.snap, slow, at: meta.at, recv: performance.now() };
    const log = window.__kvTicks = window.__kvTicks || [];   // the last ticks (tests, benchmarks)
    log.push({ snap: meta.snap, at: meta.at, recv: Date.now() / 1000 });
    if (log.length > 300) { log.shift(); }
  }
  window.__kvPanels = Object.assign(window.__kvPanels || {}, d);
  for (const [id, body] of Object.entries(d)) {
    if (id === 'kv-grid') {
      window.__kvGrid = body;
      const c = document.querySelector('#kv-grid canvas');
      if (c && c.kvPaint) { c.kvPaint(body); }
      continue;
    }
    const el = document.querySelector(`#${id} .kvbody`);
    if (el) { el.innerHTML = body; }
  }
  const seq = document.querySelector('#kv-bus .kvbus');
  if (seq) {
    seq.dataset.applied = String(Number(seq.dataset.applied || 0) + 1);
    if (meta) { seq.dataset.snap = String(meta.snap); }
  }
  stamp();
};
watch('value', apply);
apply();
"""


def message(
    values: dict,
    snap_time: float | None = None,
    now: float | None = None,
    slow_time: float | None = None,
) -> str:
    """{panel element id: HTML (or the grid's JSON payload)} for the panels given, and with
    `snap_time` the freshness entry: the snapshot's time, the server's time now (`now`) and the
    slow tick's last snapshot time (the plots'), all server clock."""
    out = {PANELS[k]: v for k, v in values.items()}
    if snap_time is not None:
        at = now if now is not None else snap_time
        out[ASOF] = {"snap": snap_time, "at": at, "slow": slow_time}
    return json.dumps(out, separators=(",", ":"))
