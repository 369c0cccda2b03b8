"""The one thread that owns the engine: the model, the KV pool, the scheduler and every request.

Why a thread and a queue: the engine's state is touched step by step by one loop; anything else
(HTTP handlers, Gradio callbacks, the dashboard) would race it. So nothing outside this thread
touches the engine; they put commands on its queue and, when they need an answer, wait on a
future. `run(fn)` is the public way to run work on the engine thread (pins, beam search, stats);
`add` and `abort` are the two commands every request needs.

Life cycle: started by the LLM front; between steps it drains commands (blocking when idle);
`stop()` ends the loop after the current step. Once closed, every command still queued is answered
(requests end with "the engine was shut down", futures raise) and new ones are refused, so no
caller waits forever and no request is left without a final output.
"""

from __future__ import annotations

import queue
import threading
import traceback
from concurrent.futures import Future
from typing import Callable

SHUT_DOWN = "the engine has been shut down"
SAVE_BUDGET_S = 5.0  # a graceful stop keeps the pool's blocks in the KV tier at most this long


class EngineThread:
    """Hosts `engine` (an LLMEngine) on its own thread. `after_step(engine, idle)` runs on that
    thread after every loop turn (the front publishes its plain-read figures there); `idle` is
    True when the loop is about to block with nothing to do."""

    def __init__(self, engine, after_step: Callable[[object, bool], None] | None = None):
        self.engine = engine
        self._after_step = after_step
        self._commands: queue.Queue = queue.Queue()
        self._lock = threading.Lock()  # `closed` and the last puts agree (see _close)
        self._stopping = False
        self.closed = False
        self.saved_to_tier: dict | None = None  # what the stop kept in the KV tier (None: none)
        self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)
        self._thread.start()

    # ---- callers (any thread) -------------------------------------------------------------------
    def run(self, fn: Callable, timeout: float | None = None):
        """Run `fn(engine)` on the engine thread between two steps and return its result (its
        exception is raised here). RuntimeError once the engine is shut down."""
        return self._ask("call", fn, timeout)

    def abort(self, request_id: str) -> bool:
        return bool(self._ask("abort", request_id, None))

    def add(self, requests: list) -> bool:
        """Queue requests for the next step without waiting; False when shut down (the caller
        ends their outputs)."""
        with self._lock:
            if self.closed:
                return False
            self._commands.put(("add", requests, None))
            return True

    def stop(self, timeout: float = 30) -> dict | None:
        """End the loop after the current step; returns what was kept in the KV tier (or None)."""
        if self._thread.is_alive():
            self._commands.put(("stop", None, None))
            self._thread.join(timeout=timeout)
        return self.saved_to_tier

    def _ask(self, kind: str, arg, timeout: float | None):
        fut: Future = Future()
        with self._lock:  # _close drains the queue after setting `closed` under it
            if self.closed:
                raise RuntimeError(SHUT_DOWN)
            self._commands.put((kind, arg, fut))
        return fut.result(timeout=timeout)

    # ---- the engine thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        eng = self.engine
        while not self._stopping:
            try:
                self._drain(block=not eng.has_unfinished())
                if self._stopping:
                    break
                if eng.has_unfinished():
                    try:
                        eng.step()
                    except (
                        Exception
                    ) as e:  # a bug or OOM must not kill every other session silently
                        traceback.print_exc()
                        eng.fail_all(f"engine error: {e!r}")
                if self._after_step is not None:
                    self._after_step(eng, not eng.has_unfinished())
            except Exception:  # never let the one engine thread die
                traceback.print_exc()
        self._close()

    def _drain(self, block: bool) -> None:
        try:
            cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._run_command(cmd)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return

    def _run_command(self, cmd) -> None:
        kind, arg, fut = cmd
        try:
            if kind == "add":
                for req in arg:
                    try:
                        self.engine.add_request(req)
                    except Exception as e:  # that request only
                        self.engine.fail_request_outputs(req, str(e))
                result = None
            elif kind == "abort":
                result = self.engine.abort_request(arg)
            elif kind == "call":
                result = arg(self.engine)
            else:  # "stop"
                self._stopping = True
                result = None
            if fut is not None:
                fut.set_result(result)
        except Exception as e:
            if fut is not None:
                fut.set_exception(e)

    def _close(self) -> None:
        """The loop is over: end every request, keep the pool's computed blocks in the KV tier (a
        graceful stop, within SAVE_BUDGET_S: engine/kv/tier/link.py) and answer every command still
        queued."""
        with self._lock:
            self.closed = True
        self.engine.fail_all("the engine was shut down")
        try:
            self.saved_to_tier = self.engine.keep_pool_in_tier(SAVE_BUDGET_S)
        except Exception:  # keeping them is an optimisation; stopping is not
            traceback.print_exc()
        while True:
            try:
                kind, arg, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                for req in arg:
                    self.engine.fail_request_outputs(req, "the engine was shut down")
            if fut is not None:
                fut.set_exception(RuntimeError(SHUT_DOWN))
