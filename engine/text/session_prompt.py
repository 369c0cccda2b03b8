"""Build turn k+1's prompt from turn k's exact token ids plus the newly templated text.

Re-tokenizing the assistant's decoded reply can give different ids than were generated, which
would miss the KV cache from that point on. So we keep the ids, render the whole conversation
with the chat template, and tokenize only the text that follows what the kept ids decode to.
"""

from __future__ import annotations

from engine.text.chat_tokens import (
    chat_segments,
    encode_chat,
    encode_segments,
    render_chat,
    specials_where_template_puts_them,
)
from engine.text.common_prefix import common_prefix

__all__ = ["continue_session_prompt", "render_chat", "shared_system_tokens"]


def continue_session_prompt(
    tokenizer, messages: list[dict], previous_ids: list[int] | None, **mode
) -> list[int]:
    """Message text is tokenized as plain text: special tokens come only from the template
    (engine/text/chat_tokens.py). Kept ids are trusted only when they decode to the start of the
    rendered conversation and their special tokens sit where the template's do; else the prompt
    is re-derived from the text (a wrong guess costs cache hits, never a planted turn).
    `mode`: add_generation_prompt / continue_final_message (render_chat). The template is rendered
    once: the text, the special-token check and the encoding all read the same segments."""
    text, segments = chat_segments(tokenizer, messages, **mode)
    if previous_ids:
        prev_text = tokenizer.decode(previous_ids, skip_special_tokens=False)
        if (
            prev_text
            and text.startswith(prev_text)
            and specials_where_template_puts_them(tokenizer, messages, previous_ids, segments)
        ):
            tail = encode_segments(tokenizer, segments, start_char=len(prev_text))
            return list(previous_ids) + tail
    return encode_segments(tokenizer, segments)


def shared_system_tokens(tokenizer, messages: list[dict], ids: list[int]) -> int:
    """How many leading tokens of `ids` (the prompt of `messages`) belong to the leading system
    messages: the part every user may share in the prefix cache under a per-user salt. Measured
    as the common prefix with the system messages rendered alone, so it holds for any template
    (at most one template marker of the next turn, never its text, is counted in)."""
    k = 0
    while k < len(messages) and messages[k].get("role") == "system":
        k += 1
    if k == 0:
        return 0
    return common_prefix(encode_chat(tokenizer, messages[:k]), ids)
