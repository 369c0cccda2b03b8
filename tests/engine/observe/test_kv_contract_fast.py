"""The fast KV snapshot (C-array columns, incremental table ids, lazy numpy lists) equals a slow,
obvious reference that walks every Block object, on random pool histories: alloc, grow, free,
preempt, park/adopt sessions, fork + copy-on-write, eviction under pressure, pin/unpin.

Also checked on every step: an older snapshot, materialized only *after* later operations, still
shows the state at its own time (the engine thread's copies must not alias live state); and the
compact JSON reads back to the same snapshot as the full one.
"""

import json
import os

from hypothesis import event, settings, strategies as st
from hypothesis.stateful import invariant, precondition, rule

from engine.errors import KVCacheError
from engine.observe.kv_contract import KVSnapshot, compact_json
from engine.kv.pinning import PinMissError
from tests.engine.kv.helpers import BASES, KVMachine
from engine.observe.kv_snapshot import kv_stats, take_snapshot


def request_of(seq_id):
    return f"req-{seq_id}"


def reference_json(m) -> dict:
    """The snapshot JSON (minus "time", "block_runs") by walking objects: the pre-issue-13 code path."""
    pool, bs = m.pool, m.block_size
    pinned = {i for info in m.pins.infos() for i in info.block_ids}
    state, refs, filled, groups = [], [], [], []
    for b in pool.blocks:
        refs.append(b.ref_count)
        filled.append(b.filled)
        groups.append(b.group)
        state.append(
            "pinned"
            if b.block_id in pinned
            else "used"
            if b.ref_count
            else "cached"
            if b.block_hash is not None
            else "free"
        )
    seqs = [
        (
            s.seq_id,
            s.session_id,
            "running",
            len(s.tokens),
            s.num_computed,
            s.tables[0].blocks,
            request_of(s.seq_id),
        )
        for s in m._seqs.values()
    ]
    seqs += [
        (None, s.session_id, "idle_session", len(s.tokens), len(s.tokens), s.tables[0].blocks, None)
        for s in m.parked
    ]
    owners, views = {}, []
    for seq_id, sid, st_, ntok, nc, table, rid in seqs:
        for b in table:
            owners.setdefault(str(b.block_id), []).append(seq_id if seq_id is not None else sid)
        views.append(
            {
                "seq_id": seq_id,
                "session_id": sid,
                "state": st_,
                "num_tokens": ntok,
                "num_computed": nc,
                "block_table": [b.block_id for b in table],
                "shared": [b.ref_count >= 2 for b in table],
                "last_block_filled": nc - (len(table) - 1) * bs if table else 0,
                "request_id": rid,
                "title": None,
                "group_blocks": [len(table)],
                "released_blocks": 0,
            }
        )
    return {
        "block_size": bs,
        "num_blocks": pool.num_blocks,
        "stats": kv_stats(m).to_json(),
        "blocks": {"state": state, "ref_count": refs, "filled": filled, "group": groups},
        "owners": owners,
        "sequences": views,
        "preemption_events": [
            {"request_id": request_of(e["seq_id"]), **e} for e in m.preemption_events
        ],
        "tier_events": [
            {"request_id": request_of(e["seq_id"]), **e}
            for e in (m.tier_link.load_events if m.tier_link else ())
        ],
        "pins": [
            {"name": i.name, "num_tokens": i.num_tokens, "block_table": list(i.block_ids)}
            for i in m.pins.infos()
        ],
        "state_slots": [],
    }  # v9: a model without linear-attention layers holds none


def comparable(d: dict) -> dict:
    """A full snapshot JSON without what the reference does not build (time, the derived runs)."""
    d = json.loads(json.dumps(d))  # what a client sees: tuples/lists, str keys
    d.pop("time"), d.pop("schema"), d.pop("version"), d.pop("block_runs")
    return d


def runs_expand(runs: dict) -> tuple:
    state, ref, filled, pos = [], [], [], 0
    for s, n, c, r, f in zip(
        runs["start"], runs["length"], runs["state"], runs["ref_count"], runs["filled"]
    ):
        assert s == pos and n >= 1  # contiguous, no empty runs
        state += [runs["states"][c]] * n
        ref += [r] * n
        filled += [f] * n
        pos += n
    return state, ref, filled


class FastSnapshotMachine(KVMachine):
    """The pool machine of test_kv_cache_properties plus pins, checking snapshots every step."""

    def __init__(self):
        super().__init__()
        self.pending = []  # (fast snapshot not yet materialized, reference JSON at its time)

    @rule(base=st.sampled_from(range(len(BASES))), blocks=st.integers(1, 4))
    def pin(self, base, blocks):
        if not hasattr(self, "m"):
            return
        self.m.pins.max_fraction = 0.5
        try:
            self.m.pins.pin(f"p{base}", BASES[base][: blocks * 8])
            event("pinned")
        except (PinMissError, KVCacheError, ValueError):
            pass

    @precondition(lambda self: hasattr(self, "m") and self.m.pins.infos())
    @rule(data=st.data())
    def unpin(self, data):
        name = data.draw(st.sampled_from(sorted(i.name for i in self.m.pins.infos())))
        assert self.m.pins.unpin(name)

    # ---- the pool invariant, counting the pins' references too -------------------------------
    @invariant()
    def pool_is_consistent(self):
        m, pool = self.m, self.m.pool
        holders = [0] * pool.num_blocks
        tables = [s.tables[0].blocks for s in m._seqs.values()] + [
            s.tables[0].blocks for s in m.parked
        ]
        tables += [[pool.blocks[i] for i in info.block_ids] for info in m.pins.infos()]
        for table in tables:
            for b in table:
                holders[b.block_id] += 1
        assert [b.ref_count for b in pool.blocks] == holders
        assert pool.num_free == holders.count(0)

    @invariant()
    def fast_snapshot_equals_reference(self):
        m = self.m
        ref = reference_json(m)
        for snap, then in self.pending:  # older snapshots, read only now
            assert comparable(snap.to_json()) == then
        fast = take_snapshot(m, request_of=request_of)
        full = fast.to_json()
        assert comparable(full) == ref
        assert runs_expand(full["block_runs"]) == (
            ref["blocks"]["state"],
            ref["blocks"]["ref_count"],
            ref["blocks"]["filled"],
        )
        compact = json.loads(
            json.dumps(take_snapshot(m, request_of=request_of).to_json(compact=True))
        )
        assert "blocks" not in compact and "owners" not in compact and compact["compact"] is True
        back = KVSnapshot.from_json(compact)
        assert comparable(back.to_json()) == ref
        assert compact_json(full)["sequences"] == compact["sequences"]
        self.pending = [(take_snapshot(m, request_of=request_of), ref)]  # read at the next step

    def teardown(self):
        if hasattr(self, "m"):
            for info in self.m.pins.infos():
                self.m.pins.unpin(info.name)
        super().teardown()


FastSnapshotMachine.TestCase.settings = settings(
    settings.get_profile(os.environ.get("KV_HYPOTHESIS_PROFILE", "kv-ci")),
    max_examples=int(os.environ.get("KV_FAST_EXAMPLES", "60")),
    stateful_step_count=60,
)
TestFastSnapshotEqualsReference = FastSnapshotMachine.TestCase
