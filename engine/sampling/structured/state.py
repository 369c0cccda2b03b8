"""One sequence's grammar state: the matcher, advanced by exactly the tokens the sequence keeps.

Why it needs no work on preemption: preemption by recompute keeps a sequence's token ids and
recomputes only their KV, so the matcher, which has consumed those same ids, is still right.
An n > 1 fork copies the parent's state (the parent has consumed nothing new at fork time).

Lazy specs (a trigger string) keep no matcher until the sequence's output text contains the
trigger; the text after the trigger inside the same token is fed to the new matcher.
"""

from __future__ import annotations

from engine.sampling.structured.spec import StructuredSpec


class GrammarState:
    def __init__(self, spec: StructuredSpec, compiler, matcher):
        self.spec = spec
        self._compiler = compiler
        self.matcher = matcher  # None: a lazy spec not yet triggered
        self._text = ""  # output text seen so far (lazy specs, until triggered)
        self.error: str | None = None

    @classmethod
    def start(cls, spec: StructuredSpec, compiler, compiled=None) -> "GrammarState":
        """A new sequence's state; `compiled` is the matcher LLM.submit compiled (None: compile
        now). A lazy spec starts without one (it was compiled at submit only to check it)."""
        if spec.trigger:
            return cls(spec, compiler, None)
        return cls(spec, compiler, compiled if compiled is not None else compiler.matcher(spec))

    def fork(self) -> "GrammarState":
        child = GrammarState(
            self.spec,
            self._compiler,
            self.matcher.deep_copy() if self.matcher is not None else None,
        )
        child._text, child.error = self._text, self.error
        return child

    @property
    def active(self) -> bool:
        """This step's logits must be masked."""
        return self.matcher is not None and self.error is None and not self.matcher.is_stopped()

    @property
    def done(self) -> bool:
        """The grammar is complete: nothing more may follow (the sequence ends with "stop")."""
        return self.matcher is not None and self.matcher.is_stopped()

    def fill(self, row) -> None:
        """Write the allowed-token bitmask into `row` (a contiguous CPU int32 tensor)."""
        self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())

    def accept(self, token: int, text: str) -> None:
        """Advance by the sampled token (and its detokenized text, for the trigger)."""
        if self.error is not None:
            return
        if self.matcher is not None:
            if not self.matcher.consume_token(token):
                self.error = self.matcher.get_error() or f"token {token} was not allowed"
            return
        self._text += text
        at = self._text.find(self.spec.trigger)
        if at < 0:
            keep = len(self.spec.trigger) - 1  # only a trigger's start can straddle tokens
            self._text = self._text[-keep:] if keep else ""
            return
        tail = self._text[at + len(self.spec.trigger) :]
        self.matcher = self._compiler.matcher(self.spec)
        if tail and not self.matcher.consume_tokens(self._compiler.tokenize(tail)):
            self.error = f"the text after {self.spec.trigger!r} does not fit the grammar"
