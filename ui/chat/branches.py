"""Switching versions of a message (`< 2/3 >`) and continuing with one of n alternatives.

Why here and not in the storage or the engine: a branch switch changes only which stored path
the tab shows (storage.select_branch). The engine needs nothing: the next turn passes that
branch's exact token ids as `previous_ids`, and the session's prefix blocks are matched by
content in the prefix cache, so the branches' common prefix stays shared in the KV pool.
Switching is refused while a reply is being generated in the conversation (the reply belongs to
the branch it started on; moving the view under it would paint it onto another branch).
"""

from __future__ import annotations

import gradio as gr

from ui.chat import thinking, view
from ui.chat.context import ChatContext
from ui.chat.painting import conversation_list, show


def parse_command(command: str) -> int | None:
    """ "<message id>:<nonce>" written by the page's script (a nonce so that clicking the same
    arrow twice is two changes) -> the message id to show, or None for anything else."""
    head = str(command or "").split(":", 1)[0]
    return int(head) if head.isdigit() else None


def _refresh(ctx: ChatContext, request, tab, conv_id: str):
    path = ctx.storage.get_messages(conv_id, owner=ctx.check(request))
    return show(tab, path, ctx), conversation_list(ctx, request, conv_id)


def switch(ctx: ChatContext, command: str, request):
    """Show the branch through the message named by an arrow link: (chatbot, status, list)."""
    tab = ctx.tab(request)
    target = parse_command(command)
    if target is None or tab.conv_id is None:
        return gr.skip(), gr.skip(), gr.skip()
    if ctx.tabs.is_busy(tab.conv_id):
        gr.Info("Wait for the reply (or press Stop) before switching versions.")
        return gr.skip(), gr.skip(), gr.skip()
    try:
        msg = ctx.storage.get_message(target, owner=ctx.check(request))
    except (KeyError, PermissionError):
        gr.Warning("That version does not exist any more.")
        return gr.skip(), gr.skip(), gr.skip()
    if msg["conversation_id"] != tab.conv_id:
        return gr.skip(), gr.skip(), gr.skip()
    ctx.storage.select_branch(target, owner=ctx.check(request))
    chat, radio = _refresh(ctx, request, tab, tab.conv_id)
    versions = ctx.storage.branch_versions(tab.conv_id).get(target, [target])
    return chat, f"showing version {versions.index(target) + 1}/{len(versions)}", radio


def pick(ctx: ChatContext, k: int, request):
    """Continue with alternative k: it becomes the reply on the branch, the next turn's prompt
    holds its tokens. Returns (chatbot, status, list, *alternative markdowns, *their buttons): every
    alternative but the one now continued with keeps its button."""
    tab = ctx.tab(request)
    skip = (gr.skip(),) * (3 + 2 * view.MAX_ALTERNATIVES)
    if tab.conv_id is None or not 0 <= k < len(tab.alt_ids):
        return skip
    if ctx.tabs.is_busy(tab.conv_id):
        gr.Info("Wait for the reply (or press Stop) before picking an alternative.")
        return skip
    try:
        ctx.storage.select_branch(tab.alt_ids[k], owner=ctx.check(request))
    except (KeyError, PermissionError):
        gr.Warning("That alternative does not exist any more.")
        return skip
    chat, radio = _refresh(ctx, request, tab, tab.conv_id)
    rows = {m["id"]: m for m in ctx.storage.get_siblings(tab.alt_ids[k])}
    alts = []
    for i, mid in enumerate(tab.alt_ids):
        m = rows.get(mid)
        alts.append(
            view.alternative_markdown(
                i,
                m["content"] if m else "",
                m and m["stats"],
                status=m and m["status"],
                chosen=i == k,
                split=m and thinking.stored_split(m["content"], m["stats"]),
            )
            if m
            else gr.skip()
        )
    alts += [gr.skip()] * (view.MAX_ALTERNATIVES - len(alts))
    buttons = [
        gr.Button(visible=i != k and i < len(tab.alt_ids)) for i in range(view.MAX_ALTERNATIVES)
    ]
    return (chat, f"continuing with alternative {k + 1}", radio, *alts, *buttons)
