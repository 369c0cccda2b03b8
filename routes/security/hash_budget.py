"""A global budget for password hashing, so login attempts cannot starve generation (#29.7).

Why: every /login attempt ran scrypt (~60 ms of a core here, 16 MiB), unknown names too, and
nothing bounded how many ran at once: 755 attempts took a user's generation from 14.5 to 1.3 tok/s.
Per-address throttling does not help against many addresses. So all hashing goes through one
slot, one hash at a time, paid from a bucket of CPU seconds: it holds at most BURST_S and refills
at SHARE CPU seconds per second. A few logins at once (a team arriving in the morning, a test
suite) pass without waiting; a flood gets at most SHARE of one core, however many attempts or
addresses it uses. The cost of a hash is its thread's CPU time, not its wall time, so a busy
machine does not make the budget stricter.
Attempts for unknown user names take the same slot, pay the same typical cost and wait as long as
a hash takes, without hashing: equal timing for known and unknown names, no CPU for the unknown.
At most MAX_WAITING attempts queue for the slot; the rest are told the server is busy (429) by
the login middleware before Gradio sees them.
"""

from __future__ import annotations

import asyncio
import time

SHARE = 0.05  # of one core, at most, spent hashing passwords over time
BURST_S = 1.0  # CPU seconds of hashing allowed at once (~16 logins here)
MAX_WAITING = 16  # attempts queued for the slot; more get 429 at once
FIRST_GUESS_S = 0.06  # assumed hash cost until one has been measured


class HashBudget:
    def __init__(
        self,
        share: float = SHARE,
        burst_s: float = BURST_S,
        max_waiting: int = MAX_WAITING,
        clock=time.monotonic,
        sleep=asyncio.sleep,
    ):
        if not 0 < share <= 1 or burst_s < 0:
            raise ValueError("share must be in (0, 1] and burst_s >= 0")
        self.share, self.burst_s, self.max_waiting = share, burst_s, max_waiting
        self.clock, self.sleep = clock, sleep
        self.typical_cpu_s = FIRST_GUESS_S  # the last hash's CPU time (what every attempt pays)
        self.typical_wall_s = FIRST_GUESS_S  # ... and its wall time (what unknown names wait)
        self.waiting = 0
        self.hashes = 0  # hashes run (for tests and the docs' numbers)
        self.cpu_spent_s = 0.0
        self._lock: asyncio.Lock | None = None
        self._tokens, self._filled_at = burst_s, clock()

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(self.burst_s, self._tokens + (now - self._filled_at) * self.share)
        self._filled_at = now

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
                self._refill()
                cost = self.typical_cpu_s
                if self._tokens < cost:
                    await self.sleep((cost - self._tokens) / self.share)
                    self._refill()
                if hash_it:
                    start = self.clock()
                    result, cpu = await asyncio.to_thread(_timed, work)
                    self.hashes += 1
                    self.cpu_spent_s += cpu
                    self.typical_cpu_s = max(1e-3, cpu)
                    self.typical_wall_s = max(1e-3, self.clock() - start)
                    cost = cpu
                else:
                    await self.sleep(self.typical_wall_s)
                    result = None
                self._tokens -= cost
                return result
        finally:
            self.waiting -= 1


def _timed(work):
    """(work(), the CPU seconds this thread spent on it)."""
    start = time.thread_time()
    result = work()
    return result, time.thread_time() - start
