"""Simulated users (the Memory tab's demo load; loadgen/measure_sharing.py uses them too): N threads
chatting multi-turn with one shared system prompt.

Each user has its own engine session (its blocks stay pinned between turns, the system prompt's
blocks are shared by all), sends short messages from a fixed list, and samples with its own seeds,
so one person can watch sharing, growth, eviction and preemption happen. Stop aborts the
in-flight requests, ends every session (blocks go back to the pool, cached) and joins the threads.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from typing import Callable

# the app's default shared prompt (a ~550-token assistant policy): demo users attach to its blocks
from storage.presets import DEFAULT_SYSTEM_PROMPT  # noqa: E402
from engine.kv.salt_rule import principal_salt  # noqa: E402

# the simulated users are one principal of their own (engine/kv/salt_rule.py): they share the system
# prompt with everyone, their synthetic chats with no real user
DEMO_SALT = principal_salt("demo", multi_user=True)

USER_MESSAGES = (
    "Hi! What can you do?",
    "Tell me a fun fact about space.",
    "How does a CPU cache work?",
    "Give me three tips for learning to code.",
    "What is a hash table?",
    "Why is the sky blue?",
    "Write a haiku about memory.",
    "What is attention in a transformer?",
    "Explain paging simply.",
    "Recommend a good book about computers.",
    "What is the capital of France?",
    "How do I make a cup of tea?",
    "Can you count to ten?",
    "Summarize our chat so far.",
    "What is a prime number?",
    "Tell me a short joke.",
    "What does a GPU do?",
    "Thanks! And then?",
)

PromptSource = Callable[[], str] | str | None

# One global cap on simulated users per engine (issue 12: each start used to add up to 128 that
# never stopped; 512 users made a normal chat take minutes). start() never goes beyond it.
MAX_DEMO_USERS = 32


class DemoLoad:
    """Owner of the simulated users; thread-safe start/stop, one instance per engine."""

    def __init__(
        self,
        llm,
        system_prompt: PromptSource = None,
        *,
        max_tokens: int = 48,
        temperature: float = 0.8,
        think_s: tuple[float, float] = (0.3, 1.5),
        max_turns: int = 12,
        seed: int = 0,
    ):
        self.llm = llm
        self.system_prompt = system_prompt
        self.max_tokens, self.temperature = max_tokens, temperature
        self.think_s, self.max_turns, self.seed = think_s, max_turns, seed
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._streams: dict[str, object] = {}  # session id -> in-flight stream
        self._user_ids = itertools.count()
        self._run = 0
        self.turns = 0
        self.tokens = 0
        self.errors: list[str] = []

    # ---- control ------------------------------------------------------------------------------
    def start(self, n: int = 8) -> int:
        """Add n users (the run continues if some are already chatting), never beyond
        MAX_DEMO_USERS in all; returns how many run."""
        n = max(0, int(n))
        with self._lock:
            n = min(n, MAX_DEMO_USERS - self.running_users())
            if not self.running_users():
                self._stop = threading.Event()
                self._run += 1
                self._threads = []
            for _ in range(n):
                uid = next(self._user_ids)
                sid = f"demo-{self._run}-{uid}"
                t = threading.Thread(
                    target=self._user,
                    args=(sid, uid, self._stop),
                    name=f"demo-user-{uid}",
                    daemon=True,
                )
                self._threads.append(t)
                t.start()
            return len(self._threads)

    def stop(self, timeout: float = 5.0) -> int:
        """Abort every in-flight request, end the sessions, join the threads; returns users stopped."""
        with self._lock:
            self._stop.set()
            threads, self._threads = self._threads, []
            streams = list(self._streams.values())
        for s in streams:
            try:
                s.abort()
            except Exception:  # the engine may be shutting down; the thread still exits
                pass
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return len(threads)

    def running_users(self) -> int:
        return sum(1 for t in self._threads if t.is_alive())

    def status(self) -> str:
        n = self.running_users()
        head = f"{n} simulated users chatting" if n else "Demo load stopped"
        text = f"{head} · {self.turns:,} replies · {self.tokens:,} tokens generated"
        return text + (f" · last error: {self.errors[-1]}" if self.errors else "")

    # ---- one user -----------------------------------------------------------------------------
    def _prompt(self) -> str:
        src = self.system_prompt
        text = src() if callable(src) else src
        return text if text else DEFAULT_SYSTEM_PROMPT

    def _user(self, sid: str, uid: int, stop: threading.Event) -> None:
        from engine import SamplingParams

        rng = random.Random(self.seed * 7919 + uid)
        messages = [{"role": "system", "content": self._prompt()}]
        turn = 0
        try:
            while not stop.is_set():
                if turn >= self.max_turns:  # start a fresh conversation in the same session
                    self.llm.end_session(sid)
                    messages, turn = [{"role": "system", "content": self._prompt()}], 0
                messages.append({"role": "user", "content": rng.choice(USER_MESSAGES)})
                params = SamplingParams(
                    temperature=self.temperature,
                    max_tokens=self.max_tokens,
                    seed=self.seed * 1_000_003 + uid * 1009 + turn,
                )
                try:
                    stream = self.llm.submit_chat(
                        messages,
                        params,
                        session_id=sid,
                        cache_salt=DEMO_SALT,
                        tenant=f"demo-user-{uid}",
                    )
                except ValueError as e:  # too long for the context: start over
                    self.errors.append(str(e)[:120])
                    turn = self.max_turns
                    continue
                with self._lock:  # stop() sets the flag under this lock, so
                    self._streams[sid] = stream  # either it sees the stream or we see the flag
                    stopped = stop.is_set()
                if stopped:
                    stream.abort()
                reply, ntok = [], 0
                for d in stream:
                    reply.append(d.text)
                    ntok += len(d.token_ids)
                with self._lock:
                    self._streams.pop(sid, None)
                    self.tokens += ntok
                    self.turns += 1
                messages.append({"role": "assistant", "content": "".join(reply)})
                turn += 1
                stop.wait(rng.uniform(*self.think_s))
        except RuntimeError as e:  # engine shut down under us
            self.errors.append(str(e)[:120])
        finally:
            with self._lock:
                self._streams.pop(sid, None)
            try:
                self.llm.end_session(sid)
            except RuntimeError:
                pass
