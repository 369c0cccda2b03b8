"""A chat reply by beam search: the k best continuations shown side by side like n alternatives,
all k stored as versions of the reply, the first on screen until the user picks another.

Why not a `Turn`: the engine's beam search (engine/core/beam_search.py, LLM.submit_beam_search) does
not stream text; it returns the k sequences at once. So this handler submits, waits (showing a
"searching" state, Stop aborts it), then stores and paints once. The beams share the prompt's
blocks and fork copy-on-write inside the engine; the UI only sees the result.
"""
from __future__ import annotations

import asyncio
import re

from engine.core.beam_search import BeamSearchParams
from engine.text.chat_tokens import encode_chat
from engine.kv.salt_rule import prompt_salt
from ui.chat import view
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
        row = (st.add_sibling(stored[0], seq.text, token_ids=list(seq.token_ids)) if stored else
               st.add_message(conv_id, "assistant", seq.text, parent_id=user_id, token_ids=list(seq.token_ids)))
        st.add_reply_stats(row["id"], **stats)
        stored.append(row["id"])
    if stored:
        st.select_branch(stored[0])
    return stored


def beam_markdown(k: int, seq, chosen: bool) -> str:
    line = f"score {seq.score:.3f} · cumulative logprob {seq.cum_logprob:.2f}"
    return view.alternative_markdown(k, seq.text, {"output_tokens": len(seq.token_ids)}, label="Beam",
                                     chosen=chosen) + f"\n\n*{line}*"


async def run(ctx, messages: list[dict], conv_id: str, user_id: int, width: int, max_tokens: int,
              cache_salt: str | None = None):
    """Search, store, and return (stored ids, markdown per beam). The caller holds
    tabs.begin(conv_id) and ends it; a cancel (Stop) aborts the search in the engine.
    cache_salt: the user's (ChatContext.cache_salt), like every other turn (#29.2)."""
    ids = await asyncio.to_thread(prompt_ids, ctx.llm, messages)
    salt = prompt_salt(ctx.llm.get_tokenizer(), messages, ids, cache_salt)
    params = BeamSearchParams(beam_width=width, max_tokens=max_tokens)
    handle = await asyncio.wrap_future(in_daemon_thread(
        ctx.llm.submit_beam_search, {"prompt_token_ids": ids}, params, cache_salt=salt))
    try:
        out = await handle
    except BaseException:
        in_daemon_thread(handle.abort)
        raise
    stored = store(ctx.storage, user_id, conv_id, ids, out)
    return stored, [beam_markdown(k, s, k == 0) for k, s in enumerate(out.sequences)]
