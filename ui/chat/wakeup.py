"""Wake the tabs that paint a reply when something they show changes, instead of polling it.

Why: a tab following a reply used to look at it every 50 ms whether or not a token had come,
~20 wake-ups a second per stream for nothing while a reply is queued or paused. Now each follower
waits on an event of its own; the reply sets every follower's event when it changes (a delta, a
state change, its end), and the tab registry sets it when the tab opens another chat, so a switch
stops the painting at once. Only a reply still waiting in the engine's queue is looked at again
after QUEUE_REFRESH_S: its place in the queue moves with other requests, not with its own deltas.
A reply (ui/chat/turn.Turn, ui/chat/beam.BeamTurn) carries one `Wakeup`.
"""

from __future__ import annotations

import asyncio
import threading

QUEUE_REFRESH_S = 0.5  # a queued reply's "queued, position k" line is refreshed this often


class Wakeup:
    """The events of the tabs following one reply. `wake()` from any thread; `wait()` on the loop."""

    def __init__(self):
        self._events: set[asyncio.Event] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def follow(self) -> asyncio.Event:
        """A new follower's event (on the running loop); `leave` it when done."""
        ev = asyncio.Event()
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._events.add(ev)
        return ev

    def leave(self, ev: asyncio.Event) -> None:
        with self._lock:
            self._events.discard(ev)

    def wake(self) -> None:
        """Something the followers show changed: every follower looks again."""
        with self._lock:
            events, loop = list(self._events), self._loop
        if not events:
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        for ev in events:
            if on_loop:
                ev.set()
            else:
                try:
                    loop.call_soon_threadsafe(ev.set)
                except RuntimeError:  # the loop is closed: nobody follows any more
                    pass

    @staticmethod
    async def wait(ev: asyncio.Event, timeout: float | None) -> None:
        """Until `ev` is set (then cleared for the next change) or `timeout` seconds pass."""
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except TimeoutError:
            pass
        ev.clear()
