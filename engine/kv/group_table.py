"""One holder's blocks in one KV cache group: a block table that may give its front back.

Why a type: with KV cache groups (engine/kv/cache_spec.py) a sequence, a parked session or a
fork holds one table per group, and a sliding-window group's table releases its oldest entries
once no query can read them. Logical entry i is position range [i*bs, (i+1)*bs); entries
[0, released) are gone (the step's plan shows them as NULL_BLOCK), the rest are `blocks`.

`ids` mirrors the table as block ids (NULL_BLOCK for released entries) in an array("i"), kept up to
date by every change, so a step's plan (`tolist`) and a snapshot (a slice: memcpy) copy it in C
instead of walking Block objects each step. Nothing outside these methods changes `blocks`,
`released` or `ids`.
"""

from __future__ import annotations

from array import array

from engine.kv.block_pool import Block
from engine.kv.cache_spec import NULL_BLOCK


class GroupTable:
    __slots__ = ("released", "blocks", "ids")

    def __init__(self, blocks=(), released: int = 0):
        self.released = released
        self.blocks: list[Block] = list(blocks)
        self.ids = array("i", [NULL_BLOCK] * released + [b.block_id for b in self.blocks])

    def __len__(self) -> int:
        """Logical length: released entries included."""
        return self.released + len(self.blocks)

    def __getitem__(self, i: int) -> Block:
        """The live block at logical index i (negative: from the end)."""
        if i < 0:
            return self.blocks[i]
        if i < self.released:
            raise IndexError(f"table entry {i} was released by the window")
        return self.blocks[i - self.released]

    def __repr__(self) -> str:
        return f"GroupTable(released={self.released}, ids={self.ids[self.released :]})"

    def live_ids(self) -> list[int]:
        return self.ids[self.released :].tolist()

    def copy(self) -> "GroupTable":
        out = GroupTable.__new__(GroupTable)
        out.released, out.blocks, out.ids = self.released, list(self.blocks), self.ids[:]
        return out

    def extend(self, blocks: list[Block]) -> None:
        self.blocks.extend(blocks)
        self.ids.extend(b.block_id for b in blocks)

    def replace_last(self, b: Block) -> None:
        """Copy-on-write of the last block."""
        self.blocks[-1] = b
        self.ids[-1] = b.block_id

    def release_front(self, upto: int) -> list[Block]:
        """Give back logical entries [released, upto); returns their blocks, oldest first."""
        k = upto - self.released
        if k <= 0:
            return []
        out = self.blocks[:k]
        del self.blocks[:k]
        self.ids[self.released : upto] = array("i", [NULL_BLOCK] * k)
        self.released = upto
        return out

    def truncate(self, n: int) -> list[Block]:
        """Keep logical entries [0, n); returns the dropped blocks in table order."""
        if n >= len(self):
            return []
        if n < self.released:
            raise IndexError(f"cannot cut a table to {n} entries: {self.released} were released")
        out = self.blocks[n - self.released :]
        del self.blocks[n - self.released :]
        del self.ids[n:]
        return out
