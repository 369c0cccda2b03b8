"""`Feed`: one replica's KV-event batches put in order before they reach its `ReplicaBlocks`.

Why a separate, socket-free class: every rule about the stream lives here and is tested by
replaying recorded frames (tests/backends/fixtures/kv_events/): what a sequence gap means, what a
replay answer means, a restarted engine, a malformed message, all without ZMQ.

The rules (vLLM numbers its batches 0, 1, 2, ... per publisher; PUB drops when a reader lags):
- the next number: apply it;
- a number ahead of the next one (a gap): ask the replay endpoint for the missing batches, apply
  the ones it still has, count the rest as lost (and say so on the page), then apply this one;
- a number already applied, while catching up after a replay: a duplicate, dropped;
- a lower number once caught up: the engine restarted (its cache is empty again): clear the model,
  then take the stream from there (and replay what the new publisher already sent);
- a frame that is not a batch: counted as malformed, skipped; the next good one still applies.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from backends.kv_blocks import ReplicaBlocks
from backends.kv_events import Malformed, decode_batch, seq_of

RATE_WINDOW_S = 10.0


class Feed:
    """`replay(start_seq)` -> [(seq, payload)] or None (no replay endpoint / it did not answer)."""

    def __init__(self, blocks: ReplicaBlocks, replay=None, clock=time.time):
        self.blocks, self.replay, self.clock = blocks, replay, clock
        self.last: int | None = None  # last applied sequence number
        self.caught_up = True  # False between a replay and the next newer live batch
        self.counts = {
            "batches": 0,
            "events": 0,
            "malformed": 0,
            "bad_events": 0,
            "gaps": 0,
            "lost_batches": 0,
            "replayed_batches": 0,
            "duplicates": 0,
            "restarts": 0,
        }
        self.first_seq: int | None = None  # the first batch this model has (joined late if > 0)
        self._recent: deque[tuple[float, int]] = deque()  # (time, events) for events/s
        self.last_event_at: float | None = None
        self.lock = threading.Lock()  # the reader thread applies, the page reads

    # ---- entry points --------------------------------------------------------------------------
    def start(self) -> None:
        """On connect: everything the publisher still buffers, from its first batch."""
        self._replay_from(0)

    def frame(self, frames: list[bytes]) -> None:
        """One live ZMQ message: [topic, seq, payload] (a topic-less [seq, payload] also works)."""
        try:
            if len(frames) < 2:
                raise Malformed(f"{len(frames)} frame(s)")
            seq, payload = seq_of(frames[-2]), frames[-1]
        except Malformed:
            self.counts["malformed"] += 1
            return
        self.live(seq, payload)

    def live(self, seq: int, payload: bytes) -> None:
        if self.last is None:
            if seq > 0:  # joined mid-stream: fetch what came before
                self._replay_from(0, until=seq)
        elif seq <= self.last:
            if not self.caught_up:
                self.counts["duplicates"] += 1
                return
            self.counts["restarts"] += 1  # numbering went back: a new publisher
            with self.lock:
                self.blocks.clear()
            self.last, self.first_seq = None, None
            if seq > 0:
                self._replay_from(0, until=seq)
        elif seq > self.last + 1:
            self.counts["gaps"] += 1
            self._replay_from(self.last + 1, until=seq)
            if self.last is not None and seq > self.last + 1:
                self.counts["lost_batches"] += seq - self.last - 1
        self._apply(seq, payload)
        self.caught_up = True

    # ---- internals -----------------------------------------------------------------------------
    def _replay_from(self, start: int, until: int | None = None) -> None:
        got = self.replay(start) if self.replay is not None else None
        if not got:
            return
        for seq, payload in sorted(got):
            if until is not None and seq >= until:
                break
            if self.last is not None and seq <= self.last:
                continue
            if self.last is not None and seq > self.last + 1:
                self.counts["lost_batches"] += seq - self.last - 1  # older than the buffer
            self._apply(seq, payload)
            self.counts["replayed_batches"] += 1
        self.caught_up = False

    def _apply(self, seq: int, payload: bytes) -> None:
        self.last = seq
        if self.first_seq is None:
            self.first_seq = seq
        try:
            batch = decode_batch(payload)
        except Malformed:
            self.counts["malformed"] += 1
            return
        with self.lock:
            for ev in batch.events:
                try:
                    self.blocks.apply(ev)
                except Exception:  # a readable event this model cannot place
                    self.counts["bad_events"] += 1
        self.counts["batches"] += 1
        self.counts["events"] += len(batch.events)
        self.counts["bad_events"] += batch.bad_events
        now = self.clock()
        self.last_event_at = now
        self._recent.append((now, len(batch.events)))
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._recent and now - self._recent[0][0] > RATE_WINDOW_S:
            self._recent.popleft()

    def events_per_s(self) -> float:
        now = self.clock()
        self._trim(now)
        return sum(n for _, n in self._recent) / RATE_WINDOW_S

    def joined_late(self) -> bool:
        """The first batch we have is not the publisher's first: blocks cached before it are not
        in the model (until they are stored again)."""
        return bool(self.first_seq)
