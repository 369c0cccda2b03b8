"""The honest state of a reply, in words: queued (with position), generating, paused because its
memory was taken (preempted), stopped, finished — and why it finished.

Why a module of its own: a stuck "generating…" with nothing explaining it was the complaint. The
paused state comes from the engine itself: a preempted request's stream carries a "preempted"
delta, then "resumed" when it is scheduled again (engine/outputs.py); the Turn records them and
the page shows "paused" until tokens flow again. The engine reports "length" both when
`max_tokens` ran out and when the context did, and "stop" both for the end-of-turn token and for a
stop sequence; the numbers stored with the reply (prompt + output tokens vs the context length, the
last token id) tell which.
"""

from __future__ import annotations

QUEUED = "queued"
GENERATING = "generating"
PAUSED = "paused"

PAUSED_TEXT = "memory full, resuming…"


def live_status(state: str, position: int | None = None) -> str:
    """The status line under the chat while a reply is not finished."""
    if state == QUEUED:
        if position:
            return f"server busy, your message is queued as number {position}…"
        return "queued: waiting for a free slot in the engine…"
    if state == PAUSED:
        return f"paused: {PAUSED_TEXT}"
    return "generating…"


def finish_text(
    stats: dict | None,
    status: str | None,
    max_model_len: int | None = None,
    last_token: int | None = None,
    eos_ids=(),
) -> str:
    """Why a reply ended, in the words users expect; "" when nothing honest can be said."""
    stats = stats or {}
    if status == "stopped":
        return "stopped"
    if status == "error":
        return "error"
    reason = stats.get("finish_reason")
    if reason == "length":
        used = (stats.get("prompt_tokens") or 0) + (stats.get("output_tokens") or 0)
        if max_model_len and used >= max_model_len:
            return f"context full ({used}/{max_model_len} tokens)"
        return "max tokens reached"
    if reason == "stop":
        if last_token is not None and eos_ids and last_token not in eos_ids:
            return "stop sequence"
        return "end of turn"
    return ""
