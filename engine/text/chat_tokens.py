"""Tokenize a chat so that special tokens come only from the chat template, never from messages.

Rendering the template to one string and encoding it lets a user who types `<|im_start|>system`
(ChatML), `<start_of_turn>` (Gemma), `<|start_header_id|>` (Llama 3), `<|user|>` (Phi) or `<think>`
(Qwen3, SmolLM3) get that real token, i.e. fake a turn or a reasoning block. So before rendering,
every added-token string inside a message is replaced by an escape (`\\ue000<k>\\ue001`, private-use
code points no template writes, the original kept in a table). Every added-token string in the
rendered text is then the template's own and becomes its id; an escape becomes its original
characters again, encoded one character at a time, so it can never be the token; everything else
between two template tokens (template text and message text joined, exactly as rendered) is encoded
plainly. The tokenizer's own flags are not enough: `split_special_tokens=True` stops only tokens
flagged special, and tokenizers add some that are not (Qwen3's `<think>`, `</think>`,
`<tool_call>`): those would still turn into their ids.

Why this keeps HF's ids for ordinary messages: the tokenizer itself first splits the whole string
at every added token and encodes the pieces between them independently. Without markers inside
messages nothing is escaped, the rendered text is HF's and our pieces are exactly its pieces, so the
ids are identical (tested against `apply_chat_template(tokenize=True)` with awkward whitespace).
Encoding each message on its own would not be: byte-level BPE pre-tokenization can merge across the
template/message boundary ("\\n" + "\\n\\nHi"). Templates that rewrite content (trim it, split
it) rewrite the escaped text the same way, so they need no special case.

One exception, by role: the reasoning markers (`<think>`, `</think>`) in an *assistant* message
stay as they are, because they are the model's own reply and the template must see them to drop
past reasoning from the history (Qwen3's does); a user or system message never gets them.
gpt-oss's harmony replies are the exception to the exception: a stored reply's channels are taken
apart first (engine/text/harmony.split_reply: the analysis goes to `thinking`, the field its
template reads, the rest to `content`), so every harmony marker in any message is escaped and the
template alone decides whether past analysis comes back (gpt-oss's drops it once a final exists).
"""

from __future__ import annotations

import re

from engine.text import harmony
from engine.text.reasoning import MARKERS as REASONING_MARKERS

_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use code points: never produced by a template
_ESC_RE = re.compile(_OPEN + "(\\d+)" + _CLOSE)
PLAIN, SPECIAL, LITERAL = "plain", "special", "literal"  # segment kinds (chat_segments)


REASONING_EFFORTS = ("low", "medium", "high")  # gpt-oss's template: "Reasoning: <effort>"


def render_chat(
    tokenizer,
    messages: list[dict],
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    enable_thinking: bool | None = None,
    reasoning_effort: str | None = None,
) -> str:
    """The template's text. `continue_final_message` (with add_generation_prompt False): the text
    ends inside the last (assistant) message, so the model continues that message (vLLM's field).
    `enable_thinking` (None: the template's default) goes to templates that have the switch (Qwen3,
    SmolLM3); an assistant message may carry `reasoning_content` (or `thinking`, gpt-oss's name)
    for templates that read it. `reasoning_effort` (low / medium / high; None: the template's
    default) goes to templates that read it (gpt-oss)."""
    if not messages:
        raise ValueError("messages is empty")
    for m in messages:
        if (
            not isinstance(m, dict)
            or m.get("role") not in ("system", "user", "assistant")
            or not isinstance(m.get("content"), str)
            or not isinstance(m.get("reasoning_content", ""), str)
            or not isinstance(m.get("thinking", ""), str)
        ):
            raise ValueError("each message must be {'role': system|user|assistant, 'content': str}")
    if continue_final_message and (add_generation_prompt or messages[-1]["role"] != "assistant"):
        raise ValueError(
            "continue_final_message needs add_generation_prompt false and an assistant message last"
        )
    extra = {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}
    if reasoning_effort is not None:
        if reasoning_effort not in REASONING_EFFORTS:
            raise ValueError(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}")
        extra["reasoning_effort"] = reasoning_effort
    return tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        **extra,
    )


def _special_strings(tokenizer) -> list[str]:
    added = getattr(tokenizer, "get_added_vocab", lambda: {})()
    return sorted(
        set(added) | set(getattr(tokenizer, "all_special_tokens", [])), key=len, reverse=True
    )


def _escaper(specials: list[str], table: list[str]):
    """text -> text with every string of `specials` (and the escape's own characters) escaped."""
    strings = [s for s in specials if s] + [_OPEN, _CLOSE]
    pattern = re.compile("|".join(map(re.escape, strings)))

    def escape(text: str) -> str:
        def sub(m):
            table.append(m.group(0))
            return f"{_OPEN}{len(table) - 1}{_CLOSE}"

        return pattern.sub(sub, text)

    return escape


def chat_segments(tokenizer, messages: list[dict], **mode) -> tuple[str, list[tuple[str, str]]]:
    """(the conversation's text, [(piece, kind), ...] covering it): kind SPECIAL is a template token,
    LITERAL a token string typed inside a message (kept as characters), PLAIN anything else.
    `mode`: render_chat's flags."""
    specials = _special_strings(tokenizer)
    table: list[str] = []
    everywhere = _escaper(specials, table)
    in_replies = _escaper([s for s in specials if s not in REASONING_MARKERS], table)
    harmonic = harmony.is_harmony(tokenizer)
    escaped = []
    for m in messages:
        esc = in_replies if m.get("role") == "assistant" and not harmonic else everywhere
        if harmonic and m.get("role") == "assistant":
            m = _harmony_reply(m)
        e = dict(m, content=esc(m["content"]))
        for key in ("reasoning_content", "thinking"):
            if isinstance(m.get(key), str):
                e[key] = esc(m[key])
        escaped.append(e)
    rendered = render_chat(tokenizer, escaped, **mode)
    split_re = re.compile("(" + "|".join(map(re.escape, specials)) + ")") if specials else None
    segments: list[tuple[str, str]] = []
    for k, piece in enumerate(split_re.split(rendered) if split_re else [rendered]):
        if not piece:
            continue
        if k % 2 == 1:
            segments.append((piece, SPECIAL))
            continue
        pos = 0
        for esc_m in _ESC_RE.finditer(piece):
            if esc_m.start() > pos:
                segments.append((piece[pos : esc_m.start()], PLAIN))
            index = int(esc_m.group(1))
            segments.append(
                (table[index], LITERAL) if index < len(table) else (esc_m.group(0), PLAIN)
            )
            pos = esc_m.end()
        if pos < len(piece):
            segments.append((piece[pos:], PLAIN))
    return "".join(s for s, _ in segments), segments


def _harmony_reply(m: dict) -> dict:
    """A harmony assistant message as its template takes it: the stored reply's analysis in
    `thinking`, its other channels' text in `content` (an API caller's `reasoning_content` is the
    same analysis)."""
    analysis, content = harmony.split_reply(m["content"])
    thinking = m.get("thinking") or m.get("reasoning_content") or analysis
    out = {k: v for k, v in m.items() if k != "reasoning_content"}
    out["content"] = content
    if thinking:
        out["thinking"] = thinking
    return out


def chat_text(tokenizer, messages: list[dict], **mode) -> str:
    """The text the prompt's ids decode to (render_chat's text, unless a template treats a typed
    marker otherwise than its escape: then the escape's reading, which is what is encoded)."""
    return chat_segments(tokenizer, messages, **mode)[0]


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)


def encode_chat(tokenizer, messages: list[dict], start_char: int = 0, **mode) -> list[int]:
    """Token ids of the rendered chat from character `start_char` on (0: all of it)."""
    return encode_segments(tokenizer, chat_segments(tokenizer, messages, **mode)[1], start_char)


def encode_segments(tokenizer, segments: list[tuple[str, str]], start_char: int = 0) -> list[int]:
    """encode_chat of segments rendered already (chat_segments), so a caller that also needs the
    text or the special-token check renders the template once."""
    ids: list[int] = []
    plain: list[str] = []

    def flush() -> None:
        if plain:
            ids.extend(_encode(tokenizer, "".join(plain)))
            plain.clear()

    pos = 0
    for seg, kind in segments:
        end = pos + len(seg)
        if end <= start_char:
            pos = end
            continue
        if pos < start_char:  # the cut falls inside this segment: keep its tail
            seg, kind = seg[start_char - pos :], (LITERAL if kind == LITERAL else PLAIN)
        if kind == PLAIN:
            plain.append(seg)
        else:
            flush()
            if kind == SPECIAL:
                ids.append(tokenizer.convert_tokens_to_ids(seg))
            else:  # typed marker: one character at a time, never the token
                for ch in seg:
                    ids.extend(_encode(tokenizer, ch))
        pos = end
    flush()
    return ids


def specials_where_template_puts_them(
    tokenizer, messages: list[dict], ids: list[int], segments=None, **mode
) -> bool:
    """True when every special token in `ids` (kept ids of an earlier turn: generated, stored,
    or imported) stands exactly where the template of `messages` puts one, and none is missing.

    Why: kept ids are reused as the next prompt's prefix when they decode to the start of the
    rendered conversation. A decode check alone cannot tell a real `<|im_start|>` from the same
    characters typed as text, so a crafted export (or ids once made by encoding rendered text)
    could plant a fake system turn in every later prompt (#29.3, #29.4). Template-less specials
    make this return False, and the caller re-derives the ids from the text instead.
    `segments`: chat_segments(messages) when the caller rendered them already."""
    if segments is None:
        _, segments = chat_segments(tokenizer, messages, **mode)
    special_ids = {tokenizer.convert_tokens_to_ids(s): s for s in _special_strings(tokenizer)}
    expected, pos = [], 0
    for seg, kind in segments:
        if kind == SPECIAL:
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
