"""The Memory tab when the chat runs on a remote backend (`app.py --backend URL`).

Why a separate view: the embedded dashboard reads the engine's exact block pool; a remote vLLM,
SGLang or llama.cpp server only exposes Prometheus counters and gauges. This view draws those as
timelines (KV usage, prefix-cache hit rate, running/waiting, preemptions, token throughput), adds
the full block grid when the backend is another app.py (its /api/kv, drawn with the same panels as
the local dashboard), and lists in plain words what it cannot see. The numbers come from
backends/monitor.BackendMonitor; this file only lays them out.
"""

from __future__ import annotations

from html import escape

import gradio as gr
import pandas as pd

from backends.monitor import WINDOW_S as MONITOR_WINDOW_S, BackendMonitor
from engine.protocol import ServesReplicas
from ui.dashboard import panels as H
from ui.dashboard import view as V
from ui.dashboard.history import HEADROOM, y_limits
from ui.dashboard.timers import DashboardTimers

_MONITORS: dict[int, BackendMonitor] = {}


def is_remote(llm) -> bool:
    return llm.kind == "remote"


def monitor_for(llm) -> BackendMonitor:
    mon = _MONITORS.get(id(llm))
    if mon is None or mon.engine is not llm:
        mon = _MONITORS[id(llm)] = BackendMonitor(llm)
    return mon


REMOTE_WINDOW_S = (
    MONITOR_WINDOW_S  # a fixed x range: one point alone was labelled "0.000000" (issue 47)
)


def long_frame(rows: list[dict], y: str, series: dict[str, str]) -> pd.DataFrame:
    """Rows -> the long form gr.LinePlot wants (seconds, y, series); values not exposed are left out."""
    out = [
        {"seconds": r["seconds"], y: r[col], "series": name}
        for r in rows
        for col, name in series.items()
        if r.get(col) is not None
    ]
    return pd.DataFrame(out, columns=["seconds", y, "series"])


def _fmt(v, pct=False) -> str:
    if v is None:
        return "not exposed"
    return f"{100 * v:.1f} %" if pct else f"{v:,.0f}"


def headline(mon: BackendMonitor, engine) -> str:
    s = mon.latest()
    rows = mon.rows()
    gen = next(
        (r["generated tok/s"] for r in reversed(rows) if r["generated tok/s"] is not None), None
    )
    items = [
        (
            "backend",
            "Backend",
            f"{s.engine if s and s.engine else 'unknown engine'}",
            f"{engine.model or '?'} at {engine.root}",
        )
    ]
    if s is not None:
        items += [
            ("kv_usage", "KV-cache usage", _fmt(s.kv_usage, pct=True), "of the backend's KV pool"),
            (
                "hit_rate",
                "Prefix-cache hit rate",
                _fmt(mon.cumulative_hit_rate(), pct=True),
                "since it started",
            ),
            ("running", "Running / waiting", f"{_fmt(s.running)} / {_fmt(s.waiting)}", "requests"),
            ("preemptions", "Preemptions", _fmt(s.preemptions), "since it started"),
            (
                "gen_tps",
                "Generated tok/s",
                "not exposed"
                if s.generation_tokens is None
                else "measuring…"
                if gen is None
                else f"{gen:,.1f}",
                "last interval",
            ),
        ]
    boxes = "".join(
        f'<div data-k="{k}"><div class="l">{escape(label)}</div><div class="v">{escape(text)}</div>'
        f'<div class="s">{escape(sub)}</div></div>'
        for k, label, text, sub in items
    )
    blind = "".join(f"<li>{escape(b)}</li>" for b in mon.blind_spots())
    return (
        f'<div class="kvd" id="kv-remote-headline"><div class="kvn">{boxes}</div>'
        f'<div class="muted"><b>What this page cannot see on this backend:</b><ul>{blind}</ul></div></div>'
    )


def render(mon: BackendMonitor, engine) -> list:
    mon.poll()
    rows = mon.rows()
    snap = mon.snapshot
    if snap is not None:
        grid = H.grid_html(V.grid_model(snap))
        tables = H.tables_html(V.conversations(snap), None, snap["block_size"])
        grid_note = (
            "The backend is another app.py: its whole block pool (GET /api/kv, schema "
            f"{snap.get('schema', 'paged-chat.kv')} v{snap.get('version', 1)})."
        )
    else:
        grid, tables = "", ""
        grid_note = f"No block grid: {mon.kv_error or 'the backend exposes no /api/kv'}."
    return [
        headline(mon, engine),
        grid_note,
        grid,
        tables,
        long_frame(
            rows, "percent", {"kv usage %": "KV usage", "hit rate %": "prefix-cache hit rate"}
        ),
        _with_headroom(
            long_frame(
                rows,
                "requests",
                {"running": "running", "waiting": "waiting", "preemptions": "preemptions (total)"},
            ),
            "requests",
        ),
        _with_headroom(
            long_frame(
                rows, "tokens/s", {"generated tok/s": "generated", "prompt tok/s": "prompt"}
            ),
            "tokens/s",
        ),
    ]


def _with_headroom(frame, column: str):
    """The plot's data with a y axis above its highest point (history.y_limits: Gradio's own axis
    ends at the maximum, where the top line lies on the plot's edge)."""
    return gr.update(value=frame, y_lim=y_limits(frame, column))


def build_remote_dashboard(llm, *, tick_s: float = 1.0, auth: bool = False) -> DashboardTimers:
    """The Memory tab's components and timer for a RemoteEngine, in the current Blocks; several
    replicas (backends/cluster_engine.py) get the cluster tab (ui/dashboard/cluster_tab.py)."""
    if isinstance(llm, ServesReplicas):
        from ui.dashboard.cluster_tab import build_cluster_dashboard

        return build_cluster_dashboard(llm, tick_s=tick_s, auth=auth)
    mon = monitor_for(llm)
    html = dict(css_template=H.CSS, apply_default_css=True)
    with gr.Column(elem_id="kv-dashboard-remote"):
        gr.Markdown(
            f"### Backend memory, live\nThis app sends every chat to **{escape(llm.root)}**; the "
            "model and its KV cache live there. Below is what that server exposes, every second."
        )
        head = gr.HTML(**html, elem_id="kv-remote-head")
        with gr.Row():
            pct = gr.LinePlot(
                x="seconds",
                y="percent",
                x_lim=[-REMOTE_WINDOW_S, 0],
                color="series",
                y_lim=[0, 100 * (1 + HEADROOM)],
                height=250,
                title="KV usage and prefix-cache hit rate",
                x_title="seconds ago",
                elem_id="kv-remote-pct",
            )
            reqs = gr.LinePlot(
                x="seconds",
                y="requests",
                x_lim=[-REMOTE_WINDOW_S, 0],
                color="series",
                height=250,
                title="Running, waiting, preemptions",
                x_title="seconds ago",
                elem_id="kv-remote-reqs",
            )
            tps = gr.LinePlot(
                x="seconds",
                y="tokens/s",
                x_lim=[-REMOTE_WINDOW_S, 0],
                color="series",
                height=250,
                title="Token throughput",
                x_title="seconds ago",
                elem_id="kv-remote-tps",
            )
        grid_note = gr.Markdown(elem_id="kv-remote-grid-note")
        grid = gr.HTML(**html, elem_id="kv-grid")
        tables = gr.HTML(**html, elem_id="kv-tables")
    outputs = [head, grid_note, grid, tables, pct, reqs, tps]
    # Same contract as the embedded dashboard (ui/dashboard/page.py): the timer starts inactive and the
    # app turns it on only while the Memory tab is shown; `refresh` repaints at once on showing it.
    timer = gr.Timer(tick_s, active=False)
    paint = dict(
        fn=lambda: render(mon, llm),
        outputs=outputs,
        concurrency_limit=None,
        show_progress="hidden",
        api_visibility="private",
    )
    timer.tick(**paint)
    return DashboardTimers([timer], paint, tick_fns={"paint": paint["fn"]})
