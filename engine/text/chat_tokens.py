"""Tokenize a chat so that special tokens come only from the chat template, never from messages.

Rendering the template to one string and encoding it lets a user who types `<|im_start|>system`
get a real special token, i.e. fake a system or assistant turn. We render once with a placeholder
per message, which tells template text apart from message text. Template text is split at the
tokenizer's added-token strings (those become their ids); everything between two such tokens
(template text and message text joined, exactly as in the rendered string) is encoded with
`split_special_tokens=True`, so markers inside messages stay plain text.

Why this keeps HF's ids for ordinary messages: the tokenizer itself first splits the whole string
at every added token and encodes the pieces between them independently. Without markers inside
messages, our pieces are exactly those pieces, so the ids are identical (tested against
`apply_chat_template(tokenize=True)` with awkward whitespace). Encoding each message on its own
would not be: byte-level BPE pre-tokenization can merge across the template/message boundary
("\\n" + "\\n\\nHi").

A template that rewrites message content (e.g. trims it) makes the placeholder render differ from
the real one; then we cannot tell the parts apart, so a message containing an added-token string
is refused with ValueError, and ordinary messages are encoded the plain way.
"""
from __future__ import annotations

import re

_MARK = "\ue000{}\ue001"            # private-use code points: never produced by a template
_MARK_RE = re.compile("\ue000(\\d+)\ue001")


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                continue_final_message: bool = False) -> str:
    """The template's text. `continue_final_message` (with add_generation_prompt False): the text
    ends inside the last (assistant) message, so the model continues that message (vLLM's field)."""
    if not messages:
        raise ValueError("messages is empty")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                or not isinstance(m.get("content"), str):
            raise ValueError("each message must be {'role': system|user|assistant, 'content': str}")
    if continue_final_message and (add_generation_prompt or messages[-1]["role"] != "assistant"):
        raise ValueError("continue_final_message needs add_generation_prompt false and an assistant message last")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         continue_final_message=continue_final_message)


def _special_strings(tokenizer) -> list[str]:
    added = getattr(tokenizer, "get_added_vocab", lambda: {})()
    return sorted(set(added) | set(getattr(tokenizer, "all_special_tokens", [])), key=len, reverse=True)


def chat_segments(tokenizer, messages: list[dict], **mode) -> tuple[str, list[tuple[str, bool]] | None]:
    """(rendered text, [(text, is_special_token)...] covering it), or segments None when the
    template rewrites message content (see the module doc). `mode`: render_chat's flags."""
    text = render_chat(tokenizer, messages, **mode)
    marked = [dict(m, content=_MARK.format(i)) for i, m in enumerate(messages)]
    skeleton = render_chat(tokenizer, marked, **mode)
    specials = _special_strings(tokenizer)
    split_re = re.compile("(" + "|".join(map(re.escape, specials)) + ")") if specials else None
    segments: list[tuple[str, bool]] = []
    pos = 0

    def template_text(part: str) -> None:
        for k, piece in enumerate(split_re.split(part) if split_re else [part]):
            if piece:
                segments.append((piece, k % 2 == 1))

    for match in _MARK_RE.finditer(skeleton):
        template_text(skeleton[pos:match.start()])
        index = int(match.group(1))
        if index >= len(messages):
            return text, None
        if messages[index]["content"]:
            segments.append((messages[index]["content"], False))
        pos = match.end()
    template_text(skeleton[pos:])
    if "".join(s for s, _ in segments) != text:
        return text, None
    return text, segments


def encode_chat(tokenizer, messages: list[dict], start_char: int = 0, **mode) -> list[int]:
    """Token ids of the rendered chat from character `start_char` on (0: all of it)."""
    text, segments = chat_segments(tokenizer, messages, **mode)
    if segments is None:
        specials = _special_strings(tokenizer)
        for m in messages:
            if any(s in m["content"] for s in specials):
                raise ValueError("a message contains a special token marker, and this model's chat "
                                 "template rewrites messages, so it cannot be kept as plain text")
        return tokenizer.encode(text[start_char:], add_special_tokens=False)
    ids: list[int] = []
    plain: list[str] = []

    def flush() -> None:
        if plain:
            ids.extend(tokenizer.encode("".join(plain), add_special_tokens=False, split_special_tokens=True))
            plain.clear()

    pos = 0
    for seg, special in segments:
        end = pos + len(seg)
        if end <= start_char:
            pos = end
            continue
        if pos < start_char:                    # the cut falls inside this segment: keep its tail
            seg, special = seg[start_char - pos:], False
        if special:
            flush()
            ids.append(tokenizer.convert_tokens_to_ids(seg))
        else:
            plain.append(seg)
        pos = end
    flush()
    return ids


def specials_where_template_puts_them(tokenizer, messages: list[dict], ids: list[int]) -> bool:
    """True when every special token in `ids` (kept ids of an earlier turn: generated, stored,
    or imported) stands exactly where the template of `messages` puts one, and none is missing.

    Why: kept ids are reused as the next prompt's prefix when they decode to the start of the
    rendered conversation. A decode check alone cannot tell a real `<|im_start|>` from the same
    characters typed as text, so a crafted export (or ids once made by encoding rendered text)
    could plant a fake system turn in every later prompt (#29.3, #29.4). Template-less specials
    make this return False, and the caller re-derives the ids from the text instead."""
    text, segments = chat_segments(tokenizer, messages)
    special_ids = {tokenizer.convert_tokens_to_ids(s): s for s in _special_strings(tokenizer)}
    if segments is None:      # messages cannot hold markers here (encode_chat refuses them), so
        return True           # every special string in the text is the template's own
    expected, pos = [], 0
    for seg, special in segments:
        if special:
            expected.append((pos, seg))
        pos += len(seg)
    found, pos, run = [], 0, []
    for t in list(ids) + [None]:
        if t is None or t in special_ids:
            if run:
                pos += len(tokenizer.decode(run, skip_special_tokens=False))
                run = []
            if t is not None:
                found.append((pos, special_ids[t]))
                pos += len(special_ids[t])
        else:
            run.append(t)
    return found == [e for e in expected if e[0] < pos]
