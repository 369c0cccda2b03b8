"""GET /api/kv at scale (issue 13): the v4 compact form, and one snapshot plus one body per window
shared by every viewer, on a real KVCacheManager, the real SharedSnapshot the LLM uses, the real
route and a real SQLite storage for titles."""

import json

from fastapi import FastAPI
from fastapi.testclient import TestClient

from engine.kv.kv_cache_manager import KVCacheManager
from engine.observe.kv_contract import VERSION, KVSnapshot, expand_ranges
from engine.observe.snapshot_cache import SharedSnapshot
from routes.kv import register_kv_route
from storage.store import Storage
from engine.observe.kv_snapshot import take_snapshot

BS = 16


class ManagerEngine:
    """The snapshot face of engine.LLM over a bare manager: same SharedSnapshot, no model."""

    def __init__(self, m, period_s=60.0):
        self.m, self.exact = m, 0
        self.shared = SharedSnapshot(
            lambda: take_snapshot(m, request_of=lambda s: str(s).split("#")[0]), period_s
        )

    def kv_snapshot(self):
        self.exact += 1
        return take_snapshot(self.m)

    def snapshot(self):
        return self.kv_snapshot().to_json()

    def latest_snapshot(self, compact=False):
        return self.shared.json(compact)

    def latest_snapshot_bytes(self, compact=False):
        return self.shared.body(compact)

    def set_snapshot_wait(self, max_wait_s):
        self.shared.max_wait_s = max_wait_s


def manager(num_blocks=512, chats=("conv-a", "conv-b", "demo-1-2")):
    m = KVCacheManager(num_blocks, BS, max_model_len=4096)
    system = list(range(64))  # 4 shared blocks
    for i, sid in enumerate(chats):
        m.add_sequence(
            f"{sid}#0",
            system + [1000 + 100 * i + k for k in range(40 + i)],
            num_new_tokens=10**9,
            session_id=sid,
        )
    m.park(f"{chats[0]}#0", chats[0])  # one idle session, the rest running
    return m


def client(engine, storage=None):
    app = FastAPI()
    register_kv_route(app, engine, storage=storage)
    return TestClient(app)


def test_compact_carries_what_the_full_form_does():
    c = client(ManagerEngine(manager()))
    full, compact = c.get("/api/kv").json(), c.get("/api/kv?compact=true").json()
    assert (
        full["version"] == VERSION
        and "blocks" in full
        and "owners" in full
        and "block_runs" in full
    )
    assert compact["compact"] is True and "blocks" not in compact and "owners" not in compact
    assert full["time"] == compact["time"]  # the same shared snapshot
    a, b = KVSnapshot.from_json(full), KVSnapshot.from_json(compact)
    assert a.blocks == b.blocks and a.sequences == b.sequences and a.stats == b.stats
    for s, t in zip(full["sequences"], compact["sequences"]):
        assert expand_ranges(t["block_ranges"]) == s["block_table"] and "shared" not in t


def test_one_snapshot_and_one_body_per_window_for_all_viewers():
    engine = ManagerEngine(manager())
    c = client(engine)
    bodies = [c.get("/api/kv").content for _ in range(3)] + [c.get("/api/kv?compact=1").content]
    assert engine.shared.takes == 1 and bodies[0] == bodies[1] == bodies[2]
    assert engine.latest_snapshot_bytes() is engine.latest_snapshot_bytes()  # serialized once
    engine.m.allocate_slots("conv-b#0", 20)
    assert json.loads(c.get("/api/kv").content) == json.loads(bodies[0])  # still this window
    fresh = c.get("/api/kv?fresh=1").json()  # exact, not shared
    assert (
        engine.exact == 1
        and fresh["stats"]["used_tokens"] == json.loads(bodies[0])["stats"]["used_tokens"] + 20
    )


def test_scoped_compact_keeps_titles(tmp_path):
    store = Storage(tmp_path / "chat.db")
    conv = store.create_conversation(title="Trip to Lisbon")
    cid = conv["id"] if isinstance(conv, dict) else conv
    engine = ManagerEngine(manager(chats=(cid, "conv-b", "demo-1-2")))
    c = client(engine, storage=store)
    compact = c.get("/api/kv?compact=true").json()
    assert "blocks" not in compact and "owners" not in compact
    titles = {s["session_id"]: s["title"] for s in compact["sequences"]}
    assert titles[cid] == "Trip to Lisbon" and titles["demo-1-2"] == "demo user 2"
    full = c.get("/api/kv").json()
    assert [expand_ranges(s["block_ranges"]) for s in compact["sequences"]] == [
        s["block_table"] for s in full["sequences"]
    ]
    assert c.get("/api/kv?compact=true").content == c.get("/api/kv?compact=true").content
    assert engine.shared.takes == 1


def test_compact_size_follows_the_tables_not_the_pool():
    """The same chats in a 3,500-block and a 350,000-block pool: the compact body barely grows
    (a few more digits), while per-block lists grow 100x."""
    small = ManagerEngine(manager(3_500)).latest_snapshot_bytes(compact=True)
    big_engine = ManagerEngine(manager(350_000))
    big = big_engine.latest_snapshot_bytes(compact=True)
    assert len(big) < 1.2 * len(small) and len(big) < 8_000
    assert len(big_engine.m.pool.blocks._objs) == 350_000
    assert (
        sum(1 for _ in big_engine.m.pool.blocks.built()) == big_engine.m.num_used_blocks
    )  # no object built


def test_metrics_reads_the_compact_form_only():
    """/metrics needs only the stats: at 350k blocks it must not pay for the per-block lists."""
    from routes.metrics import register_routes

    engine = ManagerEngine(manager(350_000))
    app = FastAPI()
    register_routes(app, engine, kv_route=False)
    text = TestClient(app).get("/metrics").text
    assert (
        "vllm:kv_cache_usage_perc" in text
        and f"paged_chat_kv_blocks_used {engine.m.num_used_blocks}" in text
    )
    assert set(engine.shared.current().forms) == {"dict-compact"}


def test_the_window_stretches_with_the_cost_of_building_its_forms():
    """A form that takes 1 s to build (a full 350k-block snapshot on a busy box) makes the window
    4 s, so polling viewers cannot keep the GIL busy; cheap forms keep the 0.25 s window.
    The clock is a counter the builds advance: no timing in the test."""
    now = [100.0]
    m = manager()

    class SlowSnapshot:  # the real snapshot, with a to_json that "takes" 1 s
        def __init__(self, snap):
            self.snap = snap

        def to_json(self, compact=False):
            now[0] += 0.001 if compact else 1.0
            return self.snap.to_json(compact=compact)

    shared = SharedSnapshot(lambda: SlowSnapshot(take_snapshot(m)), 0.25, clock=lambda: now[0])
    shared.json(compact=True)
    assert shared.window_s() == 0.25
    now[0] += 0.3
    shared.json()  # a new window: its full form costs 1 s
    assert shared.takes == 2 and shared.window_s() == 4.0
    now[0] += 2.0
    shared.body()
    assert shared.takes == 2  # still the same window; the bytes cost a little more
    now[0] += 3.0
    shared.json(compact=True)
    assert shared.takes == 3 and shared.window_s() == 0.25
