"""The one end-of-sequence rule: which token ids end a reply.

Why one place: the engine stops on them, and the chat tells "the model ended its turn" from "a
stop sequence" or "max tokens" by them. Two copies (the model config's list vs the tokenizer's
single id) once disagreed for models whose config names several (Llama 3: <|eot_id|> and
<|end_of_text|>), so a reply the engine ended on one was shown as cut short.
"""

from __future__ import annotations

from engine.text.harmony import end_of_reply_ids


def end_of_turn_ids(hf_config, tokenizer) -> tuple[int, ...]:
    """Every id the model config's `eos_token_id` names (an int or a list) plus the tokenizer's
    `eos_token_id`, sorted; for a harmony tokenizer (gpt-oss) also `<|return|>` and `<|call|>`,
    the chat format's two ends of a reply (its config.json names one, its generation config both)."""
    ids: set[int] = set()
    for src in (getattr(hf_config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(i) for i in src)
    ids.update(end_of_reply_ids(tokenizer))
    return tuple(sorted(ids))
