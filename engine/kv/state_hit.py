"""The prefix-hit rule with state groups: a hit is only as long as a state it can start from.

KV blocks serve a hit at any block boundary (engine/kv/prefix_hit.py); a linear-attention layer
needs its state after exactly the hit's tokens. So the KV hit is cut to the longest prefix that
also has a state (engine/kv/state_groups.py): a checkpoint after chain blocks [0, k) whose blocks
the plan serves (pool hits, or tier loads), or a state the KV tier holds after exactly those
blocks (engine/kv/tier/state_entries.py; read with the blocks, never without all of them), or the owner's
parked state when the common prefix is exactly the parked turn. Otherwise the sequence starts
from position 0, with a fresh state, whatever KV is cached.

Cutting a plan keeps blocks [0, k) of every group; only full-attention groups can be cut this way
(a sliding group's window at k would need other blocks), so a model that mixes sliding-window
and linear-attention layers starts from 0 (none of the families we run does).
"""

from __future__ import annotations

from engine.kv.prefix_hit import HitPlan


def cut(plan: HitPlan, k: int, bs: int) -> HitPlan:
    """The plan's first k blocks (k <= its pool hit)."""
    out = HitPlan(
        cached=min(plan.cached, k * bs),
        num_blocks=k,
        first=[0] * len(plan.picks),
        picks=[list(p[:k]) for p in plan.picks],
        chain=list(plan.chain[:k]),
        block_size=bs,
    )
    out.state_restore, out.state_load, out.kv_hit_blocks = None, None, 0
    return out


def clamp(states, plan: HitPlan, layout, bs: int, replan, tier=None) -> HitPlan:
    """The plan cut to a state boundary; `plan.state_restore` is the checkpoint to copy into the
    sequence's fresh slot, `plan.state_load` the one to read from the KV tier (`tier`: the link's
    StateTier) first (both None: start from the parked state, or from zero);
    `plan.kv_hit_blocks` the KV-only hit it was cut from (a shared prefix without a state yet: the
    admission keeps one there, so the next prompt sharing it hits). `replan()` gives the pool/tier
    plan without the parked session (when the session's state does not fit)."""
    if plan.session is not None:
        sess = plan.session
        if states.holds(sess.tables) and plan.cached == len(sess.tokens):
            plan.state_restore, plan.state_load, plan.kv_hit_blocks = None, None, 0
            return plan
        plan = replan()
    if plan.num_blocks == 0 or any(g.sliding_window is not None for g in layout.groups):
        out = cut(plan, 0, bs)
    else:
        k, ck = states.find(plan.chain, plan.num_blocks)
        kt = tier.find(plan.chain, plan.num_blocks, k) if tier is not None else 0
        out = cut(plan, max(k, kt), bs)
        if kt > k:
            out.state_load = tier.load_of(plan.chain, kt)
        else:
            out.state_restore = ck
    out.kv_hit_blocks = plan.num_blocks
    return out
