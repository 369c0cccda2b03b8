"""A thinking model's reply in the chat (Qwen3, SmolLM3; issue 45): the reasoning folded above the
answer with its token count, the per-chat "Think" switch, and where the reasoning sits in the
chat's KV blocks. Plain functions (no Gradio, no engine): unit-tested directly.

Why the reply is stored whole (reasoning markers included): the next turn's prompt is rendered by
the model's own chat template, which decides whether past reasoning is fed back (Qwen3's and
SmolLM3's drop it; a template that keeps it gets it back verbatim). The split for the screen is
engine/text/reasoning.py's rule, the same one /v1 uses for `reasoning_content`; the reply's stats
carry `reasoning_tokens` (None: the reply has no reasoning block), so a stored reply folds again
after a reload, whichever model is loaded then.

Safety: the reasoning is model text like the answer. It goes through the same safe Markdown
(ui/chat/view.rendered) and sits in its own part of the row, so nothing it leaves open reaches
the answer, and the fold's own HTML (details / summary) is ours alone.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from html import escape

from engine.text.reasoning import HARMONY_MARKERS, MARKERS, Split, split_stored
from engine.text.reasoning import reasoning_markers as reasoning_markers_of

FOLD_CLASS = "reasoning"


def stored_split(text: str, stats: dict | None) -> Split | None:
    """A stored reply's reasoning and answer, or None when it has no reasoning block. Its stats say
    whether it has one and how many tokens it took; the block opened in the reply (it starts with
    the start marker) or in the prompt (a template that writes the marker into the generation
    prompt: the reply then starts inside it). A harmony reply (gpt-oss) splits by its channels."""
    tokens = (stats or {}).get("reasoning_tokens")
    if tokens is None:
        return None
    inside = not text.lstrip().startswith(MARKERS[0])
    sp = split_stored(text, inside)
    if sp.reasoning is None:
        return None
    return Split(sp.reasoning, sp.content, int(tokens))


def has_fold(split: Split | None) -> bool:
    """Fold only a reasoning with something in it (a template's empty block is not one)."""
    return (
        split is not None
        and split.reasoning is not None
        and bool(split.reasoning.strip() or split.reasoning_tokens)
    )


def summary_text(tokens: int, live: bool = False, answered: bool = True) -> str:
    """The fold's title: "Thought for 39 tokens"; while it streams "Thinking… 12 tokens so far";
    a reply that ended inside its reasoning says so."""
    n = f"{tokens:,} token{'s' if tokens != 1 else ''}"
    if live:
        return f"Thinking… {n} so far"
    return f"Thought for {n}" + ("" if answered else " (stopped before answering)")


def fold(safe_reasoning: str, tokens: int, live: bool = False, answered: bool = True) -> str:
    """The folded reasoning: a collapsed details element (open while it streams, so it can be read
    as it comes). `safe_reasoning` is already safe Markdown (view.rendered); the blank lines let
    the renderer read it as Markdown inside our HTML."""
    opened = " open" if live else ""
    title = escape(summary_text(tokens, live, answered))
    return (
        f'<details class="{FOLD_CLASS}"{opened}><summary>{title}</summary>\n\n'
        f"{safe_reasoning}\n\n</details>"
    )


def requested(value, has_switch: bool) -> bool | None:
    """What a turn asks the template for: the switch's value where the model has one, else None
    (the template's default; a model without the switch never gets the argument)."""
    return bool(value) if has_switch and value is not None else None


def switch_value(conv: dict | None) -> bool:
    """What the "Think" switch shows for a chat: its own setting, else on (the templates'
    default)."""
    value = (conv or {}).get("thinking")
    return True if value is None else bool(value)


@dataclass(frozen=True)
class ReasoningSpan:
    """Where a chat's last reasoning sits in its token sequence (prompt + reply) and its blocks."""

    tokens: int  # reasoning tokens (inside the markers)
    first: int  # position of the first of them in the chat's token sequence
    first_block: int  # logical block index of the first / last block holding them
    last_block: int

    @property
    def blocks(self) -> int:
        return self.last_block - self.first_block + 1 if self.tokens else 0


def reasoning_span(
    prompt_ids, reply: dict | None, start_id: int | None, block_size: int
) -> ReasoningSpan | None:
    """The reasoning of `reply` (a stored reply row with token_ids and stats) in the chat's token
    sequence (its prompt ids, then the reply's ids), and the logical blocks it fills. `start_id`:
    the model's start-marker token id (None: the reply starts inside the block). None when the
    reply has no reasoning tokens or no ids."""
    if not reply or not prompt_ids or not block_size:
        return None
    n = (reply.get("stats") or {}).get("reasoning_tokens")
    ids = list(reply.get("token_ids") or [])
    if not n or not ids:
        return None
    offset = ids.index(start_id) + 1 if start_id is not None and start_id in ids else 0
    n = min(int(n), len(ids) - offset)
    if n <= 0:
        return None
    first = len(prompt_ids) + offset
    return ReasoningSpan(n, first, first // block_size, (first + n - 1) // block_size)


def last_reply_span(
    path: list[dict], start_id: int | None, block_size: int
) -> ReasoningSpan | None:
    """The reasoning span of a branch's last reply (the last user message's prompt ids, then the
    reply after it): what a chat's engine session holds between turns."""
    last_user = next((i for i in range(len(path) - 1, -1, -1) if path[i]["role"] == "user"), None)
    if (
        last_user is None
        or last_user + 1 >= len(path)
        or path[last_user + 1]["role"] != "assistant"
    ):
        return None
    return reasoning_span(
        path[last_user].get("token_ids"), path[last_user + 1], start_id, block_size
    )


def held_turn(path: list[dict], tokens: int) -> bool:
    """The engine's session holds the stored last turn: its tokens are the prompt ids + the reply
    ids, less the reply's last token when that one was never fed back (its KV is not computed: an
    ended turn's end-of-turn token)."""
    last_user = next((i for i in range(len(path) - 1, -1, -1) if path[i]["role"] == "user"), None)
    if last_user is None or last_user + 1 >= len(path):
        return False
    stored = len(path[last_user].get("token_ids") or []) + len(
        path[last_user + 1].get("token_ids") or []
    )
    return stored - tokens in (0, 1)


def start_marker_id(markers, tokenizer) -> int | None:
    """The start marker's token id (None: a model that does not think, or no tokenizer here)."""
    if not markers or tokenizer is None:
        return None
    return tokenizer.convert_tokens_to_ids(markers[0])


_PROBE = "zq-past-reasoning-probe"


def template_keeps_reasoning(tokenizer) -> bool | None:
    """Whether the chat template writes a past reply's reasoning back into the next prompt (None:
    unknown). Qwen3's and SmolLM3's leave it out: a chat's reasoning blocks then serve only until
    the next message, whose prompt diverges from them."""
    try:
        return _KEEPS[tokenizer]
    except (KeyError, TypeError):
        pass
    reply = {"role": "assistant", "content": f"{MARKERS[0]}{_PROBE}{MARKERS[1]}b"}
    if tuple(reasoning_markers_of(tokenizer)) == HARMONY_MARKERS:  # gpt-oss: the analysis field
        reply = {"role": "assistant", "content": "b", "thinking": _PROBE}
    try:
        text = tokenizer.apply_chat_template(
            [
                {"role": "user", "content": "a"},
                reply,
                {"role": "user", "content": "c"},
            ],
            tokenize=False,
            add_generation_prompt=True,
        )
        keeps = _PROBE in text
    except Exception:  # noqa: BLE001 - a template that cannot render this: unknown
        keeps = None
    try:
        _KEEPS[tokenizer] = keeps
    except TypeError:  # not weakly referable: asked again next time
        pass
    return keeps


_KEEPS: weakref.WeakKeyDictionary = (
    weakref.WeakKeyDictionary()
)  # per tokenizer (a switch brings another)


def span_words(span: ReasoningSpan) -> str:
    """ "reasoning: 39 tokens in 3 blocks" (the meter and the block table say it alike)."""
    return (
        f"reasoning: {span.tokens:,} token{'s' if span.tokens != 1 else ''} in "
        f"{span.blocks} block{'s' if span.blocks != 1 else ''}"
    )


CSS = """
#chatbot details.reasoning { margin: 0 0 6px; padding: 2px 8px; border-left: 3px solid
  var(--kv-private, #60a5fa); background: var(--block-background-fill, transparent); opacity: .9; }
#chatbot details.reasoning > summary { cursor: pointer; font-size: .85em; opacity: .8; }
#chatbot details.reasoning[open] > summary { margin-bottom: 4px; }
#chatbot details.reasoning > :not(summary) { font-size: .9em; }
"""
