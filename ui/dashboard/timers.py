"""What a Memory-tab builder hands the page (ui/dashboard/page.py, ui/dashboard/remote.py): its
timers, inactive until the tab is shown, and the events to run when it is shown.

Why an explicit object: the page used to hang these on the gr.Timer and ask `hasattr` which ones
a view had; here every field is declared, and the optional ones are None.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gradio as gr


@dataclass
class DashboardTimers:
    timers: list  # gr.Timer: the fast one first; all off while the tab is hidden
    refresh: dict  # an event's keyword arguments: repaint at once on showing the tab
    refresh_slow: dict | None = None  # the same for the slow outputs (the embedded dashboard)
    select_own: dict | None = (
        None  # highlight the chat open in the sidebar (the embedded dashboard)
    )
    tick_fns: dict = field(
        default_factory=dict
    )  # the tick functions by name, for tests and benchmarks

    @property
    def timer(self) -> gr.Timer:
        return self.timers[0]


def wire_memory_tab(memory_tab, other_tab, dash: DashboardTimers) -> None:
    """Showing the Memory tab starts the dashboard's timers (none run while it is hidden: no
    requests, no page work), selects the chat open in the sidebar, and repaints at once; showing
    the other tab stops them. Works for the remote view too (one timer, no selection)."""
    timers = list(dash.timers)
    quiet = dict(api_visibility="private", show_progress="hidden")

    def switch(active: bool):
        # one output takes the return value whole: a one-item list would leave the timer as it was
        # (the remote views' single timer never started before this)
        one = gr.Timer(active=active)
        return [one] * len(timers) if len(timers) > 1 else one

    shown = memory_tab.select(lambda: switch(True), None, timers, **quiet)
    if dash.select_own is not None:
        shown = shown.then(**dash.select_own)
    shown.then(**dash.refresh)
    if dash.refresh_slow is not None:
        shown.then(**dash.refresh_slow)
    other_tab.select(lambda: switch(False), None, timers, **quiet)
