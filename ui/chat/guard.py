"""Per-tab owner check (#12.10): a tab's server state belongs to the user who opened it.

Why: tab state is keyed by Gradio's session hash, which the browser sends with every call. With
another user's hash (seen in a shared screenshot, a log, a proxy) bob's /stop aborted alice's
reply, a second /stop returned her whole conversation, and /close_tab released her session. The
hash names a tab; the login says who is asking. Every per-tab call therefore checks that the
asking user is the tab's owner before reading or changing anything.
"""

from __future__ import annotations

import gradio as gr


class TabOwnerError(gr.Error, PermissionError):
    """Another user's tab: refused with a plain message, nothing read or changed."""

    def __init__(self):
        super().__init__(
            "This browser session belongs to another user; nothing was changed.",
            title="Not allowed",
        )


def check_owner(tab, username: str | None) -> None:
    """Raise TabOwnerError unless `username` (None without --auth) opened `tab`."""
    if (tab.username or None) != (username or None):
        raise TabOwnerError()
