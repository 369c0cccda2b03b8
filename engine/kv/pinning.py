"""Pinned prefixes: shared system prompts whose KV blocks the app holds, so they are never evicted.

Why: a prefix cache alone keeps a system prompt only while some chat holds it or while nothing
needs its free blocks; under pressure, the first chat after a quiet spell re-prefills hundreds of
tokens. A pin is one more reference (refcount + 1) held by the app, not by any conversation, so
the blocks stay "used" even when no chat is open, and every new chat whose prompt starts with
the pinned tokens attaches to them through the ordinary prefix-cache lookup (refcount + 1) and
computes only its own tokens.

How a pin is made: the prompt is prefilled as an ordinary request first (its full blocks are
hashed as their KV is scheduled); `pin` then finds those blocks by their chain hashes and adds
the app's reference. Only full blocks are pinned (a partial block cannot be shared by hash).
With KV cache groups (engine/kv/cache_spec.py) a pin holds what a prefix hit at its end needs:
every block in a full-attention group, the last window's blocks in a sliding group
(engine/kv/prefix_hit.py), and the cap counts the blocks of all groups.
Pins are bounded: all pins together may hold at most `max_fraction` of the pool. Unpinning
drops the app's reference: the blocks fall back to cached-free, or stay held by the chats that
still use them.

One engine thread calls this (through KVCacheManager.pins), so there are no locks.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.kv.block_hash import walk_blocks
from engine.kv.block_pool import Block, BlockPool
from engine.kv.cache_spec import KVCacheLayout
from engine.kv.prefix_hit import cached_block
from engine.errors import KVCacheError
from engine.observe.kv_contract import PinView

DEFAULT_MAX_PIN_FRACTION = 0.10  # EngineConfig.max_pin_fraction's default too


class PinCapError(KVCacheError, ValueError):
    """Pinning this prompt would take more than the allowed share of the pool."""


class PinMissError(KVCacheError):
    """Some full block of the prompt is not (or no longer) in the prefix cache: prefill it first."""


@dataclass(frozen=True)
class PinInfo:
    name: str
    num_tokens: int  # tokens pinned (full blocks only)
    block_ids: tuple[int, ...]

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)


class PinTable:
    """name -> the blocks the app holds for it, found by the prefix cache's chain hash
    (engine/kv/block_hash.py, the one walk every lookup uses)."""

    def __init__(
        self,
        pool: BlockPool,
        block_size: int,
        layout: KVCacheLayout | None = None,
        *,
        max_fraction: float = DEFAULT_MAX_PIN_FRACTION,
    ):
        if not 0.0 <= max_fraction <= 1.0:
            raise ValueError(f"max_fraction must be in [0, 1], got {max_fraction}")
        self._pool, self._bs = pool, block_size
        self._layout = layout or KVCacheLayout.single(1)
        self.max_fraction = max_fraction
        self._pins: dict[str, tuple[PinInfo, list[Block]]] = {}

    @property
    def max_blocks(self) -> int:
        return int(self._pool.num_blocks * self.max_fraction)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks a prompt of num_tokens would pin (its full blocks, in every group that keeps them)."""
        return self._layout.hit_blocks(num_tokens // self._bs, self._bs)

    def check_cap(self, name: str, num_tokens: int) -> None:
        """Raise PinCapError if pinning num_tokens under `name` (replacing any pin of that name)
        would exceed the cap. Cheap; called before prefilling anything."""
        others = self._held(exclude=name)
        need = self.blocks_for(num_tokens)
        if len(others) + need > self.max_blocks:
            raise PinCapError(
                f"pinning {need} blocks ({num_tokens} tokens) would exceed the pin cap: "
                f"{len(others)} of {self.max_blocks} blocks "
                f"({self.max_fraction:.0%} of a {self._pool.num_blocks}-block pool) are already pinned"
            )

    def _held(self, exclude: str | None = None) -> set[int]:
        out: set[int] = set()
        for n, (info, _) in self._pins.items():
            if n != exclude:
                out.update(info.block_ids)
        return out

    def _cached_blocks(self, token_ids: list[int], salt) -> list[Block]:
        """Per group, the blocks a hit at the prompt's last full block needs (group 0 first)."""
        chain = list(walk_blocks(token_ids, salt, self._bs))
        k, out = len(chain), []
        for g, spec in enumerate(self._layout.groups):
            for c in chain[spec.first_live_block(k * self._bs, self._bs) :]:
                b = cached_block(self._pool, g, c)
                if b is None:
                    raise PinMissError(
                        f"block {c.index} of the prompt is not cached (KV cache group {g})"
                    )
                out.append(b)
        return out

    def pin(self, name: str, token_ids: list[int], *, salt=None) -> PinInfo:
        """Hold the full blocks of token_ids (already prefilled) under `name`, replacing (and
        unpinning) any earlier pin of that name. Atomic: on error nothing changes."""
        if not name:
            raise ValueError("a pin needs a name")
        self.check_cap(name, len(token_ids))
        blocks = self._cached_blocks(list(token_ids), salt)
        self._pool.touch(blocks)  # before unpinning the old one: shared blocks never drop to 0
        self.unpin(name)
        info = PinInfo(
            name, len(token_ids) // self._bs * self._bs, tuple(b.block_id for b in blocks)
        )
        self._pins[name] = (info, blocks)
        return info

    def unpin(self, name: str) -> bool:
        """Drop the app's reference; False if there was no such pin."""
        entry = self._pins.pop(name, None)
        if entry is None:
            return False
        self._pool.free_blocks(entry[1][::-1])  # tail first, like any table
        return True

    def get(self, name: str) -> PinInfo | None:
        entry = self._pins.get(name)
        return entry[0] if entry else None

    def infos(self) -> list[PinInfo]:
        return [info for info, _ in self._pins.values()]

    def views(self) -> list[PinView]:
        return [
            PinView(name=i.name, num_tokens=i.num_tokens, block_table=list(i.block_ids))
            for i in self.infos()
        ]

    def pinned_ids(self) -> set[int]:
        return self._held()

    @property
    def num_pinned_blocks(self) -> int:
        return len(self._held())

    @property
    def num_pinned_shared(self) -> int:
        """Pinned blocks with ref_count >= 2: the pool counts them as shared, the one vocabulary
        (ui/dashboard/vocabulary.py) as pinned, so the stats' shared_blocks leaves them out."""
        return sum(1 for i in self._held() if self._pool.blocks[i].ref_count >= 2)

    @property
    def num_pin_only_blocks(self) -> int:
        """Pinned blocks no sequence or session holds (every reference is a pin's): the pool keeps
        them for chats to come, so they are not counted as memory the live chats use."""
        holds: dict[int, int] = {}
        for _, blocks in self._pins.values():
            for b in blocks:
                holds[b.block_id] = holds.get(b.block_id, 0) + 1
        return sum(1 for i, k in holds.items() if self._pool.blocks[i].ref_count == k)
