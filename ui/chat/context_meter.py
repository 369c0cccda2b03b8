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

import dataclasses
from dataclasses import dataclass
from html import escape

from ui.chat import thinking
from ui.dashboard.groups_view import blocks_in_span, table_groups
from ui.dashboard.vocabulary import state_of

WARN_FRACTION = 0.8
TIPS = {
    "pinned": "pinned: blocks of the shared system prompt, stored once and kept by the app "
    "for every chat",
    "shared": "shared: blocks this chat holds together with at least one other chat (not pinned)",
    "own": "own: blocks only this chat holds (ref_count 1)",
}


@dataclass(frozen=True)
class Meter:
    tokens: int  # prompt + reply so far (what the next turn starts from)
    max_model_len: int
    blocks: int  # blocks of this chat's table (0 when none are held)
    shared_blocks: int  # of them held by 2+ chats, not pinned (ui/dashboard/vocabulary.py)
    shared_tokens: int  # tokens in those shared blocks
    own_tokens: int  # tokens in this chat's own blocks
    in_memory: bool  # the engine holds blocks for this chat now
    pinned_blocks: int = 0  # of them pinned (the shared system prompt)
    pinned_tokens: int = 0
    why_not: str = ""  # not in memory: why (another version is, or nothing is)
    source: str = ""  # where the count comes from when not from the engine's blocks
    reasoning: thinking.ReasoningSpan | None = None  # the last reply's reasoning in the blocks
    reasoning_kept: bool | None = None  # the template feeds past reasoning back (None: unknown)
    reasoning_blocks: int = 0  # blocks holding it (each KV cache group that still does)
    group_blocks: tuple = ()  # live blocks per KV cache group (the table's order)

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
    codes = [state_of(b["state"][i], b["ref_count"][i]) for i in table]
    filled = [b["filled"][i] for i in table]
    shared_tokens = sum(f for f, c in zip(filled, codes) if c == "s")
    pinned_tokens = sum(f for f, c in zip(filled, codes) if c == "n")
    tokens = seq["num_tokens"]
    return Meter(
        tokens=tokens,
        max_model_len=max_model_len,
        blocks=len(table),
        group_blocks=tuple(seq.get("group_blocks") or ()),
        shared_blocks=codes.count("s"),
        shared_tokens=shared_tokens,
        own_tokens=max(0, min(tokens, sum(filled)) - shared_tokens - pinned_tokens),
        in_memory=True,
        pinned_blocks=codes.count("n"),
        pinned_tokens=pinned_tokens,
    )


def from_storage(path: list[dict], max_model_len: int, why_not: str = "") -> Meter | None:
    """The meter of a chat the engine holds no blocks for (or holds another version of), from the
    branch on screen as stored: the last user message's prompt ids + the reply after it. Without
    ids (a remote backend gives none), the reply's usage: its prompt and output tokens."""
    last_user = next((i for i in range(len(path) - 1, -1, -1) if path[i]["role"] == "user"), None)
    if last_user is None:
        return None
    reply = path[last_user + 1] if last_user + 1 < len(path) else None
    usage = (reply or {}).get("stats") or {}
    ids = path[last_user].get("token_ids")
    if ids:
        tokens, source = len(ids), ""
    elif usage.get("prompt_tokens") is not None:
        tokens, source = int(usage["prompt_tokens"]), "usage"
    else:
        return None
    if reply is not None:
        tokens += len(reply.get("token_ids") or []) or int(usage.get("output_tokens") or 0)
    return Meter(
        tokens=tokens,
        max_model_len=max_model_len,
        blocks=0,
        shared_blocks=0,
        shared_tokens=0,
        own_tokens=0,
        in_memory=False,
        why_not=why_not,
        source=source,
    )


OTHER_VERSION = (
    "this version is not in memory now: the engine holds the version generated last "
    "(a message here reuses the blocks both versions share)"
)


def html(m: Meter | None) -> str:
    """The meter line: a bar and the numbers (data-k / data-v carry the raw values for tests)."""
    if m is None:
        return '<div class="ctx-meter" data-k="ctx_tokens" data-v="0">Context: empty</div>'
    pct = min(100.0, 100 * m.fraction)

    def n(key, v, text=None):
        return f'<b data-k="{key}" data-v="{v}">{escape(text or format(v, ","))}</b>'

    parts = [
        f'Context {n("ctx_tokens", m.tokens)} / {n("ctx_max", m.max_model_len)} tokens '
        f'({pct:.0f}%)' + (" (from the backend's usage)" if m.source == "usage" else "")
    ]
    if m.in_memory:
        own, none = m.blocks - m.shared_blocks - m.pinned_blocks, ""
        for key, tokens, blocks, word, tip in (
            ("pinned", m.pinned_tokens, m.pinned_blocks, "pinned", TIPS["pinned"]),
            ("shared", m.shared_tokens, m.shared_blocks, "shared", TIPS["shared"]),
        ):
            if blocks:
                plural = "s" if blocks != 1 else ""
                parts.append(
                    f'<span title="{tip}">{n(f"ctx_{key}_tokens", tokens)} in '
                    f'{n(f"ctx_{key}_blocks", blocks)} {word} block{plural}</span>'
                )
            else:  # none of this kind: its number for readers, no words
                none += f'<span hidden data-k="ctx_{key}_blocks" data-v="0"></span>'
        parts.append(
            f'<span title="{TIPS["own"]}">{n("ctx_own_tokens", m.own_tokens)} in this '
            f'chat\'s own {n("ctx_own_blocks", own)} block{"s" if own != 1 else ""}</span>'
            + none
            + reasoning_html(m, n)
        )
    elif m.why_not:
        parts.append(f'<span data-k="ctx_other_version" data-v="1">{escape(m.why_not)}</span>')
    else:
        parts.append(
            "not in memory now (the next message is prefilled again, mostly from the prefix cache)"
        )
    warn = (
        f'<div class="ctx-warn" data-k="ctx_warn" data-v="1">The context is {pct:.0f}% full: at '
        f'{m.max_model_len:,} tokens no reply fits. Start a new chat with a summary of this one '
        f'(this chat stays as it is).</div>'
        if m.warn
        else ""
    )
    return (
        f'<div class="ctx-meter{" full" if m.warn else ""}"><span class="ctx-bar"><span style="width:'
        f'{pct:.1f}%"></span></span> {" · ".join(parts)}{warn}</div>'
    )


def reasoning_html(m: Meter, n) -> str:
    """' (reasoning: 39 tokens in 3 of them, left out of the next prompt)': the KV a thinking
    model's last reasoning takes, the biggest private part of a chat (ui/chat/thinking.py)."""
    r = m.reasoning
    if r is None:
        return ""
    fate = {
        False: ", left out of the next prompt: freed when you send it",
        True: ", fed back with the next prompt (the template keeps past reasoning)",
    }
    tip = (
        "The reply's reasoning (folded above it) is KV like the rest: these blocks hold it "
        "until the next message"
    )
    return (
        f' <span class="ctx-reasoning" title="{tip}">(reasoning: '
        f'{n("ctx_reasoning_tokens", r.tokens)} tokens in '
        f'{n("ctx_reasoning_blocks", m.reasoning_blocks)} of them'
        f'{fate.get(m.reasoning_kept, "")})</span>'
    )


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
    except RuntimeError:  # the engine is shutting down
        snap = {}
    m = from_snapshot(snap, tab.conv_id, ctx.max_model_len) if snap.get("blocks") else None
    # the engine's session holds the branch its last turn ran; the screen may show another one (a
    # version switched to, a beam or alternative picked): then the screen's, from storage
    held = ctx.tabs.session_leaf(tab.conv_id)
    other = (
        m is not None
        and held is not None
        and tab.shown_ids
        and tab.shown_ids[-1] != held
        and not ctx.tabs.is_busy(tab.conv_id)
    )
    if m is None or other:
        try:
            path = ctx.storage.get_messages(tab.conv_id, owner=ctx.check(request))
        except (KeyError, PermissionError):
            return None
        m = from_storage(path, ctx.max_model_len, OTHER_VERSION if other else "") or m
    elif ctx.llm.model_info().reasoning_markers:  # a thinking model: where its reasoning sits
        m = with_reasoning(ctx, request, tab.conv_id, m, snap.get("block_size") or 0)
    return m


def with_reasoning(ctx, request, conv_id: str, m: Meter, block_size: int) -> Meter:
    """The meter with the span of the last reply's reasoning, when the engine's blocks hold exactly
    that turn (its token count is the stored prompt + reply)."""
    try:
        path = ctx.storage.get_messages(conv_id, owner=ctx.check(request))
    except (KeyError, PermissionError):
        return m
    tok = ctx.llm.get_tokenizer()
    start = thinking.start_marker_id(ctx.llm.model_info().reasoning_markers, tok)
    span = thinking.last_reply_span(path, start, block_size)
    if span is None or not thinking.held_turn(path, m.tokens):
        return m
    seq = {"group_blocks": list(m.group_blocks) or [m.blocks], "num_tokens": m.tokens}
    split = table_groups(seq, block_size)
    held = blocks_in_span(split, span.first_block, span.last_block)
    if not held:
        return m
    return dataclasses.replace(
        m,
        reasoning=span,
        reasoning_blocks=held,
        reasoning_kept=thinking.template_keeps_reasoning(tok),
    )
