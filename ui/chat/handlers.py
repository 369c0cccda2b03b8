"""Chat handlers: send, regenerate, edit-and-resend, stop, follow (paint a reply generating in
the chat a tab opens) and the 2 s refresh tick. Async generators, so a waiting stream holds no
worker thread.

The user message is committed before anything is submitted; the reply itself is a `Turn`
(ui/chat/turn.py; a beam search: a `BeamTurn`, ui/chat/beam.py) owned by its conversation, which
stores it. Handlers only paint a turn while their tab shows its conversation: a click on another
chat mid-reply switches the view at once and the reply finishes into its own chat. A reload or a
closed tab only stops painting: the reply keeps generating on the server and a tab that opens the
chat again reattaches (`follow`). Stop is what ends a reply (and, for a reply nobody watches, the
idle timeout of ui/chat/reattach.py). How a reply is painted into a tab (the yields, the
streams that follow a turn) is ui/chat/painting.py.
"""

from __future__ import annotations

import asyncio
import time

import gradio as gr

from engine.protocol import ContinuesReplies
from storage import ConversationDeletedError
from ui.chat.edit_text import typed_text
from ui.chat import beam, limits, states, view
from ui.chat.context import ChatContext
from ui.chat.painting import (
    conversation_list,
    eos_ids,
    follow_beam,
    follow_turn,
    generate,
    list_radio,
    outputs,
    show,
    view_signature,
)
from ui.chat.turn import Turn, abort_turn, previous_ids, start_turn

# a chat event's outputs: msg box, chatbot, status, conversation list, alt row, alts, pick buttons, send, stop
ONE_AT_A_TIME = (
    "One reply at a time: a reply is already being generated in this chat. Your message is kept "
    "in the box; send it when the reply ends, or press Stop (Esc)."
)


async def follow(ctx: ChatContext, request):
    """After a tab opens a conversation: if a reply is being generated in it (started in this tab
    earlier, or in another tab), paint it live here too; a beam search paints "searching", then
    its beams."""
    tab = ctx.tab(request)
    turn = ctx.tabs.turn(tab.conv_id)
    if turn is None or turn.finished or tab.following is turn:
        yield outputs()
        return
    path = view.path_until(
        ctx.storage.get_messages(turn.conv_id, through=turn.user_id), turn.user_id
    )
    painter = follow_beam if isinstance(turn, beam.BeamTurn) else follow_turn
    async for out in painter(ctx, request, tab, turn, show(tab, path, ctx)):
        yield out


def refresh(ctx: ChatContext, query: str | None, request):
    """Timer tick of each tab (every ~2 s): the conversation list and, when this tab is not painting a
    live reply, its chat as stored, each sent only when it changed (other tabs of the same user
    created, renamed or continued a chat)."""
    tab = ctx.tab(request)
    try:
        query = limits.search_query(query)
    except gr.Error:  # refused where it was typed (search); the tick lists all
        query = None
    query = (query or "").strip() or None
    rows = ctx.storage.list_conversations(owner=ctx.check(request), query=query)
    choices = view.conversation_choices(rows)
    value = tab.conv_id if any(c[1] == tab.conv_id for c in choices) else None
    radio = gr.skip()
    if (tuple(choices), value, query) != tab.list_sig:
        tab.list_sig = (tuple(choices), value, query)
        radio = list_radio(choices, value, query)
    chat = gr.skip()
    if tab.conv_id is not None and tab.following is None:
        try:
            path = ctx.storage.get_messages(tab.conv_id, owner=ctx.check(request))
        except (KeyError, PermissionError):
            path = None
        if (
            path is not None
            and view_signature(path, ctx.storage.branch_versions(tab.conv_id)) != tab.view_sig
        ):
            chat = show(tab, path, ctx)
    return radio, chat


def _busy_notice() -> None:
    gr.Warning(ONE_AT_A_TIME)


def _current_conversation(ctx: ChatContext, request, tab):
    """The tab's conversation row, or None (new chat, or deleted meanwhile)."""
    if tab.conv_id is None:
        return None
    try:
        return ctx.storage.get_conversation(tab.conv_id, owner=ctx.check(request))
    except (KeyError, PermissionError):
        ctx.tabs.open(tab, None)
        return None


async def send(ctx: ChatContext, message: str, kw: dict, request):
    """A new user message at the end of the active branch (a new conversation if none is open).

    One pass (issue 46.5): the branch is read once, here, after the chat is marked busy (so no
    reply can end and change it meanwhile); the prompt is rendered and tokenized once
    (`prepare_chat`), its length checked, and the same prompt goes to the turn and the engine."""
    message = limits.message(view.text_of(message))  # before anything is stored or tokenized
    if not message.strip():
        gr.Info("Type a message first.")
        yield outputs()
        return
    st, tab = ctx.storage, ctx.tab(request)
    conv = _current_conversation(ctx, request, tab)
    if conv is not None and not ctx.tabs.begin(conv["id"]):
        _busy_notice()  # the message stays in the box; the status line says why
        yield outputs(status=ONE_AT_A_TIME)
        return
    try:
        system = (
            st.conversation_system_prompt(conv["id"])
            if conv
            else ctx.shared_prompt(request)["text"]
        )
        path = st.get_messages(conv["id"]) if conv else []
        prepared = await asyncio.to_thread(  # tokenizing: off the event loop
            ctx.llm.prepare_chat,
            view.engine_messages(system, path + [{"role": "user", "content": message}]),
            previous_ids=previous_ids(path),
            session_id=conv["id"] if conv else None,
            thinking=kw.get("thinking"),
        )
        too_long = prepared.num_tokens >= ctx.max_model_len
        if too_long and conv is not None:
            ctx.tabs.end(conv["id"])
    except BaseException:
        if conv is not None:
            ctx.tabs.end(conv["id"])
        raise
    if too_long:
        shown = show(tab, path, ctx)
        notice = view.too_long_notice(prepared.num_tokens, ctx.max_model_len)
        yield outputs(
            chat=shown
            + [{"role": "user", "content": message}, {"role": "assistant", "content": notice}],
            status=notice,
        )
        return
    try:
        if conv is None:
            conv = st.create_conversation(owner=ctx.owner(request))
            ctx.tabs.open(tab, conv["id"])
            ctx.tabs.begin(conv["id"])  # new: nobody else can be generating in it
        ctx.remember_thinking(conv["id"], kw.get("thinking"), request)
        user = st.add_message(conv["id"], "user", message, owner=ctx.check(request))
    except BaseException as e:
        if conv is not None:
            ctx.tabs.end(conv["id"])
        if isinstance(e, ConversationDeletedError):
            raise gr.Error(view.DELETED_TEXT) from None
        raise
    async for out in generate(
        ctx, request, tab, conv["id"], path + [user], kw, first_msg="", prepared=prepared
    ):
        yield out


async def regenerate(ctx: ChatContext, kw: dict, request):
    """A new version of the last reply (a sibling branch; the old one stays in the database)."""
    st, tab = ctx.storage, ctx.tab(request)
    conv = _current_conversation(ctx, request, tab)
    path = st.get_messages(conv["id"]) if conv else []
    last_user = next((m for m in reversed(path) if m["role"] == "user"), None)
    if last_user is None:
        gr.Info("Nothing to regenerate yet.")
        yield outputs()
        return
    after = path[path.index(last_user) + 1 :]
    sibling_of = after[0]["id"] if after and after[0]["role"] == "assistant" else None
    if not ctx.tabs.begin(conv["id"]):
        _busy_notice()
        yield outputs()
        return
    try:
        ctx.remember_thinking(conv["id"], kw.get("thinking"), request)
    except BaseException:
        ctx.tabs.end(conv["id"])
        raise
    async for out in generate(
        ctx, request, tab, conv["id"], path[: path.index(last_user) + 1], kw, sibling_of=sibling_of
    ):
        yield out


CONTINUE_NOTHING = "Nothing to continue: the last message on screen is not a stored reply."
CONTINUE_COMPLETE = (
    "This reply is complete (the model ended its turn); there is nothing to continue."
)
CONTINUE_UNSUPPORTED = (
    "Continue runs only on the built-in engine; this app serves a remote backend (--backend), "
    "which cannot extend a stored reply in place."
)


async def continue_reply(ctx: ChatContext, kw: dict, request):
    """Continue: extend the last reply on screen (stopped, or cut by max tokens) in place: same
    stored message, same branch; the request's prompt is the reply's exact prompt ids + its own
    ids, so its blocks are reused (ui/chat/turn.py, LLM.submit_continue)."""
    st, tab = ctx.storage, ctx.tab(request)
    conv = _current_conversation(ctx, request, tab)
    path = st.get_messages(conv["id"]) if conv else []
    last = path[-1] if path else None
    user = path[-2] if len(path) >= 2 else None
    if (
        last is None
        or last["role"] != "assistant"
        or not last.get("token_ids")
        or user is None
        or not user.get("token_ids")
    ):
        gr.Info(CONTINUE_NOTHING)
        yield outputs(status=CONTINUE_NOTHING)
        return
    if not isinstance(ctx.llm, ContinuesReplies):
        gr.Info(CONTINUE_UNSUPPORTED)
        yield outputs(status=CONTINUE_UNSUPPORTED)
        return
    if last["token_ids"][-1] in eos_ids(ctx):
        gr.Info(CONTINUE_COMPLETE)
        yield outputs(status=CONTINUE_COMPLETE)
        return
    kw = {**kw, "n": 1}
    kw.pop("beam_width", None)
    kw.pop("thinking", None)  # the reply's prompt is rendered already: its ids as is
    if not ctx.tabs.begin(conv["id"]):
        _busy_notice()
        yield outputs()
        return
    conv_id = conv["id"]
    messages = view.engine_messages(st.conversation_system_prompt(conv_id), path[:-1])
    turn = Turn(
        conv_id,
        user["id"],
        1,
        cache_salt=ctx.cache_salt(request),
        continues=last,
        tenant=ctx.tenant(request),
    )
    try:
        start_turn(ctx, turn, messages, kw, None)
    except BaseException:
        ctx.tabs.end(conv_id)
        raise
    try:
        shown = show(tab, path[:-1], ctx)
        tab.alt_ids = []
        yield outputs(
            None,
            shown + [{"role": "assistant", "content": view.live_reply(turn.texts[0], True)}],
            states.live_status(states.GENERATING),
            conversation_list(ctx, request, conv_id),
            [],
            busy=True,
        )
        async for out in follow_turn(ctx, request, tab, turn, shown):
            yield out
    except (asyncio.CancelledError, GeneratorExit):
        # As in `generate`: a continued reply belongs to the server too. A reload or a closed tab
        # only stops painting it; Stop (and the idle timeout) ends it; `follow` reattaches.
        raise


async def edit(ctx: ChatContext, index, new_text, kw: dict, request):
    """The user edited a past message in the chat: branch there and resend."""
    st, tab = ctx.storage, ctx.tab(request)
    conv = _current_conversation(ctx, request, tab)
    index = index[0] if isinstance(index, (list, tuple)) else index
    new_text = limits.message(view.text_of(new_text))
    branch = st.get_messages(conv["id"]) if conv else []  # the one read of the branch
    restore = show(tab, branch, ctx) if conv else []
    shown_ids = list(tab.shown_ids)
    if conv is None or not isinstance(index, int) or not 0 <= index < len(shown_ids):
        yield outputs(chat=restore)
        return
    old = st.get_message(shown_ids[index], owner=ctx.check(request))
    new_text = typed_text(
        new_text, old["content"]
    )  # the edit box started from the safe display form
    if old["role"] != "user":
        gr.Info("Only your own messages can be edited.")
        yield outputs(chat=restore)
        return
    if not new_text.strip():
        gr.Info("An edited message cannot be empty.")
        yield outputs(chat=restore)
        return
    before = branch[: next(i for i, m in enumerate(branch) if m["id"] == old["id"])]  # old: on it
    system = st.conversation_system_prompt(conv["id"])
    prepared = await asyncio.to_thread(
        ctx.llm.prepare_chat,
        view.engine_messages(system, before + [{"role": "user", "content": new_text}]),
        previous_ids=previous_ids(before),
        session_id=conv["id"],
        thinking=kw.get("thinking"),
    )
    if prepared.num_tokens >= ctx.max_model_len:
        notice = view.too_long_notice(prepared.num_tokens, ctx.max_model_len)
        yield outputs(chat=restore, status=notice)
        gr.Warning(notice)
        return
    if not ctx.tabs.begin(conv["id"]):
        _busy_notice()
        yield outputs(chat=restore)
        return
    try:
        ctx.remember_thinking(conv["id"], kw.get("thinking"), request)
        user = st.add_sibling(old["id"], new_text, owner=ctx.check(request))
    except BaseException:
        ctx.tabs.end(conv["id"])
        raise
    async for out in generate(
        ctx, request, tab, conv["id"], before + [user], kw, prepared=prepared
    ):
        yield out


async def stop(ctx: ChatContext, request):
    """Stop: abort the reply generating in the conversation on screen (queued or running), wait
    for it to be stored, then show the stored branch.

    A Stop pressed the moment after Send can arrive before the send handler has started its turn
    (the chat is already busy, the turn not yet registered): so while the chat stays busy, any turn
    that appears is aborted too. The send handler is not cancelled by the browser: it paints the
    stopped reply itself and ends (a Gradio cancel that raced the handler's start left "Error"
    badges on its outputs in a CI run, over a reply that had stopped fine)."""
    tab = ctx.tab(request)
    conv_id = tab.conv_id
    deadline, aborted = time.monotonic() + 5, None
    while conv_id is not None and time.monotonic() < deadline:
        turn = ctx.tabs.turn(conv_id)
        if turn is not None and turn is not aborted:
            abort_turn(ctx, turn)
            aborted = turn
        if not ctx.tabs.is_busy(conv_id):
            break
        await asyncio.sleep(0.05)
    if tab.conv_id is None:
        return gr.skip(), " ", gr.Button(visible=True), gr.Button(visible=False)
    shown = show(tab, ctx.storage.get_messages(tab.conv_id, owner=ctx.check(request)), ctx)
    return shown, "stopped", gr.Button(visible=True), gr.Button(visible=False)
