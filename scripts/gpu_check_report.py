"""The GPU check's report: one JSON file, rewritten atomically after every stage.

Why: a lent GPU machine returns only what the command left in its output folder and the tail of
what it printed. A check that writes its result once, at the end, returns nothing when it is
killed, crashes or runs out of time. So every state change (a stage starts, finishes, is skipped,
is interrupted) rewrites the whole JSON through a temporary file and os.replace (a reader never
sees half a file), and prints one line that stands on its own in the output tail.

Stage status values:
  pass / fail   a correctness stage's result
  info          a measurement (no pass/fail rule of its own)
  error         the stage raised (its traceback is kept); the next stages still run
  not_run       skipped before it built anything: no time left, no CUDA, a broken CUDA context,
                a missing dependency (its `reason` says which); never counts as a failure
  interrupted   it was running when a signal or the watchdog ended the check
The verdict: FAIL if a correctness stage failed or raised, PASS if every correctness stage passed,
otherwise INCOMPLETE (something was not run or was interrupted, nothing failed).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

CORRECTNESS = ("kernels", "numerics", "bigpool", "graphs")
TAGS = {
    "pass": "ok  ",
    "fail": "FAIL",
    "info": "info",
    "error": "ERR ",
    "not_run": "skip",
    "interrupted": "INTR",
    "running": "....",
}


def line(stage: str, tag: str, msg: str) -> None:
    print(f"[gpu-check] {stage:9s} {tag} {msg}", flush=True)


class Report:
    """Thread-safe: the main thread advances stages; the signal watcher or the watchdog may call
    interrupt() at any moment (it takes the same lock, writes, and the process then exits)."""

    def __init__(self, path: Path, mode: str, stages: list[str]):
        self.path = Path(path)
        self._lock = threading.RLock()
        self._t0 = time.monotonic()
        self._running: str | None = None
        self._running_t0 = 0.0
        self.closed = False
        self.data: dict = {
            "mode": mode,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "planned_stages": list(stages),
            "stages": {},
            "verdict": "INCOMPLETE",
            "finished": False,
        }
        self.write()

    # --- stage transitions ---------------------------------------------------------------
    def start(self, name: str) -> None:
        with self._lock:
            self._running, self._running_t0 = name, time.monotonic()
            self.data["stages"][name] = {"status": "running", "started_s": self.elapsed()}
            self.write()
        line(name, TAGS["running"], "started")

    def finish(self, name: str, status: str, msg: str, data: dict | None = None) -> None:
        with self._lock:
            if self.closed:
                return
            entry = dict(data or {})
            entry.update(
                status=status,
                summary=msg,
                seconds=round(time.monotonic() - self._running_t0, 2)
                if self._running == name
                else 0.0,
            )
            self.data["stages"][name] = entry
            self._running = None
            self.write()
        line(name, TAGS[status], f"{msg} ({entry['seconds']:.1f} s)")

    def not_run(self, name: str, reason: str) -> None:
        with self._lock:
            if self.closed:
                return
            self.data["stages"][name] = {
                "status": "not_run",
                "reason": reason,
                "summary": f"not run: {reason}",
                "seconds": 0.0,
            }
            self.write()
        line(name, TAGS["not_run"], f"not run: {reason}")

    def note(self, name: str, **fields) -> None:
        """Add fields to a stage's entry while it runs (e.g. its child process id)."""
        with self._lock:
            if not self.closed:
                self.data["stages"].setdefault(name, {}).update(fields)
                self.write()

    def set(self, key: str, value) -> None:
        with self._lock:
            self.data[key] = value
            self.write()

    def interrupt(self, reason: str) -> None:
        """Mark the running stage interrupted and the planned ones not run; final write."""
        with self._lock:
            if self.closed:
                return
            running = self._running
            if running is not None:
                entry = self.data["stages"].get(running, {})
                entry.update(
                    status="interrupted",
                    reason=reason,
                    summary=f"interrupted: {reason}",
                    seconds=round(time.monotonic() - self._running_t0, 2),
                )
                self.data["stages"][running] = entry
            for name in self.data["planned_stages"]:
                self.data["stages"].setdefault(
                    name,
                    {
                        "status": "not_run",
                        "reason": f"check ended: {reason}",
                        "summary": f"not run: check ended ({reason})",
                        "seconds": 0.0,
                    },
                )
            self.data["interrupted"] = {"reason": reason, "stage": running, "at_s": self.elapsed()}
            self.close()
        if running:
            line(running, TAGS["interrupted"], f"interrupted: {reason}")

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.data["verdict"] = verdict(self.data["stages"])
            self.data["seconds"] = self.elapsed()
            self.data["finished"] = True
            self.write()
            self.closed = True
        met = [t for t in self.data.get("targets", []) if t.get("met")]
        print(
            f"[gpu-check] VERDICT {self.data['verdict']} ({self.data['mode']}, {self.data['seconds']:.0f} s; "
            f"targets met {len(met)}/{len(self.data.get('targets', []))}) -> {self.path}",
            flush=True,
        )

    # --- output --------------------------------------------------------------------------
    def elapsed(self) -> float:
        return round(time.monotonic() - self._t0, 2)

    def write(self) -> None:
        """Atomic: write a sibling temporary file, fsync, rename over the target."""
        with self._lock:
            self.data["updated_s"] = self.elapsed()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            with open(tmp, "w") as f:
                f.write(json.dumps(self.data, indent=1, default=str))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)


def verdict(stages: dict) -> str:
    checked = [stages.get(n, {}).get("status") for n in CORRECTNESS if n in stages]
    if any(s in ("fail", "error") for s in checked):
        return "FAIL"
    if checked and all(s == "pass" for s in checked):
        return "PASS"
    return "INCOMPLETE"
