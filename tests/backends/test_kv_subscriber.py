"""The ZMQ side of the reader (backends/kv_subscriber.py) on real sockets, against a stand-in for
vLLM's publisher (tests/backends/kv_publisher.py) that sends replica A's recorded batches: replay on
connect, a batch the PUB socket dropped fetched from the replay endpoint, malformed messages on
the wire, and the reader binding when the engine's publisher connects to it."""

from __future__ import annotations

import zmq

from backends.kv_blocks import ReplicaBlocks
from backends.kv_feed import Feed
from backends.kv_subscriber import Subscriber, binds, parse_spec
from tests.backends.kv_publisher import FakePublisher
from tests.backends.helpers import A, batches, run, state
from tests.e2e.conftest import free_port
from tests.e2e.polling import wait_until


def test_replay_on_connect_a_dropped_batch_and_junk_on_the_wire():
    items = batches(A)
    m = len(items) // 2
    pub = FakePublisher()
    for seq, payload in items[:m]:  # sent before anyone listened: only replay has them
        pub.publish(seq, payload)
    feed = Feed(ReplicaBlocks())
    sub = Subscriber(feed, *parse_spec(pub.spec)).start()
    try:
        wait_until(lambda: feed.last == items[m - 1][0], 20, what="the replay on connect")
        assert pub.replay_requests[0] == 0 and feed.counts["replayed_batches"] == m

        def rest_arrived() -> bool:
            if feed.last == items[-1][0]:
                return True
            pub.publish(*items[-1])  # the last one again, until the reader hears it
            return False

        pub.send_raw([b"", b"\x00\x01", b"junk"])  # a 2-byte sequence number
        pub.send_raw([b"", (10**6).to_bytes(8, "big")])  # two frames, no payload: skipped
        for k, (seq, payload) in enumerate(items[m:-1]):
            pub.publish(seq, payload, drop=(k == 0))  # the first one lost on the way
        pub.buffer.append(items[-1])
        wait_until(rest_arrived, 20, every=0.3, what="the live batches")
        assert state(feed) == state(run(items))
        assert feed.counts["gaps"] >= 1 and len(pub.replay_requests) >= 2
        assert sub.error is None and sub._thread.is_alive()
    finally:
        sub.stop()
        pub.close()
    assert not sub._thread.is_alive()


def test_the_reader_binds_when_the_publisher_connects():
    port = free_port()
    assert binds(f"tcp://*:{port}") and not binds("tcp://gpu1:5557")
    feed = Feed(ReplicaBlocks())
    sub = Subscriber(feed, f"tcp://*:{port}").start()
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(f"tcp://127.0.0.1:{port}")  # what vLLM does with endpoint tcp://reader:PORT
    items = batches(A)[:1]
    try:

        def heard() -> bool:
            pub.send_multipart([b"", items[0][0].to_bytes(8, "big"), items[0][1]])
            return feed.counts["batches"] >= 1

        wait_until(heard, 20, every=0.2, what="a batch through a connecting publisher")
        assert len(feed.blocks) > 0 and sub.error is None
    finally:
        sub.stop()
        pub.close(linger=0)
