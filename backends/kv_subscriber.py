"""`Subscriber`: the ZMQ side of one replica's KV-event stream, on its own daemon thread.

Sockets, as vLLM's publisher expects them (vllm/distributed/kv_events.py, ZmqEventPublisher):
- live batches: a SUB socket subscribed to the topic. vLLM binds its PUB when its endpoint has a
  wildcard (`tcp://*:5557`) and connects when it names a host (`tcp://reader-host:5557`); this
  reader does the opposite: it connects to `tcp://HOST:PORT` and binds `tcp://*:PORT` /
  `tcp://0.0.0.0:PORT` (for publishers that connect to it);
- replay: a DEALER socket to vLLM's ROUTER (`replay_endpoint`, always bound there). A request is
  the start sequence number as 8 big-endian bytes; the answer is one message per buffered batch
  ([topic, seq, payload]) and then an end marker with sequence -1.

Why a thread per replica: ZMQ sockets must stay on one thread; the page reads the model under
the Feed's lock (backends/kv_feed.py), never the sockets.
"""

from __future__ import annotations

import threading

import zmq

from backends.kv_events import END_SEQ, Malformed, seq_of
from backends.kv_feed import Feed

POLL_MS = 200
REPLAY_TIMEOUT_MS = 3000


def binds(endpoint: str) -> bool:
    """Wildcard / any-address endpoints are bound here; named hosts are connected to."""
    return "*" in endpoint or "0.0.0.0" in endpoint or "[::]" in endpoint


def parse_spec(spec: str) -> tuple[str, str | None]:
    """`--backend-kv-events` value: `tcp://HOST:PORT` or `tcp://HOST:PORT,tcp://HOST:REPLAYPORT`."""
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not 1 <= len(parts) <= 2 or not all(
        p.startswith(("tcp://", "ipc://", "inproc://")) for p in parts
    ):
        raise ValueError(
            f"--backend-kv-events expects tcp://HOST:PORT[,tcp://HOST:REPLAY_PORT], got {spec!r}"
        )
    return parts[0], parts[1] if len(parts) == 2 else None


class Subscriber:
    def __init__(
        self,
        feed: Feed,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        ctx: zmq.Context | None = None,
    ):
        self.feed, self.endpoint, self.replay_endpoint = feed, endpoint, replay_endpoint
        self.topic = topic.encode()
        self.ctx = ctx or zmq.Context.instance()
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"kv-events {endpoint}")
        self._replay_sock = None
        if replay_endpoint:
            feed.replay = self._replay

    def start(self) -> Subscriber:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    # ---- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.LINGER, 0)
        try:
            (sub.bind if binds(self.endpoint) else sub.connect)(self.endpoint)
            self.feed.start()
            while not self._stop.is_set():
                if sub.poll(POLL_MS):
                    try:
                        self.feed.frame(sub.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        pass
                    except Exception as e:  # one bad message must not end the stream
                        self.feed.counts["malformed"] += 1
                        self.error = f"{type(e).__name__}: {e}"
        except zmq.ZMQError as e:
            self.error = f"cannot listen on {self.endpoint}: {e}"
        finally:
            sub.close(linger=0)
            if self._replay_sock is not None:
                self._replay_sock.close(linger=0)

    def _socket(self):
        if self._replay_sock is None:
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(self.replay_endpoint)
            self._replay_sock = s
        return self._replay_sock

    def _replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """The publisher's buffered batches from `start` on; None when it does not answer in time
        (the socket is then dropped, so a late answer cannot be taken for the next request's)."""
        s = self._socket()
        out: list[tuple[int, bytes]] = []
        try:
            s.send_multipart([b"", start.to_bytes(8, "big")])
            while s.poll(REPLAY_TIMEOUT_MS):
                frames = s.recv_multipart()
                frames = frames[1:] if frames and frames[0] == b"" else frames
                if len(frames) < 2:
                    continue
                try:
                    seq = seq_of(frames[-2])
                except Malformed:
                    self.feed.counts["malformed"] += 1
                    continue
                if seq == END_SEQ:
                    return out
                out.append((seq, frames[-1]))
        except zmq.ZMQError as e:
            self.error = f"replay from {self.replay_endpoint}: {e}"
        s.close(linger=0)
        self._replay_sock = None
        return out or None
