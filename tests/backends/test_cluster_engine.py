"""ClusterEngine (backends/cluster_engine.py) over two OpenAI-compatible servers
(tests/backends/fake_backend.py): which replica a turn lands on, failing over, the replica's name
in the reply's stats and stored stats line, the landings the cluster tab lists."""

from __future__ import annotations

import pytest

from backends import BackendError
from backends.cluster_engine import ClusterEngine, conversation_key, replica_name
from backends.kv_subscriber import parse_spec
from engine import SamplingParams
from engine.protocol import ChatEngine, RemoteBackend, ServesReplicas
from storage import Storage
from tests.backends.fake_backend import FakeBackend
from ui.chat.turn import reply_stats
from ui.chat.view import stats_line


@pytest.fixture(scope="module")
def fakes():
    pair = [FakeBackend().start(), FakeBackend().start()]
    yield pair
    for f in pair:
        f.stop()


def chat(system: str, *users: str) -> list[dict]:
    out = [{"role": "system", "content": system}]
    for k, u in enumerate(users):
        out += [{"role": "user", "content": u}] + (
            [{"role": "assistant", "content": "ok"}] if k < len(users) - 1 else []
        )
    return out


def last(eng, messages, **kw):
    return list(eng.submit_chat(messages, SamplingParams(max_tokens=4), **kw))[-1]


def test_it_is_a_chat_engine_a_remote_backend_and_serves_replicas(fakes):
    eng = ClusterEngine([f.url for f in fakes])
    assert (
        isinstance(eng, ChatEngine)
        and isinstance(eng, RemoteBackend)
        and isinstance(eng, ServesReplicas)
    )
    assert eng.kind == "remote" and eng.model == "fake" and eng.max_model_len == 2048
    assert [r.name for r in eng.cluster_view().replicas] == [replica_name(f.url) for f in fakes]
    assert not eng.cluster_view().has_events()
    with pytest.raises(RuntimeError, match="no single block pool"):
        eng.latest_snapshot()
    eng.shutdown()


def test_conversation_routing_keeps_a_chat_on_one_replica_and_spreads_chats(fakes):
    eng = ClusterEngine([f.url for f in fakes])
    names = [replica_name(f.url) for f in fakes]
    where = {}
    for k in range(12):
        first = last(eng, chat("Be brief.", f"question {k}"))
        later = last(eng, chat("Be brief.", f"question {k}", "and then?", "why?"))
        assert first.metrics["served_by"] == later.metrics["served_by"]  # the whole chat stays
        where[k] = first.metrics["served_by"]
        assert where[k] == names[conversation_key(chat("Be brief.", f"question {k}")) % 2]
    assert set(where.values()) == set(names)  # chats spread
    land = eng.recent_landings()
    assert len(land) == 24 and land[-1]["prompt_tokens"] == 12 and land[-1]["cached_tokens"] == 8
    eng.shutdown()


def test_round_robin_alternates_and_a_failing_replica_is_skipped(fakes):
    eng = ClusterEngine([f.url for f in fakes], routing="round-robin")
    names = [replica_name(f.url) for f in fakes]
    got = [last(eng, chat("s", "q")).metrics["served_by"] for _ in range(4)]
    assert got == [names[0], names[1], names[0], names[1]]
    fakes[0].mode = "500"
    try:
        got = [
            last(eng, chat("s", "q"), cache_salt="user:alice").metrics["served_by"]
            for _ in range(2)
        ]
        assert got == [names[1], names[1]]
        assert eng.recent_landings()[-1]["salt"] == "user:alice"
        fakes[1].mode = "500"
        with pytest.raises(BackendError, match="HTTP 500.*/.*HTTP 500"):
            eng.submit_chat(chat("s", "q"), SamplingParams(max_tokens=4))
    finally:
        fakes[0].mode = fakes[1].mode = "ok"
    eng.shutdown()


def test_a_refused_request_is_not_retried_elsewhere():
    fb = [FakeBackend(key="k").start(), FakeBackend(key="k").start()]
    try:
        eng = ClusterEngine([f.url for f in fb], api_key="wrong")
        with pytest.raises(BackendError, match="HTTP 401"):
            eng.submit_chat(chat("s", "q"), SamplingParams(max_tokens=4))
        assert sum(len(f.requests) for f in fb) == 1
    finally:
        for f in fb:
            f.stop()


def test_served_by_reaches_the_stored_stats_and_the_reply_line(fakes, tmp_path):
    eng = ClusterEngine([f.url for f in fakes])
    d = last(eng, chat("s", "hello"))
    stats = reply_stats(d.metrics, d.finish_reason)
    with Storage(tmp_path / "c.db") as st:
        conv = st.create_conversation()["id"]
        mid = st.add_message(conv, "assistant", "hi")["id"]
        assert st.add_reply_stats(mid, **stats)["served_by"] == d.metrics["served_by"]
        with pytest.raises(ValueError, match="served_by must be a string"):
            st.add_reply_stats(mid, served_by=5)
        line = stats_line(st.get_message(mid)["stats"])
    assert f"reused 8 of 12 prompt tokens from cache on {d.metrics['served_by']}" in line
    assert "served by x:1" in stats_line({"served_by": "x:1"})
    eng.shutdown()


def test_one_router_in_front_of_replicas_whose_events_the_tab_reads(fakes):
    eng = ClusterEngine(
        [fakes[0].url], kv_events=["tcp://10.0.0.1:5556", "tcp://10.0.0.2:5556,tcp://10.0.0.2:5557"]
    )
    assert [r.name for r in eng.cluster_view().replicas] == ["10.0.0.1:5556", "10.0.0.2:5556"]
    assert all(r.engine is None and r.subscriber is not None for r in eng.cluster_view().replicas)
    d = last(eng, chat("s", "q"))
    assert "served_by" not in d.metrics  # which replica the router chose is unknown
    assert "a router or one replica" in eng.recent_landings()[-1]["replica"]
    eng.shutdown()


def test_flags_are_checked():
    assert parse_spec("tcp://h:1,tcp://h:2") == ("tcp://h:1", "tcp://h:2")
    assert parse_spec("tcp://h:1") == ("tcp://h:1", None)
    for bad in ("h:1", "tcp://h:1,tcp://h:2,tcp://h:3", ""):
        with pytest.raises(ValueError):
            parse_spec(bad)
    with pytest.raises(ValueError, match="routing"):
        ClusterEngine(["http://127.0.0.1:9"], routing="random")
    with pytest.raises(ValueError, match="one --backend-kv-events per --backend"):
        ClusterEngine(["http://127.0.0.1:9", "http://127.0.0.1:10"], kv_events=["tcp://a:1"] * 3)
    assert replica_name("http://gpu1:8000/v1") == "gpu1:8000"


def test_app_flags_take_several_backends_and_their_event_streams():
    from app import parse_args

    a = parse_args(
        [
            "--backend",
            "http://g1:8000",
            "--backend",
            "http://g2:8000",
            "--backend-kv-events",
            "tcp://g1:5557,tcp://g1:5558",
            "--backend-kv-events",
            "tcp://g2:5557",
            "--backend-routing",
            "round-robin",
        ]
    )
    assert a.backend == ["http://g1:8000", "http://g2:8000"] and a.backend_routing == "round-robin"
    assert a.backend_kv_events == ["tcp://g1:5557,tcp://g1:5558", "tcp://g2:5557"]
    assert parse_args(["--backend", "http://g1:8000"]).backend_kv_events is None
