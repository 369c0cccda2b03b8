"""Chat handlers: send, regenerate, edit-and-resend, stop, follow (paint a reply generating in
the chat a tab opens) and the 2 s refresh tick. Async generators, so a waiting stream holds no
worker thread.

The user message is committed before anything is submitted; the reply itself is a `Turn`
(ui/chat/turn.py) owned by its conversation, which stores it. Handlers only paint a turn while
their tab shows its conversation: a click on another chat mid-reply switches the view at once
and the reply finishes into its own chat. Stop or a closed tab (Gradio cancels the handler) ends
the reply of the chat on screen.
"""
from __future__ import annotations

import asyncio
import time

import gradio as gr

from storage import ConversationDeletedError
from ui.chat import limits, view
from ui.chat.context import ChatContext
from ui.chat.turn import Turn, abort_turn, start_turn

YIELD_S = 0.05         # at most ~20 page updates a second per stream
N_OUTPUTS = 5 + view.MAX_ALTERNATIVES   # msg box, chatbot, status, conversation list, alt row, alts


def outputs(msg=None, chat=None, status=None, radio=None, alts=None) -> tuple:
    """One yield of a chat event, with gr.skip() for everything not given."""
    skip = gr.skip()
    out = [skip if msg is None else msg, skip if chat is None else chat,
           skip if status is None else status, skip if radio is None else radio]
    if alts is None:
        out += [skip] * (1 + view.MAX_ALTERNATIVES)
    else:
        out.append(gr.Row(visible=bool(alts)))
        out += [gr.Markdown(value=alts[i], visible=True) if i < len(alts) else gr.Markdown(visible=False)
                for i in range(view.MAX_ALTERNATIVES)]
    return tuple(out)


def conversation_list(ctx: ChatContext, request, selected: str | None):
    rows = ctx.storage.list_conversations(owner=ctx.check(request))
    choices = view.conversation_choices(rows)
    tab = ctx.tab(request)
    tab.list_sig = (tuple(choices), selected)
    return gr.Radio(choices=choices, value=selected)


def show(tab, path: list[dict]) -> list[dict]:
    """The chatbot rows for `path`, recording what the tab now shows (for edits and repaints)."""
    shown, tab.shown_ids = view.display_messages(path)
    tab.view_sig = view_signature(path)
    return shown


def view_signature(path: list[dict]) -> tuple:
    return tuple((m["id"], m["status"], len(m["content"])) for m in path)


async def generate(ctx: ChatContext, request, tab, conv_id: str, user_id: int, kw: dict,
                   sibling_of: int | None = None, first_msg: str | None = None):
    """Start a reply to stored user message `user_id` and paint it while this tab shows its
    conversation. The caller has called tabs.begin(conv_id); the turn always calls tabs.end."""
    st = ctx.storage
    path = view.path_until(st.get_messages(conv_id, through=user_id), user_id)
    messages = view.engine_messages(st.conversation_system_prompt(conv_id), path)
    turn = Turn(conv_id, user_id, kw["n"], cache_salt=ctx.cache_salt(request))
    try:
        start_turn(ctx, turn, messages, kw, sibling_of)
    except BaseException:
        ctx.tabs.end(conv_id)
        raise
    try:
        shown = show(tab, path)
        alts = [view.alternative_markdown(i, "", None, admitted=False) for i in range(turn.n)] if turn.n > 1 else []
        yield outputs(first_msg, shown + [{"role": "assistant", "content": view.QUEUED}],
                      view.QUEUED, conversation_list(ctx, request, conv_id), alts)
        async for out in follow_turn(ctx, request, tab, turn, shown):
            yield out
    except (asyncio.CancelledError, GeneratorExit):
        # Stop, or the tab closed: Gradio cancels this handler. End the reply if this tab still
        # shows it (a tab that moved on has already let go), and wait until it is stored.
        if tab.conv_id == conv_id:
            turn.task.cancel()           # its finally aborts the request and stores the reply
        try:
            await asyncio.wait_for(asyncio.shield(turn.task), 30)
        except Exception:
            pass
        raise


async def follow_turn(ctx: ChatContext, request, tab, turn: Turn, shown: list[dict]):
    """Paint a running turn into this tab until it ends, or until the tab shows another chat."""
    tab.following = turn
    try:
        last = -1
        while not turn.finished:
            if tab.conv_id != turn.conv_id:
                # The user opened another chat: stop painting. A paint of this reply may have
                # reached the page after the new chat did, so the last act is to paint what
                # the tab shows now (the newer chat), never this reply again.
                yield _current_view(ctx, request, tab)
                return
            if turn.version != last:
                last = turn.version
                live = view.live_reply(turn.texts[0], turn.admitted, turn.metrics[0] if turn.texts[0] else None)
                alts = [view.alternative_markdown(k, turn.texts[k], turn.metrics[k] if turn.texts[k] else None,
                                                  turn.admitted) for k in range(turn.n)] if turn.n > 1 else None
                yield outputs(chat=shown + [{"role": "assistant", "content": live}],
                              status="generating…" if turn.admitted else view.QUEUED, alts=alts)
            await asyncio.sleep(YIELD_S)
        await turn.task
    finally:
        if tab.following is turn:
            tab.following = None
    if tab.conv_id != turn.conv_id:        # switched just as it ended: same rule as above
        yield _current_view(ctx, request, tab)
        return
    if turn.refused is not None:
        yield outputs(chat=shown + [{"role": "assistant", "content": view.error_notice(turn.refused)}],
                      status=view.error_notice(turn.refused), alts=[])
        return
    if turn.lost:                          # deleted meanwhile (#12.14): plain words, nothing raw
        yield outputs(chat=shown + [{"role": "assistant", "content": view.deleted_notice()}],
                      status=view.deleted_notice(), radio=conversation_list(ctx, request, None), alts=[])
        return
    # Normal end: show the stored branch (with each reply's stats line) and the final alternatives.
    shown = show(tab, ctx.storage.get_messages(turn.conv_id))
    if turn.error and not turn.texts[0]:
        shown.append({"role": "assistant", "content": view.error_notice(turn.error)})
    line = view.stats_line(turn.stats(0), turn.status)
    if turn.error and turn.texts[0]:       # e.g. a remote backend dropped the stream: say why
        line = f"{line} · {view.error_notice(turn.error)}" if line else view.error_notice(turn.error)
    alts = [view.alternative_markdown(k, turn.texts[k], turn.stats(k), status="complete" if turn.done[k] else "stopped")
            for k in range(turn.n)] if turn.n > 1 else []
    yield outputs(chat=shown, status=line or " ", radio=conversation_list(ctx, request, turn.conv_id), alts=alts)


def _current_view(ctx: ChatContext, request, tab) -> tuple:
    conv_id = tab.conv_id
    try:
        path = ctx.storage.get_messages(conv_id, owner=ctx.check(request)) if conv_id else []
    except (KeyError, PermissionError):
        path, conv_id = [], None
    return outputs(chat=show(tab, path), status=" ", radio=conversation_list(ctx, request, conv_id), alts=[])


async def follow(ctx: ChatContext, request):
    """After a tab opens a conversation: if a reply is being generated in it (started in this tab
    earlier, or in another tab), paint it live here too."""
    tab = ctx.tab(request)
    turn = ctx.tabs.turn(tab.conv_id)
    if turn is None or turn.finished or tab.following is turn:
        yield outputs()
        return
    path = view.path_until(ctx.storage.get_messages(turn.conv_id, through=turn.user_id), turn.user_id)
    async for out in follow_turn(ctx, request, tab, turn, show(tab, path)):
        yield out


def refresh(ctx: ChatContext, query: str | None, request):
    """Timer tick of each tab (every ~2 s): the conversation list and, when this tab is not painting a
    live reply, its chat as stored, each sent only when it changed (other tabs of the same user
    created, renamed or continued a chat)."""
    tab = ctx.tab(request)
    try:
        query = limits.search_query(query)
    except gr.Error:                # refused where it was typed (search); the tick lists all
        query = None
    rows = ctx.storage.list_conversations(owner=ctx.check(request), query=(query or "").strip() or None)
    choices = view.conversation_choices(rows)
    value = tab.conv_id if any(c[1] == tab.conv_id for c in choices) else None
    radio = gr.skip()
    if (tuple(choices), value) != tab.list_sig:
        tab.list_sig = (tuple(choices), value)
        radio = gr.Radio(choices=choices, value=value)
    chat = gr.skip()
    if tab.conv_id is not None and tab.following is None:
        try:
            path = ctx.storage.get_messages(tab.conv_id, owner=ctx.check(request))
        except (KeyError, PermissionError):
            path = None
        if path is not None and view_signature(path) != tab.view_sig:
            chat = show(tab, path)
    return radio, chat


def _busy_notice() -> None:
    gr.Warning("A reply is already being generated in this conversation (in another tab).")


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
    """A new user message at the end of the active branch (a new conversation if none is open)."""
    message = limits.message(view.text_of(message))      # before anything is stored or tokenized
    if not message.strip():
        gr.Info("Type a message first.")
        yield outputs()
        return
    st, tab = ctx.storage, ctx.tab(request)
    conv = _current_conversation(ctx, request, tab)
    system = st.conversation_system_prompt(conv["id"]) if conv else ctx.shared_prompt(request)["text"]
    path = st.get_messages(conv["id"]) if conv else []
    prompt_len = await asyncio.to_thread(      # tokenizing: off the event loop
        ctx.prompt_tokens, view.engine_messages(system, path + [{"role": "user", "content": message}]))
    if prompt_len >= ctx.max_model_len:
        shown, _ = view.display_messages(path)
        notice = view.too_long_notice(prompt_len, ctx.max_model_len)
        yield outputs(chat=shown + [{"role": "user", "content": message}, {"role": "assistant", "content": notice}],
                      status=notice)
        return
    if conv is None:
        conv = st.create_conversation(owner=ctx.owner(request))
        ctx.tabs.open(tab, conv["id"])
    if not ctx.tabs.begin(conv["id"]):
        _busy_notice()
        yield outputs()
        return
    try:
        user = st.add_message(conv["id"], "user", message, owner=ctx.check(request))
    except BaseException as e:
        ctx.tabs.end(conv["id"])
        if isinstance(e, ConversationDeletedError):
            raise gr.Error(view.DELETED_TEXT) from None
        raise
    async for out in generate(ctx, request, tab, conv["id"], user["id"], kw, first_msg=""):
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
    after = path[path.index(last_user) + 1:]
    sibling_of = after[0]["id"] if after and after[0]["role"] == "assistant" else None
    if not ctx.tabs.begin(conv["id"]):
        _busy_notice()
        yield outputs()
        return
    async for out in generate(ctx, request, tab, conv["id"], last_user["id"], kw, sibling_of=sibling_of):
        yield out


async def edit(ctx: ChatContext, index, new_text, kw: dict, request):
    """The user edited a past message in the chat: branch there and resend."""
    st, tab = ctx.storage, ctx.tab(request)
    conv = _current_conversation(ctx, request, tab)
    index = index[0] if isinstance(index, (list, tuple)) else index
    new_text = limits.message(view.text_of(new_text))
    restore = view.display_messages(st.get_messages(conv["id"]))[0] if conv else []
    if conv is None or not isinstance(index, int) or not 0 <= index < len(tab.shown_ids):
        yield outputs(chat=restore)
        return
    old = st.get_message(tab.shown_ids[index], owner=ctx.check(request))
    if old["role"] != "user":
        gr.Info("Only your own messages can be edited.")
        yield outputs(chat=restore)
        return
    if not new_text.strip():
        gr.Info("An edited message cannot be empty.")
        yield outputs(chat=restore)
        return
    path = st.get_messages(conv["id"], through=old["id"])
    before = path[: path.index(next(m for m in path if m["id"] == old["id"]))]
    system = st.conversation_system_prompt(conv["id"])
    prompt_len = await asyncio.to_thread(
        ctx.prompt_tokens, view.engine_messages(system, before + [{"role": "user", "content": new_text}]))
    if prompt_len >= ctx.max_model_len:
        notice = view.too_long_notice(prompt_len, ctx.max_model_len)
        yield outputs(chat=restore, status=notice)
        gr.Warning(notice)
        return
    if not ctx.tabs.begin(conv["id"]):
        _busy_notice()
        yield outputs(chat=restore)
        return
    try:
        user = st.add_sibling(old["id"], new_text, owner=ctx.check(request))
    except BaseException:
        ctx.tabs.end(conv["id"])
        raise
    async for out in generate(ctx, request, tab, conv["id"], user["id"], kw):
        yield out


async def stop(ctx: ChatContext, request):
    """Stop: abort the reply generating in the conversation on screen (queued or running), wait
    for it to be stored, then show the stored branch. The browser also cancels this tab's handler
    (cancels=...), which aborts too; whichever comes first, the result is the same."""
    tab = ctx.tab(request)
    turn = ctx.tabs.turn(tab.conv_id)
    if turn is not None:
        abort_turn(ctx, turn)
    deadline = time.monotonic() + 5
    while tab.conv_id is not None and ctx.tabs.is_busy(tab.conv_id) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if tab.conv_id is None:
        return gr.skip(), " "
    path = ctx.storage.get_messages(tab.conv_id, owner=ctx.check(request))
    shown = show(tab, path)
    last = path[-1] if path else None
    line = view.stats_line(last.get("stats"), last.get("status")) if last and last["role"] == "assistant" else ""
    return shown, line or "stopped"
