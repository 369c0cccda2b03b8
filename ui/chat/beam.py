"""A chat reply by beam search: the k best continuations shown side by side like n alternatives,
all k stored as versions of the reply, the first on screen until the user picks another.

Why not a `Turn`: the engine's beam search (engine/core/beam_search.py, LLM.submit_beam_search) does
not stream text; it returns the k sequences at once. So a search is a `BeamTurn`: one wait (the page
shows "searching"), then store and paint once. It belongs to the server like a Turn (issue 26.1,
ui/chat/reattach.py): it runs as its own task, a reload or a closed tab only stops the painting, a
tab that opens the chat again shows "searching" and then the beams, and Stop (or the idle timeout)
aborts it in the engine by its request id. The beams share the prompt's blocks and fork
copy-on-write inside the engine; the UI only sees the result.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field

from engine import BeamSearchParams
from engine.text.chat_tokens import encode_chat
from engine.kv.salt_rule import prompt_salt
from storage import NotFoundError
from ui.chat import view
from ui.chat.reattach import watch_abandoned
from ui.chat.wakeup import Wakeup
from ui.chat.tabs import in_daemon_thread

_WIDTH = re.compile(r"beam search \(width (\d+)\)")
SAMPLE = "sample"
CHOICES = [SAMPLE] + [f"beam search (width {k})" for k in range(2, view.MAX_ALTERNATIVES + 1)]


def beam_width(choice: str | None) -> int:
    """The decoding choice of the sampling settings -> beam width (0: ordinary sampling)."""
    m = _WIDTH.fullmatch(str(choice or "").strip())
    return int(m.group(1)) if m else 0


def prompt_ids(llm, messages: list[dict]) -> list[int]:
    """The chat's prompt as token ids (the chat template with the assistant's turn opened), through
    the one safe chat tokenizer: a typed `<|im_start|>` stays text (#29.3). Rendering the template
    to text and encoding that made it a real special token, and the stored ids then carried it
    into every later turn of the chat."""
    return encode_chat(llm.get_tokenizer(), messages)


def store(st, user_id: int, conv_id: str, ids: list[int], out) -> list[int]:
    """All k beams as versions of one reply (best first); the best one stays on screen."""
    st.update_message(user_id, token_ids=list(ids))
    stored = []
    for seq in out.sequences:
        # no prompt/cache counts: the search runs outside the chat session, its cache hits are not reported
        stats = {"output_tokens": len(seq.token_ids), "finish_reason": seq.finish_reason}
        row = (
            st.add_sibling(stored[0], seq.text, token_ids=list(seq.token_ids))
            if stored
            else st.add_message(
                conv_id, "assistant", seq.text, parent_id=user_id, token_ids=list(seq.token_ids)
            )
        )
        st.add_reply_stats(row["id"], **stats)
        stored.append(row["id"])
    if stored:
        st.select_branch(stored[0])
    return stored


SCORE_TIP = (
    "How beam search ranks its replies: the sum of the log-probabilities of the reply's "
    "tokens divided by its length; closer to 0 is more likely"
)
LOGPROB_TIP = "The sum of the log-probabilities of the reply's tokens (0 would be certain)"


def beam_markdown(k: int, seq, chosen: bool) -> str:
    line = (
        f'<span title="{SCORE_TIP}">score</span> {seq.score:.3f} · '
        f'<span title="{LOGPROB_TIP}">cumulative logprob</span> {seq.cum_logprob:.2f}'
    )
    return (
        view.alternative_markdown(
            k, seq.text, {"output_tokens": len(seq.token_ids)}, label="Beam", chosen=chosen
        )
        + f"\n\n*{line}*"
    )


@dataclass(eq=False)
class BeamTurn:
    """One beam search in a conversation, owned by it (TabRegistry.turn(conv_id)) like a Turn and
    read the same way by Stop, the idle timeout and the tabs that follow it."""

    conv_id: str
    user_id: int
    width: int
    rid: str = field(default_factory=lambda: f"beam-{uuid.uuid4().hex[:12]}")
    cache_salt: str | None = None
    tenant: str | None = None  # who the fair scheduler serves and whose queue bounds count it
    submitted: Future | None = None  # tokenize + submit, off the loop; an abort waits for it
    task: asyncio.Task | None = None
    watchdog: asyncio.Task | None = None
    stored: list = field(default_factory=list)  # stored ids of the beams, best first
    alts: list = field(default_factory=list)  # markdown of each beam
    error: str | None = None  # refused or failed: nothing stored
    lost: bool = False  # the conversation was deleted meanwhile
    stopping: bool = False  # Stop or the idle timeout asked the engine to end it
    abandoned: bool = False  # aborted by the idle timeout (ui/chat/reattach.py)
    admitted: bool = True  # a search reports no queue place: never counted as waiting
    created: float = field(default_factory=time.monotonic)
    wakeup: Wakeup = field(default_factory=Wakeup)  # the tabs painting it (ui/chat/wakeup.py)

    @property
    def finished(self) -> bool:
        return self.task is not None and self.task.done()

    @property
    def label(self) -> str:
        return f"beam search (width {self.width}): searching…"


def start(ctx, bt: BeamTurn, messages: list[dict], max_tokens: int) -> BeamTurn:
    """Run `bt` as a task of the running event loop. The caller has called tabs.begin(conv_id);
    the task always calls tabs.end(conv_id). The submit call starts here, before the task runs,
    so a Stop at any moment has a request to abort."""
    ctx.tabs.attach(bt)
    bt.submitted = submit(ctx.llm, messages, bt.width, max_tokens, bt.cache_salt, bt.rid, bt.tenant)
    loop = asyncio.get_running_loop()
    bt.task = loop.create_task(_run(ctx, bt))
    bt.task.add_done_callback(lambda _task: bt.wakeup.wake())  # followers see it end
    bt.watchdog = loop.create_task(watch_abandoned(ctx, bt, ctx.abandon_s))
    return bt


async def _run(ctx, bt: BeamTurn) -> None:
    try:
        bt.stored, bt.alts = await finish(ctx, bt.submitted, bt.conv_id, bt.user_id)
    except (ValueError, RuntimeError) as e:  # refused by the engine, failed, or aborted
        if not bt.stopping:  # an abort that was asked for is no error
            bt.error = str(e)
    except NotFoundError:  # deleted in another window meanwhile
        bt.lost = True
    finally:
        ctx.tabs.end(bt.conv_id, None, bt.submitted, bt)


def _submit(llm, messages: list[dict], width: int, max_tokens: int, cache_salt, request_id, tenant):
    ids = prompt_ids(llm, messages)
    salt = prompt_salt(llm.get_tokenizer(), messages, ids, cache_salt)
    params = BeamSearchParams(beam_width=width, max_tokens=max_tokens)
    return ids, llm.submit_beam_search(
        {"prompt_token_ids": ids}, params, request_id=request_id, cache_salt=salt, tenant=tenant
    )


def submit(
    llm,
    messages: list[dict],
    width: int,
    max_tokens: int,
    cache_salt: str | None = None,
    request_id: str | None = None,
    tenant: str | None = None,
) -> Future:
    """Tokenize and submit on a thread of its own: a Future of (prompt ids, search handle).
    cache_salt: the user's (ChatContext.cache_salt), like every other turn (#29.2); tenant: the
    user's (ChatContext.tenant), so the search is scheduled and bounded as theirs."""
    return in_daemon_thread(
        _submit, llm, messages, width, max_tokens, cache_salt, request_id, tenant
    )


async def finish(ctx, submitted: Future, conv_id: str, user_id: int):
    """Wait for the search, store it, and return (stored ids, markdown per beam). A cancelled wait
    aborts the search in the engine; a search that failed or was aborted has already ended there."""
    ids, handle = await asyncio.wrap_future(submitted)
    try:
        out = await handle
    except asyncio.CancelledError:  # the waiter went away (shutdown): the search must not run on
        in_daemon_thread(handle.abort)
        raise
    stored = store(ctx.storage, user_id, conv_id, ids, out)
    return stored, [beam_markdown(k, s, k == 0) for k, s in enumerate(out.sequences)]


async def run(
    ctx,
    messages: list[dict],
    conv_id: str,
    user_id: int,
    width: int,
    max_tokens: int,
    cache_salt: str | None = None,
):
    """Search and store, awaited in place (no tab registry: what the engine's tests drive)."""
    return await finish(
        ctx, submit(ctx.llm, messages, width, max_tokens, cache_salt), conv_id, user_id
    )
