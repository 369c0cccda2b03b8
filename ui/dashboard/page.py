"""The live KV-memory dashboard (Gradio glue): `build_dashboard(llm)` inside the app's gr.Blocks.

Two timers per page, both running only while the Memory tab is shown (wire_memory_tab): every
1 s one output, the bus (ui/dashboard/bus.py), carries the panels that changed for this viewer
(story, tiles, grid payload, tables, feed; the closed accordions only once opened); every 2 s
the plots, the picker's choices and the demo status go through Gradio. Each tick reads the
snapshot the engine published; the per-snapshot work (view-model, grid payload, plots, tables)
is done once for all viewers and cached by snapshot time; per viewer only the selection-dependent
grid/table strings differ (cached too). What each viewer was sent is remembered on the server as
digests (by session), so an unchanged panel is not sent again. Chart history comes from a stats
sampler (ui/dashboard/sampler.py), page open or not. Ticks run with concurrency_limit=None, so
they never queue behind chat events. The tick functions are ui/dashboard/ticks.py; this file builds
the components and the per-snapshot state they render from.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from html import escape

import gradio as gr

from ui.dashboard import panels as H
from ui.dashboard import view as V
from ui.dashboard.events import EventFeed, feed_html
from ui.dashboard.tier_panel import TierRates, tier_html
from ui.dashboard import bus as BUS
from ui.dashboard import grid_canvas as GC
from ui.dashboard.grid_payload import grid_payload, with_highlight
from ui.dashboard.sampler import StatsSampler
from ui.dashboard.ticks import Ticks, wire_ticks
from ui.dashboard.timers import DashboardTimers
from ui.dashboard import open_chats as OPEN
from ui.dashboard.story import pin_use, story_html
from engine.protocol import Configured, ServesTenants, SwitchesModels
from ui.dashboard.who import event_lines, served, who_html
from ui.dashboard.history import (
    HEADROOM,
    PLOT_STEP_S,
    PLOT_WINDOW_S,
    SERIES_BLOCKS,
    SERIES_COLORS,
    SERIES_HIT,
    History,
    blocks_frame,
    hit_rate_frame,
)
from ui.dashboard.demo_users import MAX_DEMO_USERS, DemoLoad, PromptSource
from ui.dashboard.groups_view import group_names, groups_html
from ui.dashboard.state_view import chat_state_note, state_html
from ui.dashboard.kv_math import PRESETS, shape_of

LIVE = "live model"
# Tick periods, chosen by measurement (loadgen/bench_dashboard_browser.py, 16 demo users, 3,000
# blocks, Chromium on 2 cores): every Gradio event costs the page's main thread more than the
# panels it carries. At 1 s / 2 s the page's main thread used ~15% CPU with the Memory tab shown,
# at 2 s / 4 s (and the chat list refreshing every 6 s instead of 2 s on this tab) ~8%.
TICK_S = 2.0
SLOW_TICK_S = 4.0
PAGED_SERIES = SERIES_BLOCKS[:2]  # used vs paging without sharing
CONTIG_SERIES = (SERIES_BLOCKS[0],) + SERIES_BLOCKS[2:]  # used vs contiguous max-len, pool size


class DashboardState:
    """Everything shared by the viewers of one engine: history, demo load, render cache."""

    def __init__(self, llm, system_prompt: PromptSource = None):
        self.llm = llm
        self.chat_states = (
            None  # () -> {conversation id: state}: the app's tab registry (open_chats.py)
        )
        self.history = History()
        self.demo = DemoLoad(llm, system_prompt)
        self.info = llm.model_info()  # layer mixers, state slot, experts (state_view.py)
        self.shape = shape_of(self.info)
        self._lock = threading.Lock()
        self._time = None
        self.base: dict | None = None
        self._bases: OrderedDict = OrderedDict()  # (snapshot time, viewer scope) -> base render
        self._views: OrderedDict = OrderedDict()
        self.feeds: dict = {}  # viewer scope -> EventFeed
        self.tier_rates = TierRates()  # KV-tier panel rates (ui/dashboard/tier_panel.py)
        self._sent: OrderedDict = (
            OrderedDict()
        )  # viewer (session hash) -> digests of what it was sent
        self.ticks = 0  # ticks served (a /metrics counter: the timer is idle when hidden)
        self.last_render_s = 0.0
        self.sampler = StatsSampler(
            llm, self.history
        )  # started by build_dashboard (one per engine)
        self.follows_switches = False  # registered with a model host's on_switch

    def model_switched(self, _engine=None) -> None:
        """Another model serves now (engine/front/model_host.py): its shape for the arithmetic and
        the headline, a fresh history (the old pool's lines do not continue into the new one), no
        cached render of the old pool, and the stats sampler running again (it stops by itself
        when a read meets the old engine shutting down)."""
        with self._lock:
            self.info = self.llm.model_info()
            self.shape = shape_of(self.info)
            self._time = None
            self._bases.clear()
            self._views.clear()
            self.feeds.clear()
        self.history.clear()
        self.sampler.stop()
        self.sampler.start()

    def metrics_text(self) -> str:
        return (
            "# HELP paged_chat_dashboard_ticks_total Memory-tab ticks served (none while the tab is hidden).\n"
            "# TYPE paged_chat_dashboard_ticks_total counter\n"
            f"paged_chat_dashboard_ticks_total {self.ticks}\n"
        )

    def opened(self, who, name: str | None = None, is_open: bool = False) -> tuple:
        """The accordions viewer `who` has open (closed ones get no bytes); with `name`, record
        that one opening or closing first."""
        key = ("opened", who)
        with self._lock:
            now = set(self._sent.get(key) or ())
            if name is not None:
                now = now | {name} if is_open else now - {name}
                self._sent[key] = tuple(sorted(now))
                self._sent.move_to_end(key)
            return tuple(sorted(now))

    def sent_to(self, who, digests: dict | None = None) -> dict:
        """Digests of what viewer `who` was last sent (read, or record with `digests`)."""
        with self._lock:
            if digests is None:
                return dict(self._sent.get(who) or {})
            self._sent[who] = digests
            self._sent.move_to_end(who)
            while len(self._sent) > 512:
                self._sent.popitem(last=False)
            return digests

    def base_for(self, snap: dict, scope=None) -> dict:
        """Per-snapshot render, computed once per viewer scope (one scope for every viewer without
        --auth). History is fed the snapshot once, whatever the scope (its numbers are aggregate)."""
        with self._lock:
            hit = self._bases.get((snap["time"], scope))
            if hit is not None:
                return hit
            t0 = time.perf_counter()
            if self._time != snap["time"]:
                if not self.sampler.running:  # no sampler (tests): record what ticks see
                    self.history.add(snap)
                self._time = snap["time"]
                self._views.clear()
            self.base = render_base(snap, self.history, self.shape, self.chat_states, self.info)
            self.base["tier"] = tier_html(
                snap["stats"], self.tier_rates.update(snap["time"], snap["stats"])
            )
            self._bases[(snap["time"], scope)] = self.base
            while len(self._bases) > 32:
                self._bases.popitem(last=False)
            self.last_render_s = time.perf_counter() - t0
            return self.base

    def feed(self, snap: dict, scope=None, viewer: str = "local", auth: bool = False) -> str:
        """The event feed, with the fair scheduler's decisions (held back, fair preemptions) in it."""
        events, rows = self.fair_events(), self.tenant_rows()
        with self._lock:
            f = self.feeds.setdefault(scope, EventFeed())
            extra, f.fair_since = event_lines(
                events, f.fair_since, viewer, auth, [r.tenant for r in served(rows)]
            )
            return feed_html(f.update(snap, extra))

    def tenant_rows(self) -> list:
        return self.llm.tenant_stats() if isinstance(self.llm, ServesTenants) else []

    def fair_events(self) -> list:
        return self.llm.fairness_events() if isinstance(self.llm, ServesTenants) else []

    def who(self, viewer: str, auth: bool) -> str:
        policy = self.llm.config.scheduling_policy if isinstance(self.llm, Configured) else "fair"
        return who_html(self.tenant_rows(), viewer, auth, policy)

    def view(
        self, snap: dict, selected: str | None, arith_model: str | None, scope=None, reasoning=None
    ) -> dict:
        """The panels for one viewer: `selected` outlined and its block table shown; `reasoning`
        (ui/chat/thinking.ReasoningSpan): where the selected chat's last reasoning sits in it."""
        base = self.base_for(snap, scope)
        key = (snap["time"], scope, selected or None, arith_model or LIVE, reasoning)
        with self._lock:
            if key in self._views:
                return self._views[key]
        out = dict(base)
        hl = V.highlight_blocks(base["convs"], selected)
        if selected or hl:
            out["grid"] = with_highlight(base["grid_payload"], hl)
            names = group_names(base["stats"])
            out["tables"] = H.tables_html(
                base["convs"],
                selected,
                snap["block_size"],
                reasoning=reasoning,
                group_names=names,
                state_note=chat_state_note(base["stats"]),
            )
        if arith_model and arith_model != LIVE and self.shape is not None:
            out["arith"] = arith_for(base, self.shape, arith_model)
        with self._lock:  # two viewers racing here: both get the first result
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
    return H.arithmetic_html(
        shape,
        st["kv_bytes_per_token"],
        st["block_size"],
        st["total_blocks"],
        base["avg_len"],
        table_model,
    )


def render_base(snap: dict, history: History, shape, chat_states=None, info=None) -> dict:
    """Every panel for one snapshot, with nothing selected. chat_states: () -> the tab registry's
    {conversation id: state}, for the open-chats line (None: no line). info: the model's ModelInfo,
    for what is not KV (linear-attention states, experts: ui/dashboard/state_view.py)."""
    st = snap["stats"]
    open_line = OPEN.line_html(OPEN.count(chat_states(), snap)) if chat_states is not None else ""
    grid = grid_payload(snap)
    convs = V.conversations(snap)
    samples = history.snapshot()
    items = V.headline(snap, history.hit_rate(60.0), history.throughput(5.0))
    longest = max((c["num_tokens"] for c in convs), default=None)
    base = {
        "time": snap["time"],
        "stats": st,
        "grid_payload": grid,
        "convs": convs,
        "avg_len": avg_len(snap),
        "items": items,
        "story": story_html(
            st,
            snap.get("others"),
            pin_use(snap),
            open_line,
            shape.name if shape is not None else "",
        ),
        "headline": H.headline_html(items, V.preemption_rows(snap))
        + groups_html(st, shape, longest)
        + state_html(snap, info, shape, longest),
        "grid": with_highlight(grid, ()),
        "tables": H.tables_html(convs, None, snap["block_size"]),
        # each plot changes once per 10 s bucket, at its own phase: at most one plot per slow (2 s) tick
        "paged_plot": blocks_frame(samples, series=PAGED_SERIES, phase_s=0.0),
        "contig_plot": blocks_frame(samples, series=CONTIG_SERIES, phase_s=PLOT_STEP_S / 3),
        "hit_plot": hit_rate_frame(samples, phase_s=2 * PLOT_STEP_S / 3),
        "whatif": H.whatif_html(snap.get("sequences") or [], snap["block_size"]),
        "choices": V.choices(convs),
    }
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


def build_dashboard(
    llm,
    system_prompt: PromptSource = None,
    *,
    tick_s: float = TICK_S,
    slow_tick_s: float = SLOW_TICK_S,
    storage=None,
    auth: bool = False,
    own_conv=None,
    may_start_demo=None,
    chat_states=None,
) -> DashboardTimers:
    """Create the dashboard components, its timer and the demo-load strip in the current Blocks;
    returns its DashboardTimers (inactive: the app turns them on only while the Memory tab is shown).

    system_prompt: the demo users' shared system prompt, a string or a callable returning the
    app's current one (default: ui.dashboard.demo_users.DEFAULT_SYSTEM_PROMPT).
    storage / auth / own_conv(request) -> conversation id: what each viewer may see, by title
    (engine/observe/viewer_scope.py). may_start_demo(request) -> bool: who may start the demo users.
    """
    from ui.dashboard.remote import build_remote_dashboard, is_remote

    if is_remote(
        llm
    ):  # app.py --backend URL: only what the server exposes (ui/dashboard/remote.py)
        return build_remote_dashboard(llm, tick_s=tick_s, auth=auth)
    state = state_for(llm, system_prompt)
    if chat_states is not None:
        state.chat_states = chat_states
    state.sampler.start()  # charts record every second, page open or not
    if isinstance(llm, SwitchesModels) and not state.follows_switches:  # the picker's other model
        llm.on_switch(state.model_switched)
        state.follows_switches = True
    c = _components(state)
    ticks = Ticks(state, storage=storage, auth=auth, own_conv=own_conv)
    dash = wire_ticks(ticks, c, tick_s, slow_tick_s)
    _wire_demo_strip(state, c, may_start_demo)
    return dash


def _components(state: DashboardState) -> dict:
    """The Memory tab's components, in page order; {name: component} for the wiring."""
    html = dict(
        value="",
        html_template=BUS.BODY,
        css_template=H.CSS,
        js_on_load=None,
        apply_default_css=True,
    )
    with gr.Column(elem_id="kv-dashboard"):
        gr.HTML(**html, elem_id="kv-story")
        with gr.Row(equal_height=True, elem_id="kv-demo-strip"):
            n_users = gr.Number(
                16,
                label="Demo users",
                precision=0,
                minimum=1,
                maximum=MAX_DEMO_USERS,
                scale=0,
                min_width=110,
                elem_id="kv-demo-n",
            )
            start = gr.Button("Start", size="sm", scale=0, min_width=70, elem_id="kv-demo-start")
            stop = gr.Button("Stop", size="sm", scale=0, min_width=70, elem_id="kv-demo-stop")
            gr.HTML(
                escape(state.demo.status()),  # then kept current by the bus
                html_template=BUS.STAMP + '<div class="kvbody">${value}</div>',
                css_template=H.CSS,
                elem_id="kv-demo-status",
            )
        gr.HTML(**html, elem_id="kv-headline")
        # above: what fits a laptop screen (headline, demo users, tiles); below, in sections
        with gr.Row(equal_height=False, elem_id="kv-who-tier"):
            gr.HTML(**html, elem_id="kv-who", min_width=320)  # "who is served" (who.py), by the bus
            gr.HTML(
                **html, elem_id="kv-tier", min_width=320
            )  # the KV tier beside the pool, by the bus
        gr.HTML(**html, elem_id="kv-feed")
        with gr.Row(equal_height=True):
            selector = gr.Dropdown(
                choices=[],
                value=None,
                label="Highlight a conversation",
                allow_custom_value=True,
                scale=1,
                elem_id="kv-select",
            )
            gr.Markdown(
                "Pick a conversation (or demo user) to outline its blocks in the grid and show "
                "its block table below. Hover a cell for block id, ref_count, holders and "
                "tokens filled.",
                elem_classes=["kv-hint"],
            )
        bus = gr.HTML("", html_template=BUS.TEMPLATE, js_on_load=BUS.JS, elem_id="kv-bus")
        gr.HTML(
            "",
            html_template=GC.TEMPLATE,
            css_template=H.CSS + GC.CSS,
            js_on_load=GC.JS,
            apply_default_css=True,
            elem_id="kv-grid",
        )
        gr.HTML(**html, elem_id="kv-tables")
        with gr.Accordion(
            "History: blocks used and prefix-cache hits, last 5 minutes",
            open=True,
            elem_id="kv-history",
        ):
            plots = _plots()
        with gr.Accordion(
            "KV arithmetic: bytes per token, traditional vs paged", open=False
        ) as arith_acc:
            arith_model = gr.Radio(
                [LIVE] + [p.name for p in PRESETS],
                value=LIVE,
                label="Batch table for",
                elem_id="kv-arith-model",
            )
            gr.HTML(**html, elem_id="kv-arith")
        with gr.Accordion("Block-size what-if (live sequences)", open=False) as whatif_acc:
            gr.HTML(**html, elem_id="kv-whatif")
    return dict(
        n_users=n_users,
        start=start,
        stop=stop,
        selector=selector,
        bus=bus,
        arith_acc=arith_acc,
        arith_model=arith_model,
        whatif_acc=whatif_acc,
        slow_outputs=[*plots, selector],
    )


def _plots() -> list:
    """The three history plots (paged, contiguous, hit rate), side by side."""
    colors = dict(zip(SERIES_BLOCKS, SERIES_COLORS))
    # a fixed x range: with one point Vega labelled its only tick "0.000000" (issue 47)
    plot = dict(
        x="seconds",
        color="series",
        x_title="seconds ago",
        height=210,
        color_map=colors,
        x_lim=[-PLOT_WINDOW_S, 0],
    )
    gr.HTML(
        BUS.STAMP_SLOW.format(
            tip="How old the plots are: the snapshot of their last update "
            f"(every {SLOW_TICK_S:g} s); each point is one 10 s bucket."
        ),
        css_template=H.CSS,
        padding=False,
        elem_id="kv-plots-asof",
    )
    with gr.Row():
        paged_plot = gr.LinePlot(
            y="blocks",
            title="Used vs paging without sharing",
            y_title="blocks",
            elem_id="kv-paged-plot",
            **plot,
        )
        # the title names the black line: a third legend entry does not fit a third of the width
        # and was cut off at the plot's right edge
        contig_plot = gr.LinePlot(
            y="blocks",
            title="Used vs contiguous (black: pool size)",
            y_title="blocks",
            elem_id="kv-contig-plot",
            colors_in_legend=list(CONTIG_SERIES[:2]),
            **plot,
        )
        # headroom above 100%, so a hit rate of 100% is drawn inside the plot, not on its edge
        hit_plot = gr.LinePlot(
            x="seconds",
            y="hit rate %",
            color="series",
            y_lim=[0, 100 * (1 + HEADROOM)],
            title="Prefix-cache hit rate",
            x_title="seconds ago",
            height=210,
            x_lim=[-PLOT_WINDOW_S, 0],
            color_map=dict(zip(SERIES_HIT, ("#60a5fa", "#f97316"))),
            elem_id="kv-hit-plot",
        )
    return [paged_plot, contig_plot, hit_plot]


def _wire_demo_strip(state: DashboardState, c: dict, may_start_demo) -> None:
    """Start / Stop of the demo users (the local user or an admin only)."""

    def allowed(request) -> bool:
        return may_start_demo is None or bool(may_start_demo(request))

    def on_start(n, request: gr.Request = None):
        if not allowed(request):
            gr.Warning("Only the local user or an admin may start demo users.")
        else:
            state.demo.start(int(n or 16))
        return BUS.message({"demo": escape(state.demo.status())})

    def on_stop(request: gr.Request = None):
        if allowed(request):
            state.demo.stop()
        return BUS.message({"demo": escape(state.demo.status())})

    # the status line says what happens (no progress timer over it); the bus carries it
    quiet = dict(concurrency_limit=None, api_visibility="private", show_progress="hidden")
    c["start"].click(on_start, inputs=[c["n_users"]], outputs=[c["bus"]], **quiet)
    c["stop"].click(on_stop, outputs=[c["bus"]], **quiet)
