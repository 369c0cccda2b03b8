"""One hand-over queue from a producer thread to a consumer that reads either blocking or async.

Why one class: a request's deltas are produced on a thread (the engine thread for a local request,
the HTTP reader thread for a remote one) and consumed either by a worker thread iterating blocking
or by an asyncio handler with `async for` (no thread held while it waits). Both streams need the
same switch: items that arrived before the first `async for` are moved, in order, to the event
loop's queue under the lock that also guards every `put`, so nothing is lost or reordered, and
from then on each item reaches the loop through `call_soon_threadsafe`. engine/front/request_stream.py
and backends/remote_stream.py both hand over through it.
"""

from __future__ import annotations

import asyncio
import queue
import threading


class Handover:
    def __init__(self):
        self._q: queue.Queue = queue.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._aq: asyncio.Queue | None = None
        self._lock = threading.Lock()

    def put(self, item) -> None:
        """From the producer's thread. Raises RuntimeError when the async consumer's loop is closed
        (nobody is listening any more: the producer may stop producing)."""
        with self._lock:  # held while delivering, so the switch below cannot happen midway
            if self._loop is None:
                self._q.put(item)
            else:
                self._loop.call_soon_threadsafe(self._aq.put_nowait, item)

    def get(self):
        """Blocking, from a consumer thread (before any `aget`)."""
        return self._q.get()

    async def aget(self):
        """From the consumer's event loop; the first call switches the hand-over to that loop."""
        if self._aq is None:
            with self._lock:
                self._loop, self._aq = asyncio.get_running_loop(), asyncio.Queue()
                while True:  # what arrived before the switch, in order
                    try:
                        self._aq.put_nowait(self._q.get_nowait())
                    except queue.Empty:
                        break
        return await self._aq.get()
