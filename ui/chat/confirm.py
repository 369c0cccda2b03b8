"""The question Delete asks before deleting: it names the chat on screen and what goes with it.

Why a separate step: a one-click delete of the wrong chat cannot be undone (messages, every
branch and the stored token ids go; the engine forgets the session). The question is built
from the chat the tab shows at the moment of the click, the same one "Yes, delete" deletes.
"""

from __future__ import annotations

import html

import gradio as gr

from ui.chat.context import ChatContext


def delete_question(ctx: ChatContext, request) -> str | None:
    """Markdown naming the chat and its message count, or None (with a notice) when no chat is open."""
    tab = ctx.tab(request)
    conv = None
    if tab.conv_id is not None:
        try:
            conv = ctx.storage.get_conversation(tab.conv_id, owner=ctx.check(request))
        except (KeyError, PermissionError):
            conv = None
    if conv is None:
        gr.Info("No conversation is open: nothing to delete.")
        return None
    total = ctx.storage.count_messages(conv["id"], owner=ctx.check(request))
    title = html.escape(conv["title"] or "Untitled")
    return (
        f"**Delete “{title}”?** This deletes the conversation and all {total} of its messages "
        f"(every branch). It cannot be undone."
    )


def current_title(ctx: ChatContext, request) -> str:
    """The title of the chat on screen, to pre-fill the rename box when it is opened (a chat
    created by sending its first message got its title after the box was last filled)."""
    tab = ctx.tab(request)
    if tab.conv_id is None:
        return ""
    try:
        return ctx.storage.get_conversation(tab.conv_id, owner=ctx.check(request))["title"]
    except (KeyError, PermissionError):
        return ""
