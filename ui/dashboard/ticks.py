"""The Memory tab's ticks (Gradio glue): per viewer, what to send on each timer tick.

`Ticks` scopes the engine's latest snapshot to what this viewer may see (by title; only their own
chats under --auth), renders it through the page's DashboardState (cached per snapshot), and sends
only the panels whose digest changed since this viewer was last sent something: the fast tick as
one bus message (ui/dashboard/bus.py, with the demo users' status and the snapshot's time), the
slow one (plots, picker) through Gradio.
`wire_ticks` attaches them to two inactive timers; ui/dashboard/timers.py turns them on with the tab.
"""

from __future__ import annotations

import time
import zlib
from html import escape
from typing import TYPE_CHECKING

import gradio as gr
import pandas as pd

from engine.observe.viewer_scope import scope_snapshot, titles_for
from ui.chat import thinking
from ui.dashboard import bus as BUS
from ui.dashboard.history import y_limits
from ui.dashboard.timers import DashboardTimers
from ui.dashboard.who import viewer_tenant

if TYPE_CHECKING:
    from ui.dashboard.page import DashboardState

FOLDED = ("arith", "whatif")  # in closed-by-default accordions: sent only while open
OUTPUT_NAMES = (
    "story",
    "headline",
    "grid",
    "tables",
    "paged_plot",
    "contig_plot",
    "hit_plot",
    "arith",
    "whatif",
    "feed",
    "selector",
    "demo",
    "who",
    "tier",
)
FAST = tuple(BUS.PANELS)  # through the one-output bus, every TICK_S
SLOW = ("paged_plot", "contig_plot", "hit_plot", "selector")  # through Gradio, every SLOW_TICK_S
BLOCK_PLOTS = ("paged_plot", "contig_plot")  # their y axis follows the data (history.y_limits)
# "the open accordions as this viewer's page last said": kept on the server by session (not in a
# gr.State: any State makes every page hold a second long-lived connection, see ui/layout.py)
SESSION = object()


def digest(v) -> int:
    if isinstance(v, pd.DataFrame):
        v = v.to_csv(index=False)
    return zlib.crc32(repr(v).encode())


class Ticks:
    """The dashboard's tick functions for one engine's state and one app's privacy rules: what
    each viewer may see (scoped by title, own chats only under --auth) and what changed since
    that viewer was last sent something."""

    def __init__(self, state: DashboardState, *, storage=None, auth: bool = False, own_conv=None):
        self.state, self.llm, self.storage, self.auth, self.own_conv = (
            state,
            state.llm,
            storage,
            auth,
            own_conv,
        )

    def _own(self, request):
        return self.own_conv(request) if self.own_conv is not None and request is not None else None

    def scoped(self, snap, request):
        """The snapshot this viewer may see, and a key for caching its render."""
        if self.storage is None and not self.auth:
            return snap, None
        user = getattr(request, "username", None) if self.auth else None
        titles = titles_for(self.storage, user, self.auth)
        own = self._own(request)
        key = (user, own, zlib.crc32(repr(sorted(titles.items())).encode()))
        return scope_snapshot(snap, titles=titles, viewer=user, own_conv=own, auth=self.auth), key

    def missing_choice(self, have, selected, request) -> tuple:
        """The selected chat when it holds no blocks now (e.g. reopened from the sidebar after its
        session ended): still offered by its title, so the picker never shows a raw id."""
        if not selected or self.storage is None or any(k == selected for _, k in have):
            return ()
        user = getattr(request, "username", None) if self.auth else None
        title = titles_for(self.storage, user, self.auth).get(selected)
        return ((f"{title} (no blocks now)", selected),) if title else ()

    def reasoning_of(self, snap, selected, request):
        """Where the selected chat's last reasoning sits in its block table (a thinking model's
        chat between turns; ui/chat/thinking.py), read from the viewer's own stored messages."""
        if not selected or self.storage is None:
            return None
        markers = self.llm.model_info().reasoning_markers
        seqs = (snap.get("sequences") or []) if markers else []
        seq = next((s for s in seqs if s.get("session_id") == selected), None)
        if seq is None:
            return None
        try:
            path = self.storage.get_messages(
                selected, owner=getattr(request, "username", None) if self.auth else None
            )
        except (KeyError, PermissionError):
            return None
        start = thinking.start_marker_id(markers, self.llm.get_tokenizer())
        span = thinking.last_reply_span(path, start, snap["block_size"])
        return span if span is not None and thinking.held_turn(path, seq["num_tokens"]) else None

    def values(self, snap, selected, model, request, names) -> dict:
        """{name: value} of the outputs in `names` for this viewer."""
        state = self.state
        snap, key = self.scoped(snap, request)
        v = state.view(snap, selected, model, key, self.reasoning_of(snap, selected, request))
        values = {k: v[k] for k in OUTPUT_NAMES[:9] if k in names}
        me = viewer_tenant(getattr(request, "username", None), self.auth)
        if "feed" in names:
            values["feed"] = state.feed(snap, key[0] if key else None, me, self.auth)
        if "who" in names:
            values["who"] = state.who(me, self.auth)
        if "selector" in names:
            values["selector"] = tuple(v["choices"]) + self.missing_choice(
                v["choices"], selected, request
            )
        if "demo" in names:
            values["demo"] = escape(state.demo.status())  # an error's text is not ours: escaped
        if "tier" in names:
            values["tier"] = v["tier"]
        return values

    def tick(
        self, selected, model, last, shown=None, request: gr.Request = None, names=OUTPUT_NAMES
    ):
        """{name: value to send} for the outputs in `names` whose digest differs from `last`
        (what this viewer was sent), and the new digests. shown: the open accordion panels
        (None: all); closed ones are not sent."""
        self.state.ticks += 1
        try:
            snap = self.llm.latest_snapshot()
        except RuntimeError as e:  # engine shut down: keep the last picture
            return {"demo": escape(f"Engine unavailable: {e}")} if "demo" in names else {}, last
        values = self.values(snap, selected, model, request, names)
        new, out = dict(last), {BUS.ASOF: snap.get("time")}
        for name in names:
            if name in FOLDED and shown is not None and name not in shown:
                continue  # sent (with its digest) once it is opened
            d = digest(values[name])
            if last.get(name) != d:
                new[name] = d
                out[name] = values[name]
        return out, new

    def fast(self, selected, model, shown=SESSION, request: gr.Request = None, fresh=False):
        """The fast tick (TICK_S): one bus message with the panels that changed for this viewer,
        and always the time of the snapshot they show (the page's "as of ... ago"). shown: the
        open accordions (default: as this viewer's page last said, kept on the server)."""
        who = getattr(request, "session_hash", None)
        if shown is SESSION:
            shown = self.state.opened(who)
        last = {} if fresh else self.state.sent_to(who)
        out, new = self.tick(selected, model, last, shown, request, FAST)
        self.state.sent_to(who, new)
        snap_time = out.pop(BUS.ASOF, None)
        if snap_time is None and not out:
            return gr.skip()  # no snapshot (engine shut down): keep the last picture
        slow_time = self.state.sent_to(("slow", who)).get(BUS.ASOF)
        return BUS.message(out, snap_time=snap_time, now=time.time(), slow_time=slow_time)

    def slow(self, selected, model, request: gr.Request = None, fresh=False):
        """The slower tick: plots (new points every few seconds), picker choices."""
        who = ("slow", getattr(request, "session_hash", None))
        out, new = self.tick(
            selected, model, {} if fresh else self.state.sent_to(who), None, request, SLOW
        )
        new[BUS.ASOF] = out.get(BUS.ASOF)  # the plots' snapshot time, for the fast tick's stamp
        self.state.sent_to(who, new)
        return tuple(
            gr.update(choices=list(out[n]))
            if n == "selector" and n in out
            else gr.update(value=out[n], y_lim=y_limits(out[n], "blocks"))
            if n in BLOCK_PLOTS and n in out
            else out.get(n, gr.skip())
            for n in SLOW
        )

    def refresh_fn(self, s, m, request: gr.Request = None):
        return self.fast(s, m, SESSION, request, fresh=True)

    def set_opened(self, name: str, is_open: bool, request: gr.Request = None) -> None:
        """An accordion of this viewer's page opened or closed (its panel is sent only while open)."""
        self.state.opened(getattr(request, "session_hash", None), name, is_open)

    def refresh_slow(self, s, m, request: gr.Request = None):
        return self.slow(s, m, request, fresh=True)

    def own_fn(self, request: gr.Request = None):
        """The chat open in this browser tab (the sidebar's pick), highlighted on arrival."""
        own = self._own(request)
        return gr.update(value=str(own)) if own else gr.skip()


def wire_ticks(ticks: Ticks, c: dict, tick_s: float, slow_tick_s: float) -> DashboardTimers:
    """Two inactive timers (fast: the bus; slow: plots, picker, demo status), repaints on a new
    selection or model, and the accordions' open/closed state."""
    quiet = dict(show_progress="hidden", api_visibility="private", concurrency_limit=None)
    inputs = [c["selector"], c["arith_model"]]
    # a tick that cannot keep up is dropped, never queued: while one is pending the page sends no
    # other ("once"), and each reads the newest snapshot when it runs, not the one of when it was asked
    timer = gr.Timer(tick_s, active=False)
    timer.tick(ticks.fast, inputs=inputs, outputs=[c["bus"]], trigger_mode="once", **quiet)
    slow_timer = gr.Timer(slow_tick_s, active=False)
    slow_timer.tick(
        ticks.slow, inputs=inputs, outputs=c["slow_outputs"], trigger_mode="once", **quiet
    )
    refresh = dict(fn=ticks.refresh_fn, inputs=inputs, outputs=[c["bus"]], **quiet)
    refresh_all = dict(fn=ticks.refresh_slow, inputs=inputs, outputs=c["slow_outputs"], **quiet)
    c["selector"].change(**refresh)
    c["arith_model"].change(**refresh)
    for acc, name in ((c["arith_acc"], "arith"), (c["whatif_acc"], "whatif")):

        def expand(request: gr.Request = None, n=name):
            ticks.set_opened(n, True, request)

        def collapse(request: gr.Request = None, n=name):
            ticks.set_opened(n, False, request)

        acc.expand(expand, None, None, **quiet).then(**refresh)
        acc.collapse(collapse, None, None, **quiet)
    # the app switches both timers on and off with the Memory tab and repaints at once when it is shown
    return DashboardTimers(
        [timer, slow_timer],
        refresh,
        refresh_slow=refresh_all,
        select_own=dict(
            fn=ticks.own_fn,
            inputs=None,
            outputs=[c["selector"]],
            show_progress="hidden",
            api_visibility="private",
            concurrency_limit=None,
        ),
        tick_fns={"fast": ticks.fast, "slow": ticks.slow, "tick": ticks.tick},
    )
