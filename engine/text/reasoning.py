"""A thinking model's reply split into its reasoning and its answer (Qwen3, SmolLM3: <think>...</think>;
gpt-oss: harmony's analysis channel, engine/text/harmony.py, picked by the markers).

Why here: the OpenAI routes (`reasoning_content`, streamed and not), the chat (reasoning folded under
the reply, with its token count) and the batch API (`CompletionOutput.reasoning`) must split the same
way, and a stream must split as it arrives without ever showing half a marker.

The rule (as vLLM's reasoning parsers): a reply that starts (after whitespace) with the start
marker is reasoning up to the end marker, then answer; a reply that does not is all answer. When the
prompt itself opened a reasoning block (its last start marker is after its last end marker: a
template that writes "<think>\\n" into the generation prompt), the reply starts inside reasoning.
The newlines templates put right after either marker are dropped, as are those just before the end
marker; nothing else is changed. A reply cut short inside reasoning has reasoning and no answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.text import harmony

MARKERS = ("<think>", "</think>")
HARMONY_MARKERS = harmony.HARMONY_MARKERS


def reasoning_markers(tokenizer) -> tuple[str, str] | tuple:
    """The model's (start, end) markers when its tokenizer has both as tokens of their own
    (harmony's HARMONY_MARKERS when it has harmony's structure tokens), else ()."""
    if harmony.is_harmony(tokenizer):
        return HARMONY_MARKERS
    added = getattr(tokenizer, "get_added_vocab", dict)() or {}
    return MARKERS if all(m in added for m in MARKERS) else ()


def prompt_opens_reasoning(prompt_ids, tokenizer, markers) -> bool:
    """The prompt ends inside a reasoning block (its last start marker after its last end marker).
    Never for harmony: its generation prompt ends before the reply's first header."""
    if not markers or tuple(markers) == HARMONY_MARKERS:
        return False
    start, end = (tokenizer.convert_tokens_to_ids(m) for m in markers)
    ids = list(prompt_ids)
    last = {t: i for i, t in enumerate(ids) if t in (start, end)}
    return last.get(start, -1) > last.get(end, -1)


@dataclass(frozen=True)
class Split:
    reasoning: str | None  # None: the reply has no reasoning block
    content: str
    reasoning_tokens: int = 0  # generated tokens strictly inside the block


class ReasoningParser:
    """Streaming split: feed() each text delta, finish() once; both return (reasoning, content) deltas."""

    def __init__(self, markers=MARKERS, inside: bool = False):
        self.start, self.end = markers
        self.state = "reasoning" if inside else "undecided"
        self.seen_reasoning = inside
        self.buf = ""
        self._lead = True  # drop newlines at the start of the current part

    def _emit(self, text: str) -> str:
        if self._lead:
            text = text.lstrip("\n")
            self._lead = not text
        return text

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        reasoning = content = ""
        while True:
            if self.state == "undecided":
                head = self.buf.lstrip()
                if not head or (self.start.startswith(head) and head != self.start):
                    return reasoning, content  # still could be the start marker
                if head.startswith(self.start):
                    self.state, self.seen_reasoning, self._lead = "reasoning", True, True
                    self.buf = head[len(self.start) :]
                    continue
                self.state, self._lead = "content", False  # no reasoning: the reply as it is
                continue
            if self.state == "reasoning":
                k = self.buf.find(self.end)
                if k >= 0:
                    reasoning += self._emit(self.buf[:k].rstrip("\n"))
                    self.buf, self.state, self._lead = (
                        self.buf[k + len(self.end) :],
                        "content",
                        True,
                    )
                    continue
                keep = _partial_suffix(self.buf, self.end)
                body = self.buf[: len(self.buf) - keep]
                hold = len(body) - len(body.rstrip("\n"))  # newlines may precede the end marker
                reasoning += self._emit(body[: len(body) - hold])
                self.buf = self.buf[len(body) - hold :]
                return reasoning, content
            content += self._emit(self.buf)
            self.buf = ""
            return reasoning, content

    def finish(self) -> tuple[str, str]:
        """Whatever was held back: an unclosed block's tail is reasoning, anything else answer."""
        rest, self.buf = self.buf, ""
        if self.state == "reasoning":
            return self._emit(rest.rstrip("\n")), ""
        return "", self._emit(rest) if self.state == "content" else rest


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def split_reasoning(
    text: str,
    token_ids=(),
    markers=MARKERS,
    inside: bool = False,
    marker_ids: tuple[int, int] | None = None,
) -> Split:
    """The whole reply at once (the batch API, stored replies); token count from `marker_ids`."""
    p = ReasoningParser(markers, inside)
    r1, c1 = p.feed(text)
    r2, c2 = p.finish()
    if not p.seen_reasoning:
        return Split(None, c1 + c2, 0)
    return Split(r1 + r2, c1 + c2, reasoning_token_count(token_ids, marker_ids, inside))


def reasoning_token_count(
    token_ids, marker_ids: tuple[int, int] | None, inside: bool = False
) -> int:
    """Generated tokens strictly between the start and end marker tokens (from the first token when
    the prompt opened the block; to the end when it never closed)."""
    if not marker_ids:
        return 0
    start, end = marker_ids
    ids = list(token_ids)
    if inside:
        i = -1
    elif start in ids:
        i = ids.index(start)
    else:
        return 0
    j = ids.index(end, i + 1) if end in ids[i + 1 :] else len(ids)
    return j - i - 1


@dataclass(frozen=True)
class ReasoningSplit:
    """How one request's replies split: the model's markers, their ids, whether the prompt opened a
    block. One rule for every reader of a stream: the OpenAI routes (reasoning_content) and the
    chat (the folded reasoning and its token count)."""

    markers: tuple
    ids: tuple
    inside: bool
    # harmony only: its marker ids by name, and the tokenizer that reads a header's channel
    harmony_ids: dict = field(default_factory=dict)
    tokenizer: object = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, tokenizer, markers, prompt_ids) -> ReasoningSplit | None:
        if not markers:
            return None
        ids = tuple(tokenizer.convert_tokens_to_ids(m) for m in markers)
        if tuple(markers) == HARMONY_MARKERS:
            added = tokenizer.get_added_vocab()
            return cls(
                HARMONY_MARKERS,
                ids,
                False,
                {m: added[m] for m in harmony._ALL if m in added},
                tokenizer,
            )
        return cls(tuple(markers), ids, prompt_opens_reasoning(prompt_ids, tokenizer, markers))

    @property
    def is_harmony(self) -> bool:
        return self.markers == HARMONY_MARKERS

    def parser(self):
        """A streaming parser (feed / finish -> (reasoning, content) deltas) for this format."""
        return (
            harmony.HarmonyParser()
            if self.is_harmony
            else ReasoningParser(self.markers, self.inside)
        )

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def tokens(self, token_ids) -> int:
        if self.is_harmony:
            return harmony.reasoning_token_count(token_ids, self.harmony_ids, self._decode)
        return reasoning_token_count(token_ids, self.ids, self.inside)

    def split(self, text: str, token_ids=()) -> Split:
        """A whole reply (so far) split, with its reasoning token count. A harmony reply without an
        analysis message has an empty reasoning (its headers are never answer text)."""
        if self.is_harmony:
            reasoning, content = harmony.split_reply(text)
            return Split("" if reasoning is None else reasoning, content, self.tokens(token_ids))
        return split_reasoning(text, token_ids, self.markers, self.inside, self.ids)


def split_stored(text: str, inside: bool) -> Split:
    """A stored reply split whichever model wrote it: harmony when it starts with harmony's
    markers, else the <think> rule (`inside`: the prompt opened the block). Token count 0."""
    head = text.lstrip()
    if head.startswith((harmony.CHANNEL, harmony.START)):
        reasoning, content = harmony.split_reply(text)
        return Split("" if reasoning is None else reasoning, content, 0)
    return split_reasoning(text, (), MARKERS, inside)


def split_outputs(out, tokenizer, markers):
    """A finished RequestOutput's replies with reasoning, answer and reasoning token count filled in
    (engine/outputs.CompletionOutput); unchanged for a model without markers."""
    rule = ReasoningSplit.of(tokenizer, markers, out.prompt_token_ids)
    if rule is None:
        return out
    for o in out.outputs:
        sp = rule.split(o.text, o.token_ids)
        o.reasoning, o.content, o.reasoning_tokens = sp.reasoning, sp.content, sp.reasoning_tokens
    return out
