"""When the KV tier is used: load or recompute, swap or recompute, write-through or not.

Why a module of its own: these are cost decisions, and they are made from measured numbers
(the tier's own per-block read/write times, the engine's per-token compute time), not constants
scattered through the manager. Before anything is measured the tier is used (a load is a copy;
the first measurements then take over).

- load: a prefix-lookup miss that hits the tier loads those blocks if reading them is cheaper
  than computing their tokens; at most `max_load_blocks_per_step` blocks per engine step.
- swap: a preempted sequence's full blocks are written to the tier (those not there already)
  if the tier has room and writing + reading them back is cheaper than recomputing them.
- write-through: parked sessions' and pinned prompts' full blocks are written when they are
  parked / pinned (so they survive a restart); every other block is written back only when the
  pool evicts it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TierPolicy:
    max_load_blocks_per_step: int = 512
    write_through_parked: bool = True
    swap_on_preempt: bool = True
    compute_s_per_token: float = 0.0  # measured by the engine (EMA over forward steps)
    loaded_this_step: int = 0

    def observe_compute(self, tokens: int, seconds: float) -> None:
        """One forward of `tokens` tokens took `seconds` (prefill-sized steps only)."""
        if tokens >= 16 and seconds > 0:
            per = seconds / tokens
            self.compute_s_per_token = (
                per if not self.compute_s_per_token else 0.8 * self.compute_s_per_token + 0.2 * per
            )

    def new_step(self) -> None:
        self.loaded_this_step = 0

    def load_budget(self) -> int:
        return max(0, self.max_load_blocks_per_step - self.loaded_this_step)

    def should_load(self, n_blocks: int, block_size: int, load_s_per_block: float) -> bool:
        if n_blocks <= 0:
            return False
        if not self.compute_s_per_token or not load_s_per_block:
            return True
        return load_s_per_block <= block_size * self.compute_s_per_token

    def should_swap(
        self, n_new_blocks: int, n_blocks: int, block_size: int, write_s: float, load_s: float
    ) -> bool:
        """n_new_blocks must be written (the rest is in the tier already); n_blocks come back."""
        if n_blocks <= 0 or not self.swap_on_preempt:
            return False
        if not self.compute_s_per_token or not (write_s and load_s):
            return True
        return (
            n_new_blocks * write_s + n_blocks * load_s
            <= n_blocks * block_size * self.compute_s_per_token
        )
