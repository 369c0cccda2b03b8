"""A stand-in for vLLM's ZMQ KV-event publisher, on real ZMQ sockets, for tests without vLLM.

It speaks the protocol of vllm/distributed/kv_events.ZmqEventPublisher: a bound PUB socket sends
[topic, 8-byte big-endian seq, payload]; a bound ROUTER answers a replay request (the start seq as
8 bytes) with every buffered batch from that seq on and then [b"", -1 as 8 signed bytes, b""].
What it publishes is recorded vLLM output (tests/backends/fixtures/kv_events/), so the reader under
test sees real bytes over a real socket; `publish(..., drop=True)` only buffers a batch, which is
what a subscriber sees when PUB drops a message (a sequence gap).
"""

from __future__ import annotations

import threading

import zmq

from tests.e2e.conftest import free_port


class FakePublisher:
    def __init__(self, topic: bytes = b""):
        self.topic = topic
        self.ctx = zmq.Context.instance()
        self.port, self.replay_port = free_port(), free_port()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(f"tcp://127.0.0.1:{self.port}")
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests: list[int] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    @property
    def spec(self) -> str:
        """The reader's --backend-kv-events value for this publisher."""
        return f"tcp://127.0.0.1:{self.port},tcp://127.0.0.1:{self.replay_port}"

    def publish(self, seq: int, payload: bytes, drop: bool = False) -> None:
        with self._lock:
            self.buffer.append((seq, payload))
            if not drop:
                self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    def send_raw(self, frames: list[bytes]) -> None:
        """Anything at all on the PUB socket (malformed messages)."""
        with self._lock:
            self.pub.send_multipart(frames)

    def _serve_replay(self) -> None:
        router = self.ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(f"tcp://127.0.0.1:{self.replay_port}")
        try:
            while not self._stop.is_set():
                if not router.poll(50):
                    continue
                frames = router.recv_multipart()
                if len(frames) != 3:
                    continue
                client, _, start = frames
                start_seq = int.from_bytes(start, "big")
                self.replay_requests.append(start_seq)
                with self._lock:
                    batches = [(s, p) for s, p in self.buffer if s >= start_seq]
                for s, p in batches:
                    router.send_multipart([client, b"", self.topic, s.to_bytes(8, "big"), p])
                router.send_multipart([client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])
        finally:
            router.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.pub.close(linger=0)
