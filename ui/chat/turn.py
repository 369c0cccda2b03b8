"""One reply being generated, owned by the conversation, not by the tab that asked for it.

Why a separate object: a Gradio handler belongs to one browser tab and one click. If the handler
also owned the stream, a click on another chat while it streams either kept painting the old
reply over the new chat (the original defect) or, if the handler were cut short, lost the reply.
So a `Turn` runs as its own asyncio task: it submits the request, consumes the engine stream,
stores the reply (created on first text, flushed every couple of seconds, finalised in `finally`)
and records the prompt's exact token ids on the user message. Handlers only *follow* a turn: they
paint it while their tab shows its conversation and stop painting the moment the tab shows
another one, reloads or closes. The turn keeps running and ends in its own conversation
(ui/chat/reattach.py: what ends it).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from engine import SamplingParams
from engine.core.admission import QueueFull
from engine.outputs import STATE_PREEMPTED, STATE_RESUMED, STATE_RUNNING
from engine.text.prepared_prompt import PreparedPrompt
from engine.text.reasoning import ReasoningSplit
from storage import NotFoundError
from ui.chat.reattach import watch_abandoned
from ui.chat.tabs import in_daemon_thread
from ui.chat.wakeup import Wakeup

FLUSH_S = 2.0  # partial replies reach the database at least this often
STAT_KEYS = (
    "prompt_tokens",
    "cached_tokens",
    "cached_blocks",
    "output_tokens",
    "ttft_s",
    "tokens_per_s",
    "spec_accepted_tokens",
    "decode_steps",  # these two with --speculative
    "served_by",
)  # with several --backend replicas


def reply_stats(metrics: dict, finish_reason: str | None) -> dict:
    stats = {k: metrics.get(k) for k in STAT_KEYS if metrics.get(k) is not None}
    if finish_reason:
        stats["finish_reason"] = finish_reason
    return stats


class _Reply:
    """The stored reply of index 0: created on first text, flushed, finalised."""

    def __init__(self, storage, conv_id: str, user_id: int, sibling_of: int | None):
        self.st, self.conv_id, self.user_id, self.sibling_of = storage, conv_id, user_id, sibling_of
        self.id: int | None = None
        self.flushed = 0.0

    def _create(self, text: str, status: str) -> None:
        row = (
            self.st.add_sibling(self.sibling_of, text, status=status)
            if self.sibling_of is not None
            else self.st.add_message(
                self.conv_id, "assistant", text, parent_id=self.user_id, status=status
            )
        )
        self.id, self.flushed = row["id"], time.monotonic()

    def update(self, text: str, force: bool = False) -> None:
        if self.id is None:
            if text:
                self._create(text, "stopped")  # a crash mid-stream leaves it honestly "stopped"
        elif force or time.monotonic() - self.flushed >= FLUSH_S:
            self.st.update_message(self.id, content=text)
            self.flushed = time.monotonic()

    def finish(self, text: str, token_ids: list[int], status: str, stats: dict) -> None:
        if self.id is None and not text and not token_ids:
            return  # stopped before the first token: nothing to keep
        if self.id is None:
            self._create(text or "", status)  # empty text but tokens (e.g. only EOS): keep the row
        self.st.update_message(self.id, content=text, token_ids=token_ids, status=status)
        if stats:
            self.st.add_reply_stats(self.id, **stats)


@dataclass(eq=False)
class Turn:
    """The live state of one generation; read by every tab that shows its conversation."""

    conv_id: str
    user_id: int
    n: int
    rid: str = field(default_factory=lambda: f"chat-{uuid.uuid4().hex[:12]}")
    texts: list = field(default_factory=list)
    toks: list = field(default_factory=list)
    metrics: list = field(default_factory=list)
    reasons: list = field(default_factory=list)
    done: list = field(default_factory=list)
    admitted: bool = False
    error: str | None = None  # the engine ended the request with an error
    refused: str | None = None  # the engine refused the prompt (ValueError): nothing ran
    lost: bool = False  # the conversation was deleted meanwhile: the reply is not saved
    status: str | None = None  # final stored status: complete / stopped / error
    version: int = 0  # bumped on every delta, so followers repaint only on change
    cache_salt: str | None = None  # per-user prefix-cache salt under --auth (#12.2)
    tenant: str | None = None  # who the fair scheduler serves (engine/core/fairness.py): the user
    submitted: object = None  # Future of the submit call
    task: asyncio.Task | None = None
    created: float = field(default_factory=time.monotonic)  # queue order among chat turns
    last_delta: float = field(default_factory=time.time)  # unix time of the last delta
    stored_ids: list = field(default_factory=list)  # stored message id of each alternative
    paused_outputs: set = field(
        default_factory=set
    )  # outputs preempted and not producing tokens again yet
    preemptions: int = 0  # how often the engine took this reply's memory (its stream said so)
    continues: dict | None = (
        None  # Continue: the stored reply this turn extends (same message, same branch)
    )
    abandoned: bool = False  # aborted by the idle timeout: no tab showed it (ui/chat/reattach.py)
    thinking: bool | None = None  # the chat's "Think" switch (None: the template's default)
    reasoning: ReasoningSplit | None = None  # a thinking model's split rule for this reply
    stopping: bool = False  # Stop or the idle timeout asked the engine to end it
    watchdog: asyncio.Task | None = None
    wakeup: Wakeup = field(default_factory=Wakeup)  # the tabs painting it (ui/chat/wakeup.py)

    def __post_init__(self):
        self.texts, self.toks = [""] * self.n, [[] for _ in range(self.n)]
        self.metrics, self.reasons, self.done = (
            [{} for _ in range(self.n)],
            [None] * self.n,
            [False] * self.n,
        )
        if self.continues is not None:  # the reply so far is where this turn starts
            self.texts[0], self.toks[0] = (
                self.continues["content"],
                list(self.continues["token_ids"]),
            )

    @property
    def finished(self) -> bool:
        return self.task is not None and self.task.done()

    @property
    def paused(self) -> bool:
        """The engine preempted an output of this reply and no token has come since: the page
        says "paused: memory full, resuming…" (also while it is recomputing after "resumed")."""
        return bool(self.paused_outputs)

    def note_state(self, d) -> None:
        """Record what a delta says about the request's life: admitted, preempted, resumed."""
        state = (d.metrics or {}).get("state")
        self.admitted = (
            self.admitted
            or state in (STATE_RUNNING, STATE_PREEMPTED, STATE_RESUMED)
            or bool(d.token_ids)
        )
        if state == STATE_PREEMPTED:
            self.paused_outputs.add(d.index)
            self.preemptions += 1
        elif d.token_ids or d.finished:
            self.paused_outputs.discard(d.index)

    def split(self, i: int = 0):
        """Output i so far as reasoning + answer (engine/text/reasoning.Split), or None for a model
        that does not think."""
        if self.reasoning is None:
            return None
        return self.reasoning.split(self.texts[i], self.toks[i])

    def stats(self, i: int = 0) -> dict:
        stats = reply_stats(self.metrics[i], self.reasons[i])
        sp = self.split(i)
        if sp is not None and sp.reasoning is not None:  # stored: the fold after a reload
            stats["reasoning_tokens"] = sp.reasoning_tokens
        return stats


def start_turn(
    ctx,
    turn: Turn,
    messages: list[dict],
    kw: dict,
    sibling_of: int | None,
    *,
    previous_ids: list[int] | None = None,
    prepared: PreparedPrompt | None = None,
) -> Turn:
    """Run `turn` as a task of the running event loop. The caller has called tabs.begin(conv_id);
    the task always calls tabs.end(conv_id). The turn takes what its handler already has, and
    reads none of it again: `messages` (the prompt's conversation), `previous_ids` (the exact ids
    of the turn before: previous_ids(path)) and `prepared` (the prompt the handler counted,
    engine/text/prepared_prompt.py; None: submit_chat renders it, in the submit thread)."""
    ctx.tabs.attach(turn)
    loop = asyncio.get_running_loop()
    turn.task = loop.create_task(_run(ctx, turn, messages, kw, sibling_of, previous_ids, prepared))
    turn.task.add_done_callback(lambda _task: turn.wakeup.wake())  # followers see it end
    # the reply outlives its page (ui/chat/reattach.py); only a reply nobody watches times out
    turn.watchdog = loop.create_task(watch_abandoned(ctx, turn, ctx.abandon_s))
    return turn


async def _run(
    ctx,
    turn: Turn,
    messages: list[dict],
    kw: dict,
    sibling_of: int | None,
    previous: list[int] | None = None,
    prepared: PreparedPrompt | None = None,
) -> None:
    llm, st = ctx.llm, ctx.storage
    reply = _Reply(st, turn.conv_id, turn.user_id, sibling_of)
    first_prompt = None
    try:
        if turn.continues is not None:
            # Continue: the prompt is the exact ids of the reply's prompt + the reply itself, so
            # the parked session blocks are reused and the reply grows as if never interrupted
            reply.id = turn.continues["id"]
            first_prompt = st.get_message(turn.user_id)["token_ids"]
            prompt = first_prompt + list(turn.continues["token_ids"])
            turn.submitted = in_daemon_thread(
                llm.submit_continue,
                prompt,
                SamplingParams(**kw),
                messages,
                session_id=turn.conv_id,
                request_id=turn.rid,
                cache_salt=turn.cache_salt,
                tenant=turn.tenant,
            )
        else:
            extra = {"thinking": turn.thinking} if turn.thinking is not None else {}
            if prepared is not None:
                extra["prepared"] = prepared
            turn.submitted = in_daemon_thread(
                llm.submit_chat,
                messages,
                SamplingParams(**kw),
                session_id=turn.conv_id,
                request_id=turn.rid,
                previous_ids=previous,
                cache_salt=turn.cache_salt,
                tenant=turn.tenant,
                **extra,
            )
        try:
            stream = await asyncio.wrap_future(turn.submitted)
        except ValueError as e:  # e.g. longer than max_model_len: the engine is untouched
            turn.submitted, turn.refused = None, str(e)
            return
        except QueueFull as e:  # over an admission bound (--max-queued-requests ...): say so
            turn.submitted, turn.refused = (
                None,
                (
                    f"Server busy, your message was not queued: {e}. "
                    f"Try again in about {e.retry_after_s} s."
                ),
            )
            return
        if (
            turn.stopping
        ):  # Stop came before the request existed (its abort found nothing): end it now
            ctx.tabs.abort(turn.rid, turn.submitted)
        prompt_ids = stream.prompt_ids
        if prompt_ids is not None and turn.continues is None:  # exact ids of this turn's prompt
            st.update_message(turn.user_id, token_ids=list(prompt_ids))
        # a continued reply splits from its first prompt (the reply so far is part of its text)
        opened_by = first_prompt if turn.continues is not None else prompt_ids
        turn.reasoning = reasoning_rule(llm, opened_by or [])
        async for d in stream:
            i = d.index
            turn.note_state(d)
            turn.texts[i] += d.text
            turn.toks[i].extend(d.token_ids)
            turn.metrics[i] = d.metrics or turn.metrics[i]
            turn.last_delta = time.time()
            if d.finished:
                turn.done[i], turn.reasons[i] = True, d.finish_reason
                turn.error = turn.error or d.error
            if i == 0:
                reply.update(turn.texts[0])
            turn.version += 1
            turn.wakeup.wake()
    except NotFoundError:  # deleted in another window or process: stop, say so (#12.14)
        turn.lost = True
    finally:
        turn.status = (
            "error"
            if turn.error or turn.reasons[0] == "error"
            else "complete"
            if turn.done[0] and turn.reasons[0] in ("stop", "length")
            else "stopped"
        )
        try:
            if turn.refused is None and not turn.lost:
                reply.finish(turn.texts[0], turn.toks[0], turn.status, turn.stats(0))
                turn.stored_ids = [reply.id] if reply.id is not None else []
                if turn.submitted is not None:  # the session now holds this reply's branch
                    ctx.tabs.held_by_session(turn.conv_id, reply.id)
                if reply.id is not None and turn.n > 1:
                    _store_alternatives(st, turn, reply.id)
        except NotFoundError:
            turn.lost = True
        finally:
            ctx.tabs.end(turn.conv_id, None if all(turn.done) else turn.rid, turn.submitted, turn)
            turn.version += 1


def reasoning_rule(llm, prompt_ids) -> ReasoningSplit | None:
    """How this model's replies split into reasoning and answer (None: it does not think, or it is
    a remote engine without a tokenizer here)."""
    markers = tuple(llm.model_info().reasoning_markers or ())
    tok = llm.get_tokenizer() if markers else None
    return ReasoningSplit.of(tok, markers, list(prompt_ids)) if tok is not None else None


def _store_alternatives(st, turn: Turn, first_id: int) -> None:
    """Alternatives 2..n are stored as versions (siblings) of the first reply, each with its own
    ids and stats, so `< k/n >` browses them and picking one is a branch switch. The first one
    stays on screen until the user picks another."""
    for i in range(1, turn.n):
        if not turn.texts[i] and not turn.toks[i]:
            continue
        status = "complete" if turn.done[i] and turn.reasons[i] in ("stop", "length") else "stopped"
        row = st.add_sibling(first_id, turn.texts[i], token_ids=turn.toks[i], status=status)
        stats = turn.stats(i)
        if stats:
            st.add_reply_stats(row["id"], **stats)
        turn.stored_ids.append(row["id"])
    st.select_branch(first_id)


def _previous_ids(st, conv_id: str, user_id: int) -> list[int] | None:
    """previous_ids of the branch before stored message `user_id`, read from storage (a turn gets
    them from its handler's one read instead)."""
    path = st.get_messages(conv_id, through=user_id)
    return previous_ids(path[: [m["id"] for m in path].index(user_id)])


def previous_ids(before: list[dict]) -> list[int] | None:
    """The exact token ids the engine saw up to the reply that ends `before` (the branch before a
    new user message): its prompt + reply, as stored; None when they were not recorded (older
    rows, or the first turn)."""
    if len(before) < 2 or before[-1]["role"] != "assistant" or before[-2]["role"] != "user":
        return None
    prompt, reply = before[-2]["token_ids"], before[-1]["token_ids"]
    if not prompt or reply is None:
        return None
    return list(prompt) + list(reply)


def abort_turn(ctx, turn: Turn) -> None:
    """Stop generating (queued or running); the task then stores the reply as stopped. `turn` is a
    Turn or a beam search (ui/chat/beam.BeamTurn): both end by their request id."""
    if not turn.finished:
        turn.stopping = True
        ctx.tabs.abort(turn.rid, turn.submitted)
