"""What one engine step computes, as plain data: the contract between scheduling and execution.

Why a type: the scheduler (with the KV manager) decides which sequences advance, by how many
tokens, where their KV goes and which positions need logits; the runner, the CUDA graphs, the
speculative decoder, prompt logprobs and the fairness counters all read that decision. As an
anonymous `[(seq, start, n)]` every reader re-derived the rest (and the runner called back into
the KV manager for block tables and slots while packing inputs). Here the decision is filled once
and only read afterwards, so execution depends on data, not on memory management.

Who fills it: `engine/core/scheduler.Scheduler.schedule()` (rows, block tables, slots, the logits
rows) and the engine loop (the copy-on-write copies the manager queued). Who reads it: the loop,
`engine/exec` (step inputs, CUDA graphs, the runner), speculation, prompt logprobs, fairness.

KV cache groups: a row holds one block table and one slot list per group (`block_tables[g]`,
`slots[g]`); a model whose layers all keep the same kind of KV has exactly one group, index 0.
State groups (a model with linear-attention layers): a row holds its state slot per group
(`state_slots`, one group: all the model's Gated DeltaNet layers); () for other models.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

LogitsKind = Literal["sample", "draft", "prompt_logprob"]


@dataclass(slots=True)
class ScheduledRow:
    """One sequence's share of a step: `num_tokens` tokens from position `start`.

    `seq` is the scheduler's own sequence object, for the loop and its helpers; execution never
    reads it (it reads `token_ids`, `positions`, `block_tables`, `slots`). `token_ids` are the ids
    computed this step: the sequence's own tokens, then draft tokens a speculative step scores past
    them. `block_tables[g]`: the sequence's physical blocks in KV cache group g, logical order;
    `slots[g]`: where each of this step's tokens is stored in group g (-1: not stored)."""

    seq_id: object
    seq: object
    start: int
    num_tokens: int
    token_ids: list[int]
    block_tables: tuple[list[int], ...]
    slots: tuple[list[int], ...]
    state_slots: tuple[int, ...] = ()  # the row's slot per state group (linear-attention layers)

    @property
    def end(self) -> int:
        """The context length once this step's tokens are computed."""
        return self.start + self.num_tokens

    @property
    def positions(self) -> range:
        return range(self.start, self.start + self.num_tokens)


@dataclass(frozen=True, slots=True)
class LogitsRow:
    """A position whose next-token logits the step returns: token `offset` of row `row`'s chunk.
    sample: the last real token of a sequence (its next token is sampled); draft: a draft token of
    a speculative row (its logits verify the next draft); prompt_logprob: a prompt position whose
    logprob was asked for (the next prompt token is scored, nothing sampled)."""

    row: int
    offset: int
    kind: LogitsKind


@dataclass(slots=True)
class StepPlan:
    """One step. `logits` lists sample and draft rows first, in row order, then prompt-logprob
    rows: the forward returns one logits row per entry, in this order. `copies`: (src, dst) block
    copies (copy-on-write) to do before the forward, in every layer of the pool. `state_copies`:
    (src, dst) state slots to copy before the forward, in order (a fork's copy on write, a
    checkpoint taken after the previous step or restored for a prefix hit; a src that is bytes is
    a state read from the KV tier, written into dst in its turn; engine/kv/state_groups.py)."""

    rows: list[ScheduledRow] = field(default_factory=list)
    logits: list[LogitsRow] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    state_copies: list[tuple[int | bytes, int]] = field(default_factory=list)  # (src, dst) slots
    # every logits row feeds only a plain greedy argmax (set by the engine, which knows the
    # requests: engine/sampling/sampler.argmax_suffices): the forward may then compute the LM head
    # only where a row can reach its argmax and leave -inf elsewhere (kernels/greedy_head.py)
    argmax_only: bool = False

    def __bool__(self) -> bool:
        return bool(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.rows)

    @property
    def max_num_tokens(self) -> int:
        """The longest chunk of the step (attention's max query length)."""
        return max((r.num_tokens for r in self.rows), default=0)

    @property
    def is_pure_decode(self) -> bool:
        """Every row computes one token and samples it (what a decode CUDA graph can replay)."""
        return all(r.num_tokens == 1 for r in self.rows) and len(self.logits) == len(self.rows)

    @property
    def sampled(self) -> list[LogitsRow]:
        """The sample and draft rows (the first entries of `logits`)."""
        return [lr for lr in self.logits if lr.kind != "prompt_logprob"]

    @property
    def prompt_logprob_rows(self) -> list[LogitsRow]:
        return [lr for lr in self.logits if lr.kind == "prompt_logprob"]
