"""Input limits and validation for the chat UI, checked before anything is stored or tokenized.

Why here, first: a 20 MB message was tokenized inside an async handler and froze the server for
every user; a NaN top_p stored a conversation and a user message and only then failed; a lone
surrogate or a huge search pattern came back as a raw library error. Each check below raises
`gr.Error` with a sentence a user can act on; it fails that one request, nothing is stored, and
no other session is touched. Limits are generous for real use and far below what hurts:
the model's context holds a few thousand tokens, so a message past MAX_MESSAGE_CHARS can never
fit and is refused without tokenizing it.
"""

from __future__ import annotations

import gradio as gr

from engine import SamplingParams
from ui.chat import view

MAX_MESSAGE_CHARS = 100_000  # > 4 chars/token x the largest context this app is run with
MAX_TITLE_CHARS = 200
MAX_PROMPT_CHARS = 20_000  # a system prompt (shared or per conversation)
MAX_SEARCH_CHARS = 200
MAX_IMPORT_BYTES = 10 * 1024 * 1024
MAX_IMPORT_MESSAGES = 10_000


def _invalid(what: str, why: str) -> gr.Error:
    return gr.Error(f"{what} {why}", title="Not accepted")


def check_text(text, what: str, limit: int) -> str:
    """`text` as a string no longer than `limit` characters and storable as UTF-8."""
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise _invalid(what, "must be text.")
    if len(text) > limit:
        raise _invalid(what, f"is too long: {len(text):,} characters; the limit is {limit:,}.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid(
            what,
            "contains an invalid character (a lone UTF-16 surrogate); remove it and try again.",
        ) from None
    return text


def message(text) -> str:
    return check_text(text, "The message", MAX_MESSAGE_CHARS)


def title(text) -> str:
    return check_text(text, "The title", MAX_TITLE_CHARS)


def prompt(text) -> str:
    return check_text(text, "The system prompt", MAX_PROMPT_CHARS)


def search_query(text) -> str:
    return check_text(text, "The search text", MAX_SEARCH_CHARS)


def sampling(temperature, top_p, top_k, max_tokens, repetition_penalty, seed, n) -> dict:
    """Widget values -> SamplingParams keyword arguments, validated as SamplingParams would
    (finite, in range, temperature 0 or >= its minimum) before the handler stores anything."""
    try:
        kw = view.sampling_kwargs(
            temperature, top_p, top_k, max_tokens, repetition_penalty, seed, n
        )
        SamplingParams(**kw)
    except (ValueError, TypeError, OverflowError) as e:
        raise gr.Error(f"Sampling settings not accepted: {e}", title="Not accepted") from None
    return kw


def import_size(path) -> None:
    """Refuse an import file by its size before reading it."""
    import os

    size = os.path.getsize(path)
    if size > MAX_IMPORT_BYTES:
        raise _invalid(
            "The import file",
            f"is too large: {size / 2**20:.1f} MB; the limit is {MAX_IMPORT_BYTES // 2**20} MB.",
        )


def import_data(data) -> None:
    """Refuse an export with too many messages or oversized texts before storing any of it."""
    msgs = data.get("messages") if isinstance(data, dict) else None
    if isinstance(msgs, list):
        if len(msgs) > MAX_IMPORT_MESSAGES:
            raise _invalid(
                "The import file",
                f"has {len(msgs):,} messages; the limit is {MAX_IMPORT_MESSAGES:,}.",
            )
        for m in msgs:
            if isinstance(m, dict) and isinstance(m.get("content"), str):
                message(m["content"])
    if isinstance(data, dict):
        conv = data.get("conversation")
        if isinstance(conv, dict) and isinstance(conv.get("title"), str):
            title(conv["title"])
        if isinstance(data.get("system_prompt"), str):
            prompt(data["system_prompt"])
