"""One output per tick: the panels that changed, as one small JSON message applied by a page script.

Why: measured in Chromium (loadgen/bench_dashboard_browser.py), a tick that updated 13 Gradio
outputs kept the page's main thread ~20% busy even when most outputs were gr.skip(): every output
of an event goes through Gradio's per-component status and state bookkeeping. The fast tick now
has a single output, this hidden "bus"; its script puts each changed panel's HTML into that
panel's body (`#kv-story .kvbody`, ...) and hands the grid payload to the canvas painter
(ui/dashboard/grid_canvas.py). Panels that did not change are not in the message at all. The
plots, the picker's choices and the demo status (which change at most every few seconds) go
through Gradio on a slower timer.
"""
from __future__ import annotations

import json

PANELS = {"story": "kv-story", "headline": "kv-headline", "grid": "kv-grid", "tables": "kv-tables",
          "feed": "kv-feed", "arith": "kv-arith", "whatif": "kv-whatif", "who": "kv-who", "tier": "kv-tier"}
BODY = '<div class="kvbody"></div>'            # a panel's html_template: filled by the bus only

TEMPLATE = '<div class="kvbus" style="display:none"></div>'

JS = """
const apply = () => {
  let d = null;
  try { d = JSON.parse(props.value || 'null'); } catch (e) { return; }
  if (!d) { return; }
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
  if (seq) { seq.dataset.applied = String(Number(seq.dataset.applied || 0) + 1); }
};
watch('value', apply);
apply();
"""


def message(values: dict) -> str:
    """{panel element id: HTML (or the grid's JSON payload)} for the panels given."""
    return json.dumps({PANELS[k]: v for k, v in values.items()}, separators=(",", ":"))
