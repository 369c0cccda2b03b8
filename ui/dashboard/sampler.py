"""One stats sampler per engine: records the KV/scheduler counters into the dashboard's History
every second, whether or not any page is open, so the Memory tab's charts are continuous.

Why a thread and stats only: a tick only runs while someone watches the Memory tab, so history
fed by ticks had holes wherever nobody watched (and the charts drew straight lines across them).
Reading the stats contract (`llm.stats()`, a few dozen integers taken between two engine steps)
costs microseconds; the full snapshot (per-block arrays) is never taken here.
A period when the sampler could not record (engine stalled in a long step, app stopped, engine
restarted) shows as a gap in the charts (ui/dashboard/history.plot_points), not as a line.
"""

from __future__ import annotations

import threading
import time

from engine.protocol import ReportsStats
from ui.dashboard.history import History, sample_of_stats

INTERVAL_S = 1.0


def read_stats(llm) -> dict:
    """The stats contract: `llm.stats()` where the engine has it, else the latest snapshot's."""
    if isinstance(llm, ReportsStats):
        return llm.stats()
    return llm.latest_snapshot()["stats"]


class StatsSampler:
    """A daemon thread calling `read_stats(llm)` every interval_s into `history`; stops by itself
    once the engine says it has been shut down (RuntimeError), or on `stop()`."""

    def __init__(self, llm, history: History, interval_s: float = INTERVAL_S, clock=time.time):
        self.llm, self.history, self.interval_s, self.clock = llm, history, interval_s, clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0
        self.errors = 0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def sample_once(self) -> bool:
        try:
            st = read_stats(self.llm)
        except RuntimeError:  # engine shut down: nothing more to record
            self._stop.set()
            return False
        except Exception:  # a bad read must not kill the sampler
            self.errors += 1
            return False
        ok = self.history.add_sample(sample_of_stats(st, self.clock()))
        self.samples += ok
        return ok

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)

    def start(self) -> "StatsSampler":
        if not self.running:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="kv-stats-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
