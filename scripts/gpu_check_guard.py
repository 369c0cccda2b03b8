"""Ends the GPU check cleanly on SIGTERM / SIGINT or at a hard deadline, from a thread.

Why a thread: Python runs signal handlers in the main thread between bytecodes, so a main thread
stuck in C (a Triton compile, a CUDA synchronize, a hung kernel) would never get to write the
report. Python's C-level handler, though, writes the signal number to the wakeup fd at once; a
watcher thread blocked on that socket wakes immediately, marks the running stage "interrupted",
writes the report, kills the stage's child process group (the kernel tests run in pytest) and
exits the process with 128 + signal. A watchdog thread does the same at the hard deadline, so a
check whose caller kills it with SIGKILL shortly after its own timeout has already written.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading

from gpu_check_report import Report


class Guard:
    def __init__(self, report: Report, hard_deadline_s: float | None):
        self.report = report
        self._child: subprocess.Popen | None = None
        self._once = threading.Lock()
        self._rsock, self._wsock = socket.socketpair()
        self._wsock.setblocking(False)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda s, f: None)  # the watcher thread does the work
        signal.set_wakeup_fd(self._wsock.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch_signals, name="gpu-check-signals", daemon=True).start()
        self._stop = threading.Event()
        if hard_deadline_s is not None:
            threading.Thread(
                target=self._watchdog,
                args=(hard_deadline_s,),
                name="gpu-check-watchdog",
                daemon=True,
            ).start()

    def run_child(
        self, args: list[str], timeout: float, on_start=None, **kw
    ) -> subprocess.CompletedProcess:
        """subprocess.run in its own process group, killed with the check. on_start(pid)."""
        with subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            **kw,
        ) as p:
            self._child = p
            if on_start:
                on_start(p.pid)
            try:
                out, _ = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._kill_child()
                out, _ = p.communicate()
                raise subprocess.TimeoutExpired(args, timeout, output=out)
            finally:
                self._child = None
        return subprocess.CompletedProcess(args, p.returncode, out, "")

    def end(self, reason: str, code: int) -> None:
        """Interrupt the report and exit now (from any thread); only the first caller acts."""
        if not self._once.acquire(blocking=False):
            return
        try:
            self._kill_child()
            self.report.interrupt(reason)
        finally:
            os._exit(code)

    def disarm(self) -> None:
        self._stop.set()

    def _kill_child(self) -> None:
        p = self._child
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _watch_signals(self) -> None:
        while True:
            data = self._rsock.recv(1)
            if not data:
                return
            sig = data[0]
            if sig in (signal.SIGTERM, signal.SIGINT):
                self.end(signal.Signals(sig).name, 128 + sig)

    def _watchdog(self, seconds: float) -> None:
        if not self._stop.wait(seconds):
            self.end(f"watchdog: hard limit {seconds:.0f} s reached", 124)
