"""gpt-oss's chat format ("harmony"): a reply is a run of messages, each with a channel, and only
the `analysis` channel is reasoning.

A reply after the generation prompt `<|start|>assistant` reads, token by token:

    <|channel|>analysis<|message|>...reasoning...<|end|>
    <|start|>assistant<|channel|>final<|message|>...answer...<|return|>

(`<|call|>` ends a reply that calls a tool; `commentary` is the channel of tool calls and of
preambles the user may see.) Why its own file: the `<think>` rule (engine/text/reasoning.py) looks
for one block at the start of the reply; here the structure is a header (role, channel, recipient)
then a body, repeated, and the markers are special tokens, so the engine keeps them in the reply's
text (`structure_ids`: the detokenizer would otherwise drop them and "analysis" would run into the
answer). reasoning.py stays the one place readers go to: its ReasoningSplit picks this parser when
the model's markers are HARMONY_MARKERS.

What is reasoning and what is answer: the bodies of `analysis` messages are reasoning, every other
body (final, commentary) is answer, headers and markers are neither. The chat template, not this
file, decides what of a past reply goes back into the next prompt: `split_reply` hands it the
analysis as `thinking` (the field gpt-oss's template reads) and the rest as `content`.
"""

from __future__ import annotations

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
RETURN, CALL, CONSTRAIN = "<|return|>", "<|call|>", "<|constrain|>"
# what ModelInfo.reasoning_markers holds for a harmony model: (a body's start, its end)
HARMONY_MARKERS = (MESSAGE, END)
# kept in a reply's text so it can be split; RETURN / CALL end a reply and are dropped like EOS
STRUCTURE = (START, END, MESSAGE, CHANNEL, CONSTRAIN)
END_OF_REPLY = (RETURN, CALL)
_BODY_ENDS = (END, RETURN, CALL, START, CHANNEL)
_ALL = STRUCTURE + END_OF_REPLY
REASONING_CHANNEL = "analysis"


def is_harmony(tokenizer) -> bool:
    """The tokenizer has harmony's structure and end-of-reply tokens as tokens of their own."""
    added = getattr(tokenizer, "get_added_vocab", dict)() or {}
    return all(m in added for m in (START, END, MESSAGE, CHANNEL, RETURN))


def structure_ids(tokenizer) -> frozenset:
    """Ids of the markers a harmony reply's text keeps (empty for any other tokenizer)."""
    if tokenizer is None or not is_harmony(tokenizer):
        return frozenset()
    added = tokenizer.get_added_vocab()
    return frozenset(added[m] for m in STRUCTURE if m in added)


def end_of_reply_ids(tokenizer) -> tuple[int, ...]:
    """`<|return|>` and `<|call|>` for a harmony tokenizer: a model's config may name only one."""
    if tokenizer is None or not is_harmony(tokenizer):
        return ()
    added = tokenizer.get_added_vocab()
    return tuple(added[m] for m in END_OF_REPLY if m in added)


def _channel(header: str) -> str:
    """The channel named in a header ("assistant<|channel|>final", "analysis", "commentary to=x")."""
    k = header.rfind(CHANNEL)
    rest = header[k + len(CHANNEL) :] if k >= 0 else header
    rest = rest.split(CONSTRAIN)[0].strip()
    return rest.split()[0] if rest.split() else ""


def _partial(text: str) -> int:
    """Length of the longest end of `text` that may still grow into a marker."""
    for n in range(min(len(text), max(map(len, _ALL)) - 1), 0, -1):
        if any(m.startswith(text[-n:]) for m in _ALL):
            return n
    return 0


class HarmonyParser:
    """Streaming split with ReasoningParser's interface: feed() text deltas, finish() once; both
    return (reasoning, content) deltas. A reply that does not start with a marker is all answer
    (a model that ignores the format is still shown)."""

    def __init__(self):
        self.state = "undecided"  # -> header | body | plain
        self.header = ""
        self.reasoning_body = False
        self.seen_reasoning = False
        self.buf = ""

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        out = {True: "", False: ""}
        while self.buf:
            if self.state == "undecided":
                head = self.buf.lstrip()
                if not head or any(m.startswith(head) and m != head for m in (START, CHANNEL)):
                    break
                self.state = "header" if head.startswith((START, CHANNEL)) else "plain"
                continue
            if self.state == "plain":
                out[False] += self.buf
                self.buf = ""
                break
            if self.state == "header":
                k = self.buf.find(MESSAGE)
                if k < 0:
                    break
                self.header += self.buf[:k]
                self.buf = self.buf[k + len(MESSAGE) :]
                self.reasoning_body = _channel(self.header) == REASONING_CHANNEL
                self.seen_reasoning |= self.reasoning_body
                self.state, self.header = "body", ""
                continue
            hits = [(k, m) for m in _BODY_ENDS if (k := self.buf.find(m)) >= 0]
            if hits:
                k, m = min(hits)
                out[self.reasoning_body] += self.buf[:k]
                # a body ends at <|end|> / <|return|> / <|call|>; a new header may follow at once
                self.buf = self.buf[k + len(m) :] if m in (END, RETURN, CALL) else self.buf[k:]
                self.state = "header"
                continue
            keep = _partial(self.buf)
            out[self.reasoning_body] += self.buf[: len(self.buf) - keep]
            self.buf = self.buf[len(self.buf) - keep :]
            break
        return out[True], out[False]

    def finish(self) -> tuple[str, str]:
        """What was held back: a body's tail goes where the body went; an unfinished header is dropped."""
        rest, self.buf = self.buf, ""
        if self.state == "body":
            return (rest, "") if self.reasoning_body else ("", rest)
        return ("", rest) if self.state in ("plain", "undecided") else ("", "")


def reasoning_token_count(token_ids, marker_ids: dict, decode) -> int:
    """Generated tokens inside analysis bodies: after a `<|message|>` whose header (the ids since
    the last `<|channel|>`, read with `decode`) names the analysis channel, up to the body's end
    marker. Decoded, not compared by id: a sampled header may spell "analysis" in other tokens."""
    channel, message = marker_ids.get(CHANNEL), marker_ids.get(MESSAGE)
    ends = {marker_ids[m] for m in _BODY_ENDS if m in marker_ids}
    n, header, inside, in_header = 0, [], False, False
    for t in token_ids:
        if inside:
            if t in ends:
                inside, in_header, header = False, t == channel, []
            else:
                n += 1
        elif t == channel:
            in_header, header = True, []
        elif t == message:
            inside = in_header and _channel(decode(header)) == REASONING_CHANNEL
            in_header = False
        elif in_header:
            header.append(t)
    return n


def split_reply(text: str) -> tuple[str | None, str]:
    """(analysis, everything else) of a stored harmony reply, for the template's `thinking` and
    `content` fields; (None, text) when the text has no harmony structure."""
    p = HarmonyParser()
    r1, c1 = p.feed(text)
    r2, c2 = p.finish()
    if p.state == "plain":
        return None, text
    return (r1 + r2 if p.seen_reasoning else None), c1 + c2
