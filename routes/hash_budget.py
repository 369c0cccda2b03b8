"""A global budget for password hashing, so login attempts cannot starve generation (#29.7).

Why: every /login attempt ran scrypt (~60 ms of a core here, 16 MiB), unknown names too, and
nothing bounded how many ran at once: 755 attempts took a user's generation from 14.5 to 1.3 tok/s.
Per-address throttling does not help against many addresses. So all hashing goes through one
slot: one hash at a time, and after a hash that took t seconds the slot stays closed for
t x (1 / SHARE - 1), so hashing uses at most SHARE of one core however many attempts arrive.
Attempts for unknown user names take the same slot and wait as long as a hash takes, without
hashing: equal timing for known and unknown names, no CPU for the unknown ones.
At most MAX_WAITING attempts queue for the slot; the rest are told the server is busy (429) by
the login middleware before Gradio sees them.
"""
from __future__ import annotations

import asyncio
import time

SHARE = 0.05                 # of one core, at most, spent hashing passwords
MAX_WAITING = 16             # attempts queued for the slot; more get 429 at once
FIRST_GUESS_S = 0.06         # assumed hash time until one has been measured


class HashBudget:
    def __init__(self, share: float = SHARE, max_waiting: int = MAX_WAITING, clock=time.monotonic,
                 sleep=asyncio.sleep):
        if not 0 < share <= 1:
            raise ValueError("share must be in (0, 1]")
        self.share, self.max_waiting, self.clock, self.sleep = share, max_waiting, clock, sleep
        self.typical_s = FIRST_GUESS_S           # the last measured hash time (what unknown names wait)
        self.waiting = 0
        self.hashes = 0                          # hashes run (for tests and the docs' numbers)
        self._lock: asyncio.Lock | None = None
        self._next_start = 0.0

    def full(self) -> bool:
        """True when another attempt would pass MAX_WAITING (the middleware answers 429)."""
        return self.waiting >= self.max_waiting

    async def run(self, work, *, hash_it: bool):
        """Run `work()` (a blocking hash) in a worker thread inside the slot; hash_it False: wait as
        long as a hash takes instead, and return None."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        self.waiting += 1
        try:
            async with self._lock:
                delay = self._next_start - self.clock()
                if delay > 0:
                    await self.sleep(delay)
                start = self.clock()
                if hash_it:
                    result = await asyncio.to_thread(work)
                    self.hashes += 1
                    self.typical_s = max(1e-3, self.clock() - start)
                else:
                    await self.sleep(self.typical_s)
                    result = None
                self._next_start = self.clock() + self.typical_s * (1 / self.share - 1)
                return result
        finally:
            self.waiting -= 1
