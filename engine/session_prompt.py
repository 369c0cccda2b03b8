"""Build turn k+1's prompt from turn k's exact token ids plus the newly templated text.

Re-tokenizing the assistant's decoded reply can give different ids than were generated, which
would miss the KV cache from that point on. So we keep the ids, render the whole conversation
with the chat template, and tokenize only the text that follows what the kept ids decode to.
"""
from __future__ import annotations


def render_chat(tokenizer, messages: list[dict]) -> str:
    if not messages:
        raise ValueError("messages is empty")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                or not isinstance(m.get("content"), str):
            raise ValueError("each message must be {'role': system|user|assistant, 'content': str}")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def continue_session_prompt(tokenizer, messages: list[dict], previous_ids: list[int] | None) -> list[int]:
    text = render_chat(tokenizer, messages)
    if previous_ids:
        prev_text = tokenizer.decode(previous_ids, skip_special_tokens=False)
        if prev_text and text.startswith(prev_text):
            return list(previous_ids) + tokenizer.encode(text[len(prev_text):], add_special_tokens=False)
    return tokenizer.encode(text, add_special_tokens=False)
