"""The prefix-cache hit of a prompt over KV cache groups: which blocks a new sequence reuses.

The rule (vLLM states it this way for its hybrid allocator): a hit of k blocks needs blocks
[0, k) in every full-attention group, and in a sliding-window group only the blocks that hold the
positions the first computed query (at position k*bs) still reads: [first_live_block(k*bs), k).
The hit is the largest k every group can serve. Full groups are walked forwards (a chain hash
miss ends them, as before groups); sliding groups are then checked right to left from there: a
missing block i at or after the window's start rules out every k whose window covers i, so the
next candidate is k = i (each block is looked at a bounded number of times).

The second tier continues the same rule: past the pool's hit, a block may come from the pool or
from the tier, and the tier's blocks are loaded into fresh pool blocks. A parked session of the
prompt's owner is adopted instead when it covers more (down to the token), provided each sliding
group still holds the window before its common prefix.

Everything here is pure: it reads the pool's cached map and the tier's index, never changes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.kv.block_hash import ChainBlock, group_key, walk_blocks
from engine.kv.block_pool import Block, BlockPool
from engine.kv.cache_spec import KVCacheLayout
from engine.kv.tier.store import BlockIdentity
from engine.kv.parking import Parked
from engine.text.common_prefix import common_prefix


def cached_block(pool: BlockPool, group: int, c: ChainBlock) -> Block | None:
    """The pool's block for chain block `c` in `group`, verified (tokens, parent, salt, group),
    so a hash collision is never a hit; None if there is none."""
    b = pool.cached.get(group_key(c.hash, group))
    if (
        b is None
        or b.token_ids != c.tokens
        or b.parent_hash != group_key(c.parent, group)
        or b.salt != c.salt
        or b.group != group
    ):
        return None
    return b


def tier_identity(c: ChainBlock, group: int) -> BlockIdentity:
    return BlockIdentity.of(group_key(c.hash, group), group_key(c.parent, group), c.tokens, c.salt)


@dataclass
class HitPlan:
    """What add_sequence would reuse. `num_blocks` k: the hit in whole blocks (pool + tier);
    `first[g]`: group g's first needed entry (0, or the window's start); `picks[g]`: its entries
    [first[g], k), each a pool Block or a BlockIdentity to load from the tier; `chain`: the chain
    blocks [0, k). With `session` set the owner's parked tables are adopted up to `cached` tokens
    instead (`picks` unused)."""

    cached: int = 0
    num_blocks: int = 0
    first: list[int] = field(default_factory=list)
    picks: list[list] = field(default_factory=list)
    chain: list[ChainBlock] = field(default_factory=list)
    session: Parked | None = None

    @classmethod
    def empty(cls, layout: KVCacheLayout, bs: int) -> "HitPlan":
        return cls(first=[0] * layout.num_groups, picks=[[] for _ in layout.groups], block_size=bs)

    @property
    def loads(self) -> list[tuple[int, int, BlockIdentity]]:
        """(group, block index, identity) of the blocks to load, block index first."""
        out = [
            (i, g, x)
            for g, (lo, ps) in enumerate(zip(self.first, self.picks))
            for i, x in enumerate(ps, lo)
            if isinstance(x, BlockIdentity)
        ]
        return [(g, i, x) for i, g, x in sorted(out, key=lambda t: (t[0], t[1]))]

    block_size: int = 0

    @property
    def loaded_tokens(self) -> int:
        """Tokens the tier serves: the hit past the pool's blocks (0 with a session)."""
        return self.num_blocks * self.block_size - self.cached if self.session is None else 0


class _Chain:
    """The prompt's chain blocks, hashed on first use (a miss stops the walk and the hashing)."""

    def __init__(self, token_ids, salt, block_size: int, stop: int):
        self._it = walk_blocks(token_ids, salt, block_size, stop=stop)
        self.blocks: list[ChainBlock] = []
        self.stop = stop

    def __getitem__(self, i: int) -> ChainBlock:
        while len(self.blocks) <= i:
            self.blocks.append(next(self._it))
        return self.blocks[i]


def _shrink(k: int, lower: int, sliding: list, layout: KVCacheLayout, bs: int, present) -> int:
    """The largest k' in [lower, k] whose window blocks every sliding group has (`lower` is
    known to be served)."""
    while k > lower:
        for g in sliding:
            lo = layout.groups[g].first_live_block(k * bs, bs)
            miss = next((i for i in range(k - 1, lo - 1, -1) if not present(g, i)), None)
            if miss is not None:
                k = max(miss, lower)
                break
        else:
            return k
    return lower


def plan_hit(
    layout: KVCacheLayout, bs: int, pool: BlockPool, link, token_ids, salt, session: Parked | None
) -> HitPlan:
    """The hit for `token_ids` (at least one token is always left to compute: the last one
    must produce logits). Pure."""
    if len(token_ids) < 2:
        return HitPlan.empty(layout, bs)
    if not isinstance(token_ids, list):
        token_ids = list(token_ids)
    stop = (len(token_ids) - 1) // bs
    chain = _Chain(token_ids, salt, bs, stop)
    full = [g for g, s in enumerate(layout.groups) if s.sliding_window is None]
    sliding = [g for g, s in enumerate(layout.groups) if s.sliding_window is not None]
    memo: dict = {}

    def in_pool(g: int, i: int) -> Block | None:
        key = (g, i)
        if key not in memo:
            memo[key] = cached_block(pool, g, chain[i])
        return memo[key]

    k = 0
    if full:
        while k < stop and all(in_pool(g, k) is not None for g in full):
            k += 1
    else:
        k = stop
    k = _shrink(k, 0, sliding, layout, bs, lambda g, i: in_pool(g, i) is not None)
    pool_k, top = k, k
    if link is not None and k < stop:
        limit = min(stop, k + link.policy.load_budget() // max(1, len(full)))
        tier = link.tier

        def have(g: int, i: int) -> bool:
            return in_pool(g, i) is not None or tier.has(tier_identity(chain[i], g))

        top = k
        if full:
            while top < limit and all(have(g, top) for g in full):
                top += 1
        else:
            top = limit
        top = _shrink(top, k, sliding, layout, bs, have)
    plan = _picks(layout, bs, chain, top, in_pool)
    plan.cached = pool_k * bs
    if plan.loads and not link.policy.should_load(len(plan.loads), bs, link.tier.load_s_per_block):
        plan = _picks(layout, bs, chain, pool_k, in_pool)
        plan.cached = pool_k * bs
    if session is not None and session.salt == salt:
        common = common_prefix(session.tokens, token_ids, len(token_ids) - 1)
        if (
            common
            and common >= plan.num_blocks * bs
            and all(
                layout.groups[g].first_live_block(common, bs) >= session.tables[g].released
                for g in sliding
            )
        ):
            return HitPlan(cached=common, session=session, block_size=bs)
    return plan


def _picks(layout: KVCacheLayout, bs: int, chain: _Chain, k: int, in_pool) -> HitPlan:
    first, picks = [], []
    for g, spec in enumerate(layout.groups):
        lo = min(k, spec.first_live_block(k * bs, bs))
        first.append(lo)
        picks.append([in_pool(g, i) or tier_identity(chain[i], g) for i in range(lo, k)])
    return HitPlan(
        num_blocks=k, first=first, picks=picks, chain=[chain[i] for i in range(k)], block_size=bs
    )
