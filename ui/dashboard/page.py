"""The live KV-memory dashboard (Gradio glue): `build_dashboard(llm)` inside the app's gr.Blocks.

One gr.Timer(1 s) per page; each tick reads the snapshot the engine thread published, and the
per-snapshot work (view-model, history sample, plots, tables) is done once for all viewers and
cached by snapshot time. Per viewer only the selection-dependent grid/table strings differ (cached
too), and outputs that did not change since that viewer's last tick are skipped.
Ticks run with concurrency_limit=None, so they never queue behind chat events.
"""
from __future__ import annotations

import threading
import time
import zlib
from collections import OrderedDict

import gradio as gr

from ui.dashboard import panels as H
from ui.dashboard import view as V
from ui.dashboard.history import (SERIES_BLOCKS, SERIES_COLORS, SERIES_HIT, History, blocks_frame,
                                  hit_rate_frame)
from loadgen.demo_load import DemoLoad, PromptSource
from ui.dashboard.kv_math import PRESETS, shape_of

LIVE = "live model"
OUTPUT_NAMES = ("headline", "grid", "tables", "paged_plot", "contig_plot", "hit_plot", "arith",
                "whatif", "selector", "demo")
PAGED_SERIES = SERIES_BLOCKS[:2]                       # used vs paging without sharing
CONTIG_SERIES = (SERIES_BLOCKS[0],) + SERIES_BLOCKS[2:]  # used vs contiguous max-len, pool size


class DashboardState:
    """Everything shared by the viewers of one engine: history, demo load, render cache."""

    def __init__(self, llm, system_prompt: PromptSource = None):
        self.llm = llm
        self.history = History()
        self.demo = DemoLoad(llm, system_prompt)
        self.shape = shape_of(llm.model_info())
        self._lock = threading.Lock()
        self._time = None
        self.base: dict | None = None
        self._views: OrderedDict = OrderedDict()
        self.last_render_s = 0.0

    def base_for(self, snap: dict) -> dict:
        """Per-snapshot render, computed once (by the first viewer to see the snapshot)."""
        with self._lock:
            if self._time == snap["time"] and self.base is not None:
                return self.base
            t0 = time.perf_counter()
            self.history.add(snap)
            self.base = render_base(snap, self.history, self.shape)
            self._time = snap["time"]
            self._views.clear()
            self.last_render_s = time.perf_counter() - t0
            return self.base

    def view(self, snap: dict, selected: str | None, arith_model: str | None) -> dict:
        base = self.base_for(snap)
        key = (snap["time"], selected or None, arith_model or LIVE)
        with self._lock:
            if key in self._views:
                return self._views[key]
        out = dict(base)
        hl = V.highlight_blocks(base["convs"], selected)
        if selected or hl:
            out["grid"] = H.grid_html(base["grid_model"], hl)
            out["tables"] = H.tables_html(base["convs"], selected, snap["block_size"])
        if arith_model and arith_model != LIVE and self.shape is not None:
            out["arith"] = arith_for(base, self.shape, arith_model)
        with self._lock:                 # two viewers racing here: both get the first result
            out = self._views.setdefault(key, out)
            while len(self._views) > 64:
                self._views.popitem(last=False)
        return out


def avg_len(snap: dict) -> float | None:
    seqs = snap.get("sequences") or []
    return sum(s["num_computed"] for s in seqs) / len(seqs) if seqs else None


def arith_for(base: dict, shape, model: str | None) -> str:
    table_model = next((p for p in PRESETS if p.name == model), None)
    st = base["stats"]
    return H.arithmetic_html(shape, st["kv_bytes_per_token"], st["block_size"], st["total_blocks"],
                             base["avg_len"], table_model)


def render_base(snap: dict, history: History, shape) -> dict:
    """Every panel for one snapshot, with nothing selected."""
    st = snap["stats"]
    grid = V.grid_model(snap)
    convs = V.conversations(snap)
    samples = history.snapshot()
    items = V.headline(snap, history.hit_rate(60.0), history.throughput(5.0))
    base = {"time": snap["time"], "stats": st, "grid_model": grid, "convs": convs,
            "avg_len": avg_len(snap), "items": items,
            "headline": H.headline_html(items, V.preemption_rows(snap)),
            "grid": H.grid_html(grid), "tables": H.tables_html(convs, None, snap["block_size"]),
            "paged_plot": blocks_frame(samples, series=PAGED_SERIES),
            "contig_plot": blocks_frame(samples, series=CONTIG_SERIES), "hit_plot": hit_rate_frame(samples),
            "whatif": H.whatif_html(snap.get("sequences") or [], snap["block_size"]),
            "choices": V.choices(convs)}
    base["arith"] = arith_for(base, shape, None) if shape is not None else ""
    return base


_STATES: dict[int, DashboardState] = {}
_STATES_LOCK = threading.Lock()


def state_for(llm, system_prompt: PromptSource = None) -> DashboardState:
    """The one DashboardState of this engine (module level: N viewers share it)."""
    with _STATES_LOCK:
        st = _STATES.get(id(llm))
        if st is None or st.llm is not llm:
            st = _STATES[id(llm)] = DashboardState(llm, system_prompt)
        elif system_prompt is not None:
            st.demo.system_prompt = system_prompt
        return st


def _digest(v) -> int:
    if hasattr(v, "to_csv"):
        v = v.to_csv(index=False)
    return zlib.crc32(repr(v).encode())


def build_dashboard(llm, system_prompt: PromptSource = None, *, tick_s: float = 1.0) -> None:
    """Create the dashboard components, its timer and the demo-load buttons in the current Blocks.

    system_prompt: the demo users' shared system prompt, a string or a callable returning the
    app's current one (default: loadgen.demo_load.DEFAULT_SYSTEM_PROMPT).
    """
    from ui.dashboard.remote import build_remote_dashboard, is_remote
    if is_remote(llm):      # app.py --backend URL: only what the server exposes (ui/dashboard/remote.py)
        return build_remote_dashboard(llm, tick_s=tick_s)
    state = state_for(llm, system_prompt)
    html = dict(css_template=H.CSS, js_on_load=None, apply_default_css=True)
    with gr.Column(elem_id="kv-dashboard"):
        gr.Markdown("### KV-cache memory, live\nEvery physical block of the paged KV pool, who holds it, "
                    "and what paging and prefix sharing save. Updates every second.")
        with gr.Row(equal_height=True):
            n_users = gr.Number(8, label="Simulated users", precision=0, minimum=1, maximum=128,
                                scale=1, elem_id="kv-demo-n")
            start = gr.Button("Start demo users", variant="primary", scale=1, elem_id="kv-demo-start")
            stop = gr.Button("Stop demo users", variant="stop", scale=1, elem_id="kv-demo-stop")
            demo_md = gr.Markdown(state.demo.status(), elem_id="kv-demo-status")
        headline = gr.HTML(**html, elem_id="kv-headline")
        with gr.Row(equal_height=True):
            selector = gr.Dropdown(choices=[], value=None, label="Highlight a conversation",
                                   allow_custom_value=True, scale=1, elem_id="kv-select")
            gr.Markdown("Pick a live conversation (or demo user) to outline its blocks in the grid "
                        "and show its block table below. Hover a cell for block id, ref_count, owners "
                        "and tokens filled.", elem_classes=["kv-hint"])
        grid = gr.HTML(**html, elem_id="kv-grid")
        tables = gr.HTML(**html, elem_id="kv-tables")
        colors = dict(zip(SERIES_BLOCKS, SERIES_COLORS))
        plot = dict(x="seconds", color="series", x_title="seconds ago", height=250, color_map=colors)
        with gr.Row():
            paged_plot = gr.LinePlot(y="blocks", title="Used vs paging without sharing",
                                     y_title="blocks", elem_id="kv-paged-plot", **plot)
            contig_plot = gr.LinePlot(y="blocks", title="Used vs contiguous (black: pool size)",
                                      y_title="blocks", elem_id="kv-contig-plot", **plot)
            hit_plot = gr.LinePlot(x="seconds", y="hit rate %", color="series", y_lim=[0, 100],
                                   title="Prefix-cache hit rate", x_title="seconds ago", height=250,
                                   color_map=dict(zip(SERIES_HIT, ("#60a5fa", "#f97316"))),
                                   elem_id="kv-hit-plot")
        with gr.Accordion("KV arithmetic: bytes per token, traditional vs paged", open=True):
            arith_model = gr.Radio([LIVE] + [p.name for p in PRESETS], value=LIVE,
                                   label="Batch table for", elem_id="kv-arith-model")
            arith = gr.HTML(**html, elem_id="kv-arith")
        with gr.Accordion("Block-size what-if (live sequences)", open=True):
            whatif = gr.HTML(**html, elem_id="kv-whatif")
        sent = gr.State({})
    outputs = [headline, grid, tables, paged_plot, contig_plot, hit_plot, arith, whatif, selector, demo_md, sent]

    def tick(selected, model, last):
        try:
            snap = llm.latest_snapshot()
        except RuntimeError as e:                  # engine shut down: keep the last picture
            return *([gr.skip()] * (len(OUTPUT_NAMES) - 1)), f"Engine unavailable: {e}", last
        v = state.view(snap, selected, model)
        values = {k: v[k] for k in OUTPUT_NAMES[:8]}
        values["selector"] = tuple(v["choices"])
        values["demo"] = state.demo.status()
        new, out = {}, []
        for name in OUTPUT_NAMES:
            d = _digest(values[name])
            new[name] = d
            if last.get(name) == d:
                out.append(gr.skip())
            elif name == "selector":
                out.append(gr.update(choices=list(values[name])))
            else:
                out.append(values[name])
        return *out, new

    timer = gr.Timer(tick_s)
    timer.tick(tick, inputs=[selector, arith_model, sent], outputs=outputs, concurrency_limit=None,
               show_progress="hidden", api_visibility="private")
    refresh = dict(fn=lambda s, m: tick(s, m, {}), inputs=[selector, arith_model], outputs=outputs,
                   concurrency_limit=None, show_progress="hidden", api_visibility="private")
    selector.change(**refresh)
    arith_model.change(**refresh)

    def on_start(n):
        state.demo.start(int(n or 8))
        return state.demo.status()

    def on_stop():
        state.demo.stop()
        return state.demo.status()

    start.click(on_start, inputs=[n_users], outputs=[demo_md], concurrency_limit=None,
                api_visibility="private")
    stop.click(on_stop, outputs=[demo_md], concurrency_limit=None, api_visibility="private")
