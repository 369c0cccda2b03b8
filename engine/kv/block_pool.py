"""Physical KV blocks, their reference counts, the free list and the prefix-cache map.

A Block object is built the first time its id is handed out (or looked at) and then lives as long
as the pool, so a block table is a list of plain object references. Never-used blocks are not
objects at all: they are one id range [fresh_next, num_blocks) standing in the free list as a single
node, because a GPU-sized pool (350k blocks) would otherwise spend ~1 s building objects nobody
has touched yet. The free list is intrusive
(prev/next live on the Block) so a prefix hit can pull a cached block out of the *middle* of the
list in O(1). Eviction is lazy: a freed block keeps its hash and content and only loses them when
it is handed out again. Order of the free list = eviction order (head is evicted first):
blocks with nothing worth keeping (never used, or freed without a hash) sit at the head, blocks
holding cached content are appended at the tail in the order they were freed (LRU).

Besides the objects, the pool mirrors four per-block fields in flat C arrays indexed by block id
(`ref_counts`, `filled_counts`, `hashed`, `groups`), written by the same methods that write the
objects. A block id belongs to one KV cache group at a time (engine/kv/cache_spec.py): the group it
was last handed out to, which its content (and its hash, if any) belongs to.
Why: a dashboard snapshot of a 350k-block pool must not walk 350k objects on the engine thread;
copying the three arrays is a memcpy (well under a millisecond), and the reader's thread turns
them into JSON. Every write to Block.ref_count / filled / block_hash therefore goes through this
class (nothing else in the engine assigns them).
"""

from __future__ import annotations

from array import array
from typing import Iterable, Iterator

from engine.errors import KVCacheError, NoFreeBlocksError


class Block:
    """One physical block. Free iff ref_count == 0. block_hash is set iff this block is the
    pool's `cached[block_hash]` entry; token_ids/parent_hash/salt let a lookup verify a hit."""

    __slots__ = (
        "block_id",
        "ref_count",
        "block_hash",
        "token_ids",
        "parent_hash",
        "salt",
        "filled",
        "prev",
        "next",
        "owner",
        "group",
    )

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: int | None = None
        self.token_ids: tuple[int, ...] | None = None
        self.parent_hash: int | None = None
        self.salt = None
        self.filled = 0  # token slots holding valid KV (0 for a free, hashless block)
        self.owner: str | None = (
            None  # tier/store.owner_tag of the chat that registered it (private KV)
        )
        self.group = 0  # the KV cache group it was last handed out to (engine/kv/cache_spec.py)
        self.prev: Block | None = None
        self.next: Block | None = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_count}, hash={self.block_hash})"


class _LazyBlocks:
    """`pool.blocks[i]` / `for b in pool.blocks`: the Block of every id, built on first access."""

    __slots__ = ("_objs",)

    def __init__(self, n: int):
        self._objs: list[Block | None] = [None] * n

    def __len__(self) -> int:
        return len(self._objs)

    def __getitem__(self, i: int) -> Block:
        b = self._objs[i]
        if b is None:
            if i < 0:
                i += len(self._objs)
            b = self._objs[i] = Block(i)
        return b

    def __iter__(self) -> Iterator[Block]:
        for i in range(len(self._objs)):
            yield self[i]

    def built(self) -> Iterator[Block]:
        """Only the blocks that exist as objects (everything else is fresh: ref 0, no hash, empty)."""
        return (b for b in self._objs if b is not None)


class BlockPool:
    """Owns all blocks. Counters (free, cached-free, shared, used tokens) are kept incrementally
    so stats never walk the pool."""

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = _LazyBlocks(num_blocks)
        self._head = Block(-1)  # sentinels: no None checks when linking
        self._tail = Block(-1)
        self._fresh = Block(-2)  # stands for ids [fresh_next, num_blocks), in id order
        self.fresh_next = 0
        self._head.next, self._fresh.prev = self._fresh, self._head
        self._fresh.next, self._tail.prev = self._tail, self._fresh
        self.num_free = num_blocks
        self.cached: dict[int, Block] = {}
        self.num_cached_free = 0  # ref 0 and holding a hash (revivable)
        self.num_shared = 0  # ref >= 2
        self.num_used_tokens = 0  # sum of `filled` over blocks with ref >= 1
        # per-block mirrors for snapshots (see the module docstring); zero = a fresh block
        self.ref_counts = array("i", bytes(4 * num_blocks))
        self.filled_counts = array("i", bytes(4 * num_blocks))
        self.hashed = array("b", bytes(num_blocks))  # 1 iff the block holds a prefix-cache hash
        self.groups = array("b", bytes(num_blocks))  # the KV cache group of its content
        self.peak_used = 0  # the most blocks used at once since reset_peak
        # called with a cached block just before its hash and content are lost to a new owner
        # (the KV tier's write-back, engine/kv/kv_cache_manager.py); its KV is still intact then
        self.on_evict = None

    # ---- intrusive list primitives -------------------------------------------------------
    def _unlink(self, b: Block) -> None:
        b.prev.next = b.next
        b.next.prev = b.prev
        b.prev = b.next = None
        self.num_free -= 1

    def _append(self, b: Block) -> None:
        last = self._tail.prev
        last.next, b.prev, b.next, self._tail.prev = b, last, self._tail, b
        self.num_free += 1

    def _appendleft(self, b: Block) -> None:
        first = self._head.next
        self._head.next, b.prev, b.next, first.prev = b, self._head, first, b
        self.num_free += 1

    def iter_free(self) -> Iterator[Block]:
        """Free blocks in eviction order (head first). O(num_free); for tests and debugging."""
        b = self._head.next
        while b is not self._tail:
            if b is self._fresh:
                for i in range(self.fresh_next, self.num_blocks):
                    yield self.blocks[i]
            else:
                yield b
            b = b.next

    def iter_cached_newest(self) -> Iterator[Block]:
        """Free blocks that still hold a prefix, most recently freed first (the reverse of
        eviction order): what a graceful stop keeps in the KV tier first (kv/tier/link.py)."""
        b = self._tail.prev
        while b is not self._head:
            if b is not self._fresh and b.block_hash is not None:
                yield b
            b = b.prev

    # ---- allocation ----------------------------------------------------------------------
    def get_new_blocks(self, n: int, group: int = 0) -> list[Block]:
        """Pop n blocks from the head with ref_count 1 for KV cache group `group`, evicting any
        cached content they held."""
        if n > self.num_free:
            raise NoFreeBlocksError(n, self.num_free)
        out = []
        for _ in range(n):
            b = self._head.next
            if b is self._fresh:
                b = self._take_fresh()
                if group:
                    b.group = group
                    self.groups[b.block_id] = group
                out.append(b)
                continue
            self._unlink(b)
            if b.block_hash is not None:
                if self.on_evict is not None:
                    self.on_evict(b)
                self.num_cached_free -= 1
                self.drop_hash(b)
            b.ref_count = 1
            b.filled = 0
            b.group = group
            i = b.block_id
            self.ref_counts[i] = 1
            self.filled_counts[i] = 0
            self.groups[i] = group
            out.append(b)
        self.peak_used = max(self.peak_used, self.num_blocks - self.num_free)
        return out

    def _take_fresh(self) -> Block:
        """The next never-used id, as an object held once (ref 1)."""
        b = self.blocks[self.fresh_next]
        self.fresh_next += 1
        self.num_free -= 1
        if self.fresh_next == self.num_blocks:  # range used up: drop its node from the list
            f = self._fresh
            f.prev.next, f.next.prev = f.next, f.prev
            f.prev = f.next = None
        b.ref_count = 1
        b.filled = 0
        self.ref_counts[b.block_id] = 1  # filled/hashed of a fresh block are already 0
        return b

    def touch(self, blocks: Iterable[Block]) -> None:
        """Add one reference to each block, reviving it from the free list if it was free."""
        revived = False
        for b in blocks:
            if b.ref_count == 0:
                if b.prev is None:
                    raise KVCacheError(
                        f"block {b.block_id} was never allocated; it cannot be shared"
                    )
                self._unlink(b)
                if b.block_hash is not None:
                    self.num_cached_free -= 1
                self.num_used_tokens += b.filled
                revived = True
            elif b.ref_count == 1:
                self.num_shared += 1
            b.ref_count += 1
            self.ref_counts[b.block_id] = b.ref_count
        if revived:
            self.peak_used = max(self.peak_used, self.num_blocks - self.num_free)

    def reset_peak(self) -> None:
        """Start a fresh peak window at the current use."""
        self.peak_used = self.num_blocks - self.num_free

    def free_blocks(self, blocks: Iterable[Block]) -> None:
        """Drop one reference from each block, given in eviction order (first = evicted first)."""
        blocks = list(blocks)
        for b in blocks:
            if b.ref_count <= 0:
                raise KVCacheError(f"block {b.block_id} freed while already free")
        refs = self.ref_counts
        for b in blocks:
            b.ref_count -= 1
            refs[b.block_id] = b.ref_count
            if b.ref_count == 1:
                self.num_shared -= 1
            elif b.ref_count == 0:
                self.num_used_tokens -= b.filled
                if b.block_hash is not None:
                    self.num_cached_free += 1
                    self._append(b)
                else:
                    b.filled = 0
                    self.filled_counts[b.block_id] = 0
                    self._appendleft(b)

    def set_filled(self, b: Block, n: int) -> None:
        """Record how many slots of a held block hold valid KV (used_tokens accounting)."""
        self.num_used_tokens += n - b.filled
        b.filled = n
        self.filled_counts[b.block_id] = n

    # ---- prefix-cache map ----------------------------------------------------------------
    def register(self, b: Block, block_hash: int, token_ids: tuple, parent_hash, salt) -> bool:
        """Make b the cached block for block_hash unless it (or the hash) is already taken."""
        if b.block_hash is not None or block_hash in self.cached:
            return False
        self.cached[block_hash] = b
        b.block_hash, b.token_ids, b.parent_hash, b.salt = block_hash, token_ids, parent_hash, salt
        self.hashed[b.block_id] = 1
        return True

    def drop_hash(self, b: Block) -> None:
        """Forget b's cached identity (it is being reused or overwritten)."""
        if b.block_hash is not None and self.cached.get(b.block_hash) is b:
            del self.cached[b.block_hash]
        b.block_hash = b.token_ids = b.parent_hash = b.salt = b.owner = None
        self.hashed[b.block_id] = 0

    def forget_free(self, b: Block) -> None:
        """A free cached block loses its content now (its conversation was deleted): it moves to
        the head of the free list as an empty block, with no write-back."""
        if b.ref_count != 0 or b.block_hash is None:
            raise KVCacheError(f"block {b.block_id} is not a free cached block")
        self._unlink(b)
        self.num_cached_free -= 1
        self.drop_hash(b)
        b.filled = 0
        self.filled_counts[b.block_id] = 0
        self._appendleft(b)

    def columns(self) -> tuple[array, array, array]:
        """Copies of (ref_counts, filled_counts, hashed): three memcpys, whatever the pool size.
        The engine thread's whole share of a block-level snapshot (kv_contract.BlockArrays)."""
        return self.ref_counts[:], self.filled_counts[:], self.hashed[:]

    def group_column(self) -> array:
        """A copy of the per-block KV cache group (one memcpy)."""
        return self.groups[:]

    def block_arrays(self) -> tuple[list[str], list[int], list[int]]:
        """(state "used"/"cached"/"free", ref_count, filled) per block id as lists, from the
        mirrors (no Block objects are built or walked)."""
        refs, filled, hashed = self.columns()
        state = ["used" if r else ("cached" if h else "free") for r, h in zip(refs, hashed)]
        return state, refs.tolist(), filled.tolist()

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free
