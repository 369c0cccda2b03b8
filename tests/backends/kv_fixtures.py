"""Recorded KV-event streams (tests/backends/fixtures/kv_events/*.msgpack): read, write, record.

A fixture is a msgpack map: {"replica": name, "meta": {...what /metrics said at the end...},
"frames": [[topic, seq, payload], ...]} with the ZMQ frames exactly as the engine sent them, so
replaying one into backends/kv_feed.Feed exercises the reader on real vLLM bytes.
"""

from __future__ import annotations

import threading
from pathlib import Path

import msgspec
import zmq

FIXTURES = Path(__file__).parent / "fixtures" / "kv_events"


def load(name: str) -> dict:
    return msgspec.msgpack.decode((FIXTURES / name).read_bytes())


def save(path: Path, replica: str, frames: list, meta: dict) -> None:
    path.write_bytes(msgspec.msgpack.encode({"replica": replica, "meta": meta, "frames": frames}))


class Recorder:
    """A plain SUB socket on a publisher (independent of the reader under test): every message."""

    def __init__(self, endpoint: str):
        self.frames: list = []
        self._stop = threading.Event()
        self._sock = zmq.Context.instance().socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sock.poll(100):
                self.frames.append(self._sock.recv_multipart())

    def stop(self) -> list:
        self._stop.set()
        self._thread.join(5)
        self._sock.close(linger=0)
        return self.frames
