"""Painting a reply into a tab: what one yield of a chat event carries (`outputs`), the chat as a
tab shows it (`show`, `view_signature`), and the streams that paint a reply while the tab still
shows its conversation: `generate` starts one, `follow_turn` / `follow_beam` paint a running one
(also a reply another tab started). When the user opens another chat mid-reply, painting stops
and the tab gets its current view (`current_view`); the reply itself goes on (ui/chat/turn.py).
The user's actions that lead here (send, regenerate, edit, continue, stop) are ui/chat/handlers.py.
"""

from __future__ import annotations

import asyncio

import gradio as gr

from engine.text.prepared_prompt import PreparedPrompt
from ui.chat import beam, states, view
from ui.chat.context import ChatContext
from ui.chat.turn import Turn, previous_ids, start_turn
from ui.chat.wakeup import QUEUE_REFRESH_S, Wakeup

YIELD_S = 0.05  # at most ~20 page updates a second per stream


def outputs(msg=None, chat=None, status=None, radio=None, alts=None, picks=(), busy=None) -> tuple:
    """One yield of a chat event, gr.skip() for all not given. `picks`: indices of the alternatives
    with a "Continue with this one" button (none while generating, never the one already on screen:
    no button that does nothing); `busy`: Stop instead of Send (one button that changes with state)."""
    skip = gr.skip()
    out = [
        skip if msg is None else msg,
        skip if chat is None else chat,
        skip if status is None else status,
        skip if radio is None else radio,
    ]
    if alts is None:
        out += [skip] * (1 + 2 * view.MAX_ALTERNATIVES)
    else:
        out.append(gr.Row(visible=bool(alts)))
        out += [
            gr.Markdown(value=alts[i], visible=True)
            if i < len(alts)
            else gr.Markdown(visible=False)
            for i in range(view.MAX_ALTERNATIVES)
        ]
        out += [gr.Button(visible=i in picks) for i in range(view.MAX_ALTERNATIVES)]
    if busy is None:
        out += [skip, skip]
    else:
        out += [gr.Button(visible=not busy), gr.Button(visible=busy)]
    return tuple(out)


def eos_ids(ctx: ChatContext) -> frozenset:
    """The end-of-turn token ids (to tell "end of turn" from "stop sequence"): the engine's own
    rule (engine/text/end_of_turn.py), as its model info states it; none for a remote engine."""
    return frozenset(ctx.llm.model_info().eos_token_ids)


def list_radio(choices: list, value, query: str | None = None):
    """The conversation list; a search that matches nothing says so instead of an empty box."""
    if query and not choices:
        return gr.Radio(choices=[], value=None, label=f"No chats match “{query}”", show_label=True)
    return gr.Radio(choices=choices, value=value, label="Conversations", show_label=False)


def conversation_list(ctx: ChatContext, request, selected: str | None):
    rows = ctx.storage.list_conversations(owner=ctx.check(request))
    choices = view.conversation_choices(rows)
    tab = ctx.tab(request)
    tab.list_sig = (tuple(choices), selected, None)
    return list_radio(choices, selected)


def show(tab, path: list[dict], ctx: ChatContext | None = None) -> list[dict]:
    """The chatbot rows for `path`, recording what the tab now shows (for edits and repaints).
    With `ctx`, messages that have other versions get `< k/n >` and replies their finish reason."""
    versions, limit, eos = {}, None, ()
    if ctx is not None and path:
        versions = ctx.storage.branch_versions(path[0]["conversation_id"])
        limit, eos = ctx.max_model_len, eos_ids(ctx)
    shown, tab.shown_ids = view.display_messages(path, versions, limit, eos)
    tab.view_sig = view_signature(path, versions)
    return shown


def view_signature(path: list[dict], versions: dict | None = None) -> tuple:
    n = sum(len(v) for v in (versions or {}).values())
    return tuple((m["id"], m["status"], len(m["content"])) for m in path) + (n,)


async def generate(
    ctx: ChatContext,
    request,
    tab,
    conv_id: str,
    path: list[dict],
    kw: dict,
    sibling_of: int | None = None,
    first_msg: str | None = None,
    prepared: PreparedPrompt | None = None,
):
    """Start a reply to the stored user message that ends `path` and paint it while this tab shows
    its conversation. `path` is the branch as the handler read it, plus that message: the branch
    is not read again. `prepared`: the prompt the handler counted (its messages are the turn's).
    The caller has called tabs.begin(conv_id); the turn always calls tabs.end."""
    user_id = path[-1]["id"]
    messages = (
        list(prepared.messages)
        if prepared is not None
        else view.engine_messages(ctx.storage.conversation_system_prompt(conv_id), path)
    )
    kw = dict(kw)
    width = kw.pop("beam_width", 0)
    think = kw.pop("thinking", None)  # the template's switch, not a sampling parameter
    if width:
        async for out in _beam_reply(
            ctx, request, tab, conv_id, messages, path, user_id, width, kw, first_msg
        ):
            yield out
        return
    turn = Turn(
        conv_id,
        user_id,
        kw["n"],
        cache_salt=ctx.cache_salt(request),
        tenant=ctx.tenant(request),
        thinking=think,
    )
    try:
        start_turn(
            ctx,
            turn,
            messages,
            kw,
            sibling_of,
            previous_ids=previous_ids(path[:-1]),
            prepared=prepared,
        )
    except BaseException:
        ctx.tabs.end(conv_id)
        raise
    try:
        shown = show(tab, path, ctx)
        tab.alt_ids = []
        alts = (
            [view.alternative_markdown(i, "", None, admitted=False) for i in range(turn.n)]
            if turn.n > 1
            else []
        )
        queued = states.live_status(states.QUEUED, ctx.tabs.queue_position(turn))
        yield outputs(
            first_msg,
            shown + [{"role": "assistant", "content": view.live_reply("", False, state=queued)}],
            queued,
            conversation_list(ctx, request, conv_id),
            alts,
            busy=True,
        )
        async for out in follow_turn(ctx, request, tab, turn, shown):
            yield out
    except (asyncio.CancelledError, GeneratorExit):
        # Gradio cancels this handler on a reload, a closed tab or a dropped connection. The
        # reply belongs to the server (ui/chat/reattach.py): only Stop ends it, and Stop's own
        # handler (stop below) aborts it explicitly. Here the tab merely stops painting; opening the
        # chat again (any tab of the same user) reattaches through `follow`.
        raise


async def _beam_reply(ctx, request, tab, conv_id, messages, path, user_id, width, kw, first_msg):
    """Beam search instead of sampling (ui/chat/beam.py): a BeamTurn owned by the conversation like
    a Turn; this tab paints "searching", then the k beams side by side."""
    bt = beam.BeamTurn(
        conv_id, user_id, width, cache_salt=ctx.cache_salt(request), tenant=ctx.tenant(request)
    )
    try:
        beam.start(ctx, bt, messages, kw["max_tokens"])
    except BaseException:
        ctx.tabs.end(conv_id)
        raise
    shown = show(tab, path, ctx)
    tab.alt_ids = []
    yield outputs(first_msg, radio=conversation_list(ctx, request, conv_id), alts=[])
    async for out in follow_beam(ctx, request, tab, bt, shown):
        yield out


async def follow_beam(ctx: ChatContext, request, tab, bt: beam.BeamTurn, shown: list[dict]):
    """Paint a beam search into this tab: "searching" until it ends (a search streams nothing),
    then the k beams, or why there are none. Stops painting the moment the tab shows another chat."""
    tab.following = bt
    ev = bt.wakeup.follow()  # woken when it ends or this tab opens another chat
    try:
        yield outputs(
            chat=shown + [{"role": "assistant", "content": f"*{bt.label}*"}],
            status=bt.label,
            busy=True,
        )
        while not bt.finished:
            if tab.conv_id != bt.conv_id:
                yield current_view(ctx, request, tab)
                return
            await Wakeup.wait(ev, None)
        await bt.task
    finally:
        bt.wakeup.leave(ev)
        if tab.following is bt:
            tab.following = None
    if tab.conv_id != bt.conv_id:
        yield current_view(ctx, request, tab)
        return
    if bt.lost:
        yield outputs(
            chat=shown + [{"role": "assistant", "content": view.deleted_notice()}],
            status=view.deleted_notice(),
            radio=conversation_list(ctx, request, None),
            alts=[],
            busy=False,
        )
        return
    if bt.error is not None:  # refused or failed: this search only
        notice = view.error_notice(bt.error)
        yield outputs(
            chat=shown + [{"role": "assistant", "content": notice}],
            status=notice,
            alts=[],
            busy=False,
        )
        return
    if not bt.stored:  # stopped: a search keeps nothing of its unfinished beams
        yield outputs(
            chat=show(tab, ctx.storage.get_messages(bt.conv_id), ctx),
            status="stopped",
            alts=[],
            busy=False,
        )
        return
    tab.alt_ids = list(bt.stored)
    yield outputs(
        chat=show(tab, ctx.storage.get_messages(bt.conv_id), ctx),
        status="finished",
        radio=conversation_list(ctx, request, bt.conv_id),
        alts=bt.alts,
        picks=range(1, len(bt.stored)),
        busy=False,
    )


async def follow_turn(ctx: ChatContext, request, tab, turn: Turn, shown: list[dict]):
    """Paint a running turn into this tab until it ends, or until the tab shows another chat."""
    tab.following = turn
    ev = turn.wakeup.follow()  # woken by its deltas, its end, and this tab opening another chat
    try:
        last, state, first = -1, None, True
        while not turn.finished:
            if tab.conv_id != turn.conv_id:
                # The user opened another chat: stop painting. A paint of this reply may have
                # reached the page after the new chat did, so the last act is to paint what
                # the tab shows now (the newer chat), never this reply again.
                yield current_view(ctx, request, tab)
                return
            # A state change (queue position, paused by a preemption) repaints even though no
            # token arrived: the status line must say why the reply is not moving.
            now_state = live_state(ctx, turn)
            if turn.version != last or now_state != state:
                last, state = turn.version, now_state
                generating = state == states.live_status(states.GENERATING)
                total = len(turn.toks[0]) if turn.continues is not None else None
                live = view.live_reply(
                    turn.texts[0],
                    turn.admitted,
                    turn.metrics[0] if turn.texts[0] else None,
                    state=None if generating else state,
                    total_tokens=total,
                    split=turn.split(0),
                )
                alts = (
                    [
                        view.alternative_markdown(
                            k,
                            turn.texts[k],
                            turn.metrics[k] if turn.texts[k] else None,
                            turn.admitted,
                            chosen=k == 0,
                            split=turn.split(k),
                        )
                        for k in range(turn.n)
                    ]
                    if turn.n > 1
                    else None
                )
                # Stop replaces Send once, on the first paint: re-sending the same button update with
                # every token only re-renders the button a person is about to click
                yield outputs(
                    chat=shown + [{"role": "assistant", "content": live}],
                    status=state,
                    alts=alts,
                    busy=True if first else None,
                )
                first = False
                await asyncio.sleep(YIELD_S)  # a paint at most every YIELD_S (tokens gather)
                continue
            # no polling: a delta, a state change, the end or a switch wakes it; only a queued
            # reply looks again for its place in the engine's queue
            await Wakeup.wait(ev, None if turn.admitted else QUEUE_REFRESH_S)
        await turn.task
    finally:
        turn.wakeup.leave(ev)
        if tab.following is turn:
            tab.following = None
    if tab.conv_id != turn.conv_id:  # switched just as it ended: same rule as above
        yield current_view(ctx, request, tab)
        return
    if turn.refused is not None:
        yield outputs(
            chat=shown + [{"role": "assistant", "content": view.error_notice(turn.refused)}],
            status=view.error_notice(turn.refused),
            alts=[],
            busy=False,
        )
        return
    if turn.lost:  # deleted meanwhile (#12.14): plain words, nothing raw
        yield outputs(
            chat=shown + [{"role": "assistant", "content": view.deleted_notice()}],
            status=view.deleted_notice(),
            radio=conversation_list(ctx, request, None),
            alts=[],
            busy=False,
        )
        return
    # Normal end: show the stored branch (each reply with its one stats line) and the alternatives,
    # each with a button to continue with it. The status line says the state, not the stats again.
    shown = show(tab, ctx.storage.get_messages(turn.conv_id), ctx)
    if turn.error and not turn.texts[0]:
        shown.append({"role": "assistant", "content": view.error_notice(turn.error)})
    tab.alt_ids = list(turn.stored_ids) if turn.n > 1 else []
    alts = (
        [
            view.alternative_markdown(
                k,
                turn.texts[k],
                turn.stats(k),
                status="complete" if turn.done[k] else "stopped",
                chosen=k == 0,
                split=turn.split(k),
            )
            for k in range(turn.n)
        ]
        if turn.n > 1
        else []
    )
    yield outputs(
        chat=shown,
        status=final_status(turn),
        radio=conversation_list(ctx, request, turn.conv_id),
        alts=alts,
        picks=range(1, len(tab.alt_ids)),
        busy=False,
    )


def final_status(turn: Turn) -> str:
    if turn.status == "error":
        return view.error_notice(turn.error or "error")
    return "stopped" if turn.status == "stopped" else "finished"


def live_state(ctx: ChatContext, turn: Turn) -> str:
    """The status line of a reply still running: queued with its place in the engine's queue until
    admitted; "paused: memory full, resuming…" from the moment the engine's stream says it was
    preempted until its tokens flow again; else generating."""
    if not turn.admitted:
        return states.live_status(states.QUEUED, ctx.tabs.queue_position(turn))
    return states.live_status(states.PAUSED if turn.paused else states.GENERATING)


def current_view(ctx: ChatContext, request, tab) -> tuple:
    conv_id = tab.conv_id
    try:
        path = ctx.storage.get_messages(conv_id, owner=ctx.check(request)) if conv_id else []
    except (KeyError, PermissionError):
        path, conv_id = [], None
    return outputs(
        chat=show(tab, path, ctx),
        status=" ",
        radio=conversation_list(ctx, request, conv_id),
        alts=[],
        busy=ctx.tabs.is_busy(conv_id) if conv_id else False,
    )
