"""The context meter under each chat (issue 26.3): how much of the model's context this chat uses,
how much of it sits in shared blocks and how much in its own, and a warning before it is full.

Why from the engine's snapshot: the numbers must be the engine's, not a re-count on the page. The
chat's engine session (session_id = conversation id) lists its block table; each block's state,
ref_count and filled tokens come from the same snapshot, so the meter equals /api/kv for that chat
by construction. A chat that holds no blocks now (released, or never sent) is measured from its
stored token ids instead (prompt + reply of its last turn), and says so.

The warning appears from WARN_FRACTION of max_model_len on, with the action "start a new chat with
a summary" (ui/chat/summary.py): the old chat stays as it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from html import escape

from ui.dashboard.vocabulary import state_of

WARN_FRACTION = 0.8


@dataclass(frozen=True)
class Meter:
    tokens: int               # prompt + reply so far (what the next turn starts from)
    max_model_len: int
    blocks: int               # blocks of this chat's table (0 when none are held)
    shared_blocks: int        # of them shared with other chats or pinned (ref_count >= 2 or pinned)
    shared_tokens: int        # tokens in those shared blocks
    own_tokens: int           # tokens in this chat's own blocks
    in_memory: bool           # the engine holds blocks for this chat now

    @property
    def fraction(self) -> float:
        return self.tokens / self.max_model_len if self.max_model_len else 0.0

    @property
    def warn(self) -> bool:
        return self.fraction >= WARN_FRACTION


def from_snapshot(snap: dict, conv_id: str, max_model_len: int) -> Meter | None:
    """The meter of `conv_id` from one snapshot (/api/kv form), or None if it holds no blocks.
    With several sequences of one session (n alternatives), the first one's table counts."""
    seq = next((s for s in snap.get("sequences") or [] if s.get("session_id") == conv_id), None)
    if seq is None:
        return None
    b = snap["blocks"]
    table = list(seq["block_table"])
    shared = [state_of(b["state"][i], b["ref_count"][i]) in "sn" for i in table]
    filled = [b["filled"][i] for i in table]
    shared_tokens = sum(f for f, s in zip(filled, shared) if s)
    tokens = seq["num_tokens"]
    return Meter(tokens=tokens, max_model_len=max_model_len, blocks=len(table), shared_blocks=sum(shared),
                 shared_tokens=shared_tokens, own_tokens=max(0, min(tokens, sum(filled)) - shared_tokens),
                 in_memory=True)


def from_storage(path: list[dict], max_model_len: int) -> Meter | None:
    """The meter of a chat the engine holds no blocks for, from its stored ids: the last user
    message's prompt ids + the reply after it."""
    last_user = next((i for i in range(len(path) - 1, -1, -1) if path[i]["role"] == "user"), None)
    if last_user is None or not path[last_user].get("token_ids"):
        return None
    tokens = len(path[last_user]["token_ids"])
    if last_user + 1 < len(path):
        tokens += len(path[last_user + 1].get("token_ids") or [])
    return Meter(tokens=tokens, max_model_len=max_model_len, blocks=0, shared_blocks=0, shared_tokens=0,
                 own_tokens=0, in_memory=False)


def html(m: Meter | None) -> str:
    """The meter line: a bar and the numbers (data-k / data-v carry the raw values for tests)."""
    if m is None:
        return '<div class="ctx-meter" data-k="ctx_tokens" data-v="0">Context: empty</div>'
    pct = min(100.0, 100 * m.fraction)

    def n(key, v, text=None):
        return f'<b data-k="{key}" data-v="{v}">{escape(text or format(v, ","))}</b>'
    parts = [f'Context {n("ctx_tokens", m.tokens)} / {n("ctx_max", m.max_model_len)} tokens ({pct:.0f}%)']
    if m.in_memory:
        parts.append(f'{n("ctx_shared_tokens", m.shared_tokens)} in {n("ctx_shared_blocks", m.shared_blocks)} '
                     f'shared blocks · {n("ctx_own_tokens", m.own_tokens)} in this chat\'s own '
                     f'{n("ctx_own_blocks", m.blocks - m.shared_blocks)} blocks')
    else:
        parts.append("not in memory now (the next message is prefilled again, mostly from the prefix cache)")
    warn = (f'<div class="ctx-warn" data-k="ctx_warn" data-v="1">The context is {pct:.0f}% full: at '
            f'{m.max_model_len:,} tokens no reply fits. Start a new chat with a summary of this one '
            f'(this chat stays as it is).</div>' if m.warn else "")
    return (f'<div class="ctx-meter{" full" if m.warn else ""}"><span class="ctx-bar"><span style="width:'
            f'{pct:.1f}%"></span></span> {" · ".join(parts)}{warn}</div>')


CSS = """
.ctx-meter { font-size: 0.8em; opacity: 0.85; margin: 2px 0; }
.ctx-meter .ctx-bar { display: inline-block; width: 90px; height: 7px; border-radius: 4px; vertical-align: 0;
  background: var(--kv-track, #e5e7eb); overflow: hidden; }
.ctx-meter .ctx-bar span { display: block; height: 100%; background: var(--kv-private, #60a5fa); }
.ctx-meter.full .ctx-bar span { background: #dc2626; }
.ctx-warn { color: #b91c1c; font-weight: 600; margin-top: 2px; }
"""


def for_tab(ctx, request) -> Meter | None:
    """The meter of the chat open in this tab: from the engine's latest snapshot (shared by every
    reader, never waits behind a step) when the chat holds blocks, else from storage."""
    tab = ctx.tab(request)
    if tab.conv_id is None:
        return None
    try:
        snap = ctx.llm.latest_snapshot()
    except RuntimeError:                    # the engine is shutting down
        snap = {}
    m = from_snapshot(snap, tab.conv_id, ctx.max_model_len) if snap.get("blocks") else None
    if m is None:
        try:
            path = ctx.storage.get_messages(tab.conv_id, owner=ctx.check(request))
        except (KeyError, PermissionError):
            return None
        m = from_storage(path, ctx.max_model_len)
    return m
