"""KV cache groups: which layers keep which KV, and how they share one pool (value types only).

Why groups: a model may mix attention kinds. A sliding-window layer (Mistral, Gemma 3's local
layers, gpt-oss) reads only the last W positions, so its KV older than that is dead; a
full-attention layer reads every position. One block table per sequence for all layers would keep
every layer's KV for the whole context. Instead, layers of one kind form *groups*; each sequence
holds one block table per group, and a sliding group's table gives blocks back once no future
query of the group can read them (engine/kv/kv_cache_manager.py).

The layout (vLLM's "hybrid allocator" idea, written here): groups have the same number of layer
slots P, P = the layer count of the kind with the fewest layers, so ONE pool tensor

    kv_pool[2, P, num_blocks, block_size, kv_heads, row]

serves all groups: a block id belongs to one group at a time, and layer i reads
kv_pool[:, slot(i)] through its group's table. A kind with more layers fills several groups (the
last one may use fewer than P slots: padding). A model whose layers are all of one kind has one
group with P = num_layers: exactly the layout, block counts and hashes of a model without groups.

Window semantics (transformers' `sliding_window_overlay`, masking_utils: kv_idx > q_idx - W): the
query at position p reads positions p-W+1 .. p (W keys, itself included).

Which layer keeps which window is the model's description (engine/exec/models/decoder_spec.py reads
each family's config as transformers does); the runner builds the layout from it. This module is
the only part of engine/kv that execution imports (tests/engine/test_engine_wings.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

NULL_BLOCK = -1  # a released table entry in a step's plan: no kernel reads it (see step_inputs)


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """One group: its attention kind and the model layers in its pool slots (slot j = layers[j])."""

    sliding_window: int | None  # None: full attention; W: the query at p reads p-W+1 .. p
    layers: tuple[int, ...]

    @property
    def kind(self) -> str:
        return "full" if self.sliding_window is None else "sliding"

    @property
    def label(self) -> str:
        return "full" if self.sliding_window is None else f"sliding {self.sliding_window}"

    def first_readable(self, pos: int) -> int:
        """The first position a query at `pos` (or later) reads in this group."""
        return 0 if self.sliding_window is None else max(0, pos - self.sliding_window + 1)

    def first_live_block(self, pos: int, block_size: int) -> int:
        """Blocks [0, this) hold only positions no query at `pos` or later reads: a sliding
        group may release them once a step starting at `pos` is scheduled."""
        return self.first_readable(pos) // block_size

    def blocks_held(self, num_tokens: int, block_size: int, chunk: int) -> int:
        """The most blocks one sequence of `num_tokens` tokens holds in this group at once, when
        a step computes at most `chunk` tokens (a chunk's positions are all stored before the
        next step releases the ones that left the window)."""
        total = -(-num_tokens // block_size)
        if self.sliding_window is None:
            return total
        return min(total, -(-(self.sliding_window - 1 + chunk) // block_size) + 1)


def _group_layers(windows: Sequence[int | None]) -> tuple[list[KVCacheGroupSpec], int]:
    kinds: dict[int | None, list[int]] = {}
    for i, w in enumerate(windows):
        kinds.setdefault(w, []).append(i)
    # full attention first (group 0 of a model with any full layer), then wider windows first
    order = sorted(kinds, key=lambda w: (w is not None, -(w or 0)))
    p = min(len(v) for v in kinds.values())
    groups = [
        KVCacheGroupSpec(w, tuple(kinds[w][j : j + p]))
        for w in order
        for j in range(0, len(kinds[w]), p)
    ]
    return groups, p


@dataclass(frozen=True)
class KVCacheLayout:
    """The groups of a model and the pool's layer-slot count P. `layer_kv[i]` = (slot, group)."""

    groups: tuple[KVCacheGroupSpec, ...]
    pool_layers: int
    num_layers: int

    @classmethod
    def from_layer_windows(cls, windows: Sequence[int | None]) -> "KVCacheLayout":
        """One window per model layer (None: full attention). Each distinct value is a kind."""
        if not windows:
            raise ValueError("a model has at least one layer")
        for w in windows:
            if w is not None and (not isinstance(w, int) or w < 1):
                raise ValueError(f"a sliding window is a positive number of tokens, got {w!r}")
        groups, p = _group_layers(list(windows))
        return cls(tuple(groups), p, len(windows))

    @classmethod
    def single(cls, num_layers: int, sliding_window: int | None = None) -> "KVCacheLayout":
        """Every layer of one kind: one group, P = num_layers (the layout without groups)."""
        return cls.from_layer_windows([sliding_window] * num_layers)

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def layer_kv(self) -> tuple[tuple[int, int], ...]:
        """(pool slot, group) of every model layer, in layer order."""
        out: dict[int, tuple[int, int]] = {}
        for g, spec in enumerate(self.groups):
            for slot, layer in enumerate(spec.layers):
                out[layer] = (slot, g)
        return tuple(out[i] for i in range(self.num_layers))

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        return tuple(self.groups[g].sliding_window for _, g in self.layer_kv)

    @property
    def has_sliding(self) -> bool:
        return any(s.sliding_window is not None for s in self.groups)

    @property
    def padded_slots(self) -> int:
        """Pool layer slots no layer uses (the last group of a kind may be short)."""
        return sum(self.pool_layers - len(s.layers) for s in self.groups)

    def fingerprint(self) -> str:
        """What the KV tier's fingerprint adds for this layout: "" for one full-attention group
        (so the files of a model without groups stay valid), else the groups and their layers."""
        if self.num_groups == 1 and not self.has_sliding:
            return ""
        return ";groups=" + "|".join(
            f"{s.sliding_window or 'full'}:{','.join(map(str, s.layers))}" for s in self.groups
        )

    def max_tokens(self, num_blocks: int, block_size: int, chunk: int) -> int:
        """The longest sequence that fits in a pool of `num_blocks` on its own (so preemption
        can always make room for it); steps compute at most `chunk` tokens."""
        if not self.has_sliding:
            return num_blocks * block_size // self.num_groups
        full = any(s.sliding_window is None for s in self.groups)
        lo, hi = 0, num_blocks * block_size if full else 1 << 30  # windows alone: no pool bound
        while lo < hi:  # blocks_held grows with the length: bisect
            mid = (lo + hi + 1) // 2
            if sum(s.blocks_held(mid, block_size, chunk) for s in self.groups) <= num_blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def hit_blocks(self, num_full_blocks: int, block_size: int) -> int:
        """Blocks a prefix hit of `num_full_blocks` blocks holds over all groups: every block in
        a full group, the blocks of the last window before it in a sliding group."""
        k, pos = num_full_blocks, num_full_blocks * block_size
        return sum(k - min(k, s.first_live_block(pos, block_size)) for s in self.groups)
