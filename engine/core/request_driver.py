"""The engine's extension point: a request kind that picks its own next tokens.

Why: beam search used to live inside the step loop (a hook that knew beam groups by name and
edited the scheduler's queue and the engine's request table directly). Now the loop knows only
this Protocol: the engine schedules a driven request's sequences, runs their forwards (KV blocks,
prefix cache, copy-on-write as for any request) and hands their logits rows to the driver instead
of sampling them; the driver grows, forks or frees its sequences through the scheduler's and the
KV manager's public calls, and ends the request with `LLMEngine.end_driven_request`. Beam search
(engine/core/beam_search.py) is one driver; speculative verification or best-of-n reranking
would be others.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class RequestDriver(Protocol):
    def start(self, engine) -> None:
        """Engine thread, on admission: queue the first sequence(s) (`engine.scheduler.add`)."""

    def on_logits(self, engine, seqs: list, logits) -> None:
        """Engine thread, after a forward: next-token logits rows of some of its sequences."""

    def abort(self, reason: str, error: str | None) -> None:
        """The request was aborted (or the engine failed): tell whoever waits on it."""
