"""Streaming chat handlers: send, regenerate, edit-and-resend. Async generators, so a waiting
stream holds no worker thread; each awaits its engine stream and yields the page's new state.

Every turn: the user message is committed before the request is submitted; the reply row is
created when its first text arrives, flushed every couple of seconds, and finalised (text,
token ids, status, stats) in `finally` — on completion, on Stop and on tab close alike. The same
`finally` aborts the request if it is still running and releases the engine session when no tab
shows the conversation any more.
"""
from __future__ import annotations

import asyncio
import time
import uuid

import gradio as gr

from engine import SamplingParams
from ui import chat_view as view
from ui.chat_context import ChatContext
from ui.chat_tabs import in_daemon_thread

FLUSH_S = 2.0          # partial replies reach the database at least this often
YIELD_S = 0.05         # at most ~20 page updates a second per stream
STAT_KEYS = ("prompt_tokens", "cached_tokens", "output_tokens", "ttft_s", "tokens_per_s")
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
    return gr.Radio(choices=view.conversation_choices(rows), value=selected)


def reply_stats(metrics: dict, finish_reason: str | None) -> dict:
    stats = {k: metrics.get(k) for k in STAT_KEYS if metrics.get(k) is not None}
    if finish_reason:
        stats["finish_reason"] = finish_reason
    return stats


class _Reply:
    """The stored reply of index 0: created on first text, flushed, finalised."""

    def __init__(self, ctx: ChatContext, conv_id: str, user_id: int, sibling_of: int | None):
        self.ctx, self.conv_id, self.user_id, self.sibling_of = ctx, conv_id, user_id, sibling_of
        self.id: int | None = None
        self.flushed = 0.0

    def update(self, text: str, force: bool = False) -> None:
        st = self.ctx.storage
        if self.id is None:
            if not text:
                return
            row = (st.add_sibling(self.sibling_of, text, status="stopped") if self.sibling_of is not None
                   else st.add_message(self.conv_id, "assistant", text, parent_id=self.user_id, status="stopped"))
            self.id, self.flushed = row["id"], time.monotonic()
        elif force or time.monotonic() - self.flushed >= FLUSH_S:
            st.update_message(self.id, content=text)
            self.flushed = time.monotonic()

    def finish(self, text: str, token_ids: list[int], status: str, stats: dict) -> None:
        if self.id is None and not text and not token_ids:
            return                       # stopped before the first token: nothing to keep
        if self.id is None:
            self.update(text or "", force=True)
            if self.id is None:          # empty text but tokens (e.g. only EOS): keep the row
                row = (self.ctx.storage.add_sibling(self.sibling_of, "", status=status)
                       if self.sibling_of is not None else
                       self.ctx.storage.add_message(self.conv_id, "assistant", "", parent_id=self.user_id,
                                                    status=status))
                self.id = row["id"]
        self.ctx.storage.update_message(self.id, content=text, token_ids=token_ids, status=status)
        if stats:
            self.ctx.storage.add_reply_stats(self.id, **stats)


async def generate(ctx: ChatContext, request, tab, conv_id: str, user_id: int, kw: dict,
                   sibling_of: int | None = None, first_msg: str | None = None):
    """Stream a reply to stored user message `user_id`. The caller has called tabs.begin(conv_id);
    this generator always calls tabs.end(conv_id)."""
    llm, st = ctx.llm, ctx.storage
    n = kw["n"]
    rid = f"chat-{uuid.uuid4().hex[:12]}"
    submitted = None
    done = [False] * n
    reply = _Reply(ctx, conv_id, user_id, sibling_of)
    texts, toks, metrics, reasons = [""] * n, [[] for _ in range(n)], [{} for _ in range(n)], [None] * n
    error = None
    try:
        path = view.path_until(st.get_messages(conv_id, through=user_id), user_id)
        messages = view.engine_messages(st.conversation_system_prompt(conv_id), path)
        shown, tab.shown_ids = view.display_messages(path)
        alts = [view.alternative_markdown(i, "", None, admitted=False) for i in range(n)] if n > 1 else []
        yield outputs(first_msg, shown + [{"role": "assistant", "content": view.QUEUED}],
                      view.QUEUED, conversation_list(ctx, request, conv_id), alts)
        tab.request_id = rid
        submitted = in_daemon_thread(llm.submit_chat, messages, SamplingParams(**kw),
                                     session_id=conv_id, request_id=rid)
        try:
            stream = await asyncio.wrap_future(submitted)
        except ValueError as e:          # e.g. longer than max_model_len: the engine is untouched
            submitted = None
            yield outputs(chat=shown + [{"role": "assistant", "content": view.error_notice(str(e))}],
                          status=view.error_notice(str(e)), alts=[])
            return
        admitted, last_yield = False, 0.0
        async for d in stream:
            i = d.index
            admitted = admitted or d.metrics.get("state") == "running" or bool(d.token_ids)
            texts[i] += d.text
            toks[i].extend(d.token_ids)
            metrics[i] = d.metrics or metrics[i]
            if d.finished:
                done[i], reasons[i] = True, d.finish_reason
                error = error or d.error
            if i == 0:
                reply.update(texts[0])
            now = time.monotonic()
            if now - last_yield >= YIELD_S or all(done):
                last_yield = now
                live = view.live_reply(texts[0], admitted, metrics[0] if texts[0] else None)
                status = ("generating…" if admitted else view.QUEUED)
                alts = [view.alternative_markdown(k, texts[k], metrics[k] if texts[k] else None, admitted)
                        for k in range(n)] if n > 1 else None
                yield outputs(chat=shown + [{"role": "assistant", "content": live}], status=status, alts=alts)
    finally:
        if tab.request_id == rid:
            tab.request_id = None
        status = ("error" if error or reasons[0] == "error" else
                  "complete" if done[0] and reasons[0] in ("stop", "length") else "stopped")
        try:
            reply.finish(texts[0], toks[0], status, reply_stats(metrics[0], reasons[0]))
        finally:
            ctx.tabs.end(conv_id, None if all(done) else rid, submitted)
    # Normal end: show the stored branch (with each reply's stats line) and the final alternatives.
    path = st.get_messages(conv_id)
    shown, tab.shown_ids = view.display_messages(path)
    if error and not texts[0]:
        shown.append({"role": "assistant", "content": view.error_notice(error)})
    line = view.stats_line(reply_stats(metrics[0], reasons[0]), status)
    alts = [view.alternative_markdown(k, texts[k], reply_stats(metrics[k], reasons[k]),
                                      status="complete" if done[k] else "stopped")
            for k in range(n)] if n > 1 else []
    yield outputs(chat=shown, status=line or " ", radio=conversation_list(ctx, request, conv_id), alts=alts)


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
    message = view.text_of(message)
    if not message.strip():
        gr.Info("Type a message first.")
        yield outputs()
        return
    st, tab = ctx.storage, ctx.tab(request)
    conv = _current_conversation(ctx, request, tab)
    system = st.conversation_system_prompt(conv["id"]) if conv else st.get_system_prompt()["text"]
    path = st.get_messages(conv["id"]) if conv else []
    prompt_len = ctx.prompt_tokens(view.engine_messages(system, path + [{"role": "user", "content": message}]))
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
    except BaseException:
        ctx.tabs.end(conv["id"])
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
    new_text = view.text_of(new_text)
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
    prompt_len = ctx.prompt_tokens(view.engine_messages(system, before + [{"role": "user", "content": new_text}]))
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
    """Stop: abort this tab's request in the engine (queued or running), wait for its handler to
    store the partial reply, then show the stored branch. The browser also cancels the handler
    (cancels=...), whose `finally` aborts too; whichever comes first, the result is the same."""
    tab = ctx.tab(request)
    if tab.request_id is not None:
        ctx.tabs.abort(tab.request_id)
    deadline = time.monotonic() + 5
    while tab.conv_id is not None and ctx.tabs.is_busy(tab.conv_id) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if tab.conv_id is None:
        return gr.skip(), " "
    path = ctx.storage.get_messages(tab.conv_id)
    shown, tab.shown_ids = view.display_messages(path)
    last = path[-1] if path else None
    line = view.stats_line(last.get("stats"), last.get("status")) if last and last["role"] == "assistant" else ""
    return shown, line or "stopped"
