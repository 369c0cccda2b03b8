"""Incremental detokenizer: stream text deltas that never split a character or leak a stop string.

Decoding token by token breaks multi-byte characters (one emoji can span several byte-level BPE
tokens) and drops the spaces some tokenizers attach to the next token. So we decode a short window
of recent tokens and emit only the part that grew and does not end in an incomplete character.
Stop strings may straddle deltas, so the last (longest stop - 1) characters are held back.
`keep`: special token ids whose text stays even when special tokens are skipped (harmony's channel
markers, engine/text/harmony.py: without them a gpt-oss reply's reasoning runs into its answer).
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


def decode_keeping(tokenizer, ids, keep: frozenset = frozenset()) -> str:
    """decode(ids, skip_special_tokens=True), except that the tokens in `keep` stay as their text."""
    ids = list(ids)
    if not keep or not keep.intersection(ids):
        return tokenizer.decode(ids, skip_special_tokens=True)
    parts, run = [], []
    for t in ids:  # runs between kept markers decode as before, markers as text
        if t in keep:
            parts.append(tokenizer.decode(run, skip_special_tokens=True) if run else "")
            parts.append(tokenizer.decode([t], skip_special_tokens=False))
            run = []
        else:
            run.append(t)
    parts.append(tokenizer.decode(run, skip_special_tokens=True) if run else "")
    return "".join(parts)


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer,
        prompt_ids: list[int],
        stop: list[str] | None = None,
        skip_special_tokens: bool = True,
        keep: frozenset = frozenset(),
    ):
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.keep = keep if skip_special_tokens else frozenset()
        self.stop = list(stop or [])
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = list(prompt_ids[-6:])  # a little left context for spacing
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""  # all decoded output text so far (after stop truncation)
        self.emitted = 0  # characters of self.text already handed out
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return (
            decode_keeping(self.tok, ids, self.keep)
            if self.skip
            else self.tok.decode(ids, skip_special_tokens=False)
        )

    def add(self, token_id: int) -> str:
        """Add one generated token; return the new text safe to show now."""
        if self.stopped:
            return ""
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT):
            search_from = max(0, len(self.text) - self.hold)
            self.text += full[len(prefix) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            hits = [p for p in (self.text.find(s, search_from) for s in self.stop) if p != -1]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
        return self._release(final=self.stopped)

    def flush(self) -> str:
        """At the end of a request: hand out whatever was held back."""
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        end = len(self.text) if final else max(self.emitted, len(self.text) - self.hold)
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta
