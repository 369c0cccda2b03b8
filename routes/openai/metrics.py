"""Counters for API traffic, appended to /metrics so dashboards can tell API load from browser chats.

The engine's own gauges (running, waiting, KV usage) already count API requests; these add what
only the API layer knows: calls per endpoint and status, rejections, tokens, requests in flight.
"""

from __future__ import annotations

import threading
from collections import Counter


class ApiMetrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.requests: Counter = Counter()  # (endpoint, status) -> count
        self.in_flight = 0  # engine sequences of API calls not yet finished
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generation_tokens = 0

    def count(self, endpoint: str, status: int | str) -> None:
        with self._lock:
            self.requests[(endpoint, str(status))] += 1

    def try_admit(self, seqs: int, bound: int) -> bool:
        """Reserve `seqs` in-flight slots unless that would pass `bound`."""
        with self._lock:
            if self.in_flight + seqs > bound:
                return False
            self.in_flight += seqs
            return True

    def release(self, seqs: int, usage: dict | None = None) -> None:
        with self._lock:
            self.in_flight -= seqs
            if usage:
                self.prompt_tokens += usage["prompt_tokens"]
                self.cached_tokens += usage["prompt_tokens_details"]["cached_tokens"]
                self.generation_tokens += usage["completion_tokens"]

    def prometheus_text(self) -> str:
        with self._lock:
            reqs = sorted(self.requests.items())
            lines = [
                "# HELP paged_chat_api_requests_total OpenAI-compatible API calls by endpoint and HTTP status.",
                "# TYPE paged_chat_api_requests_total counter",
            ]
            lines += [
                f'paged_chat_api_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                for (e, s), n in reqs
            ]
            for name, kind, help_, value in (
                (
                    "paged_chat_api_sequences_in_flight",
                    "gauge",
                    "Sequences of API calls admitted and not yet finished (running or waiting).",
                    self.in_flight,
                ),
                (
                    "paged_chat_api_prompt_tokens_total",
                    "counter",
                    "Prompt tokens of finished API calls.",
                    self.prompt_tokens,
                ),
                (
                    "paged_chat_api_cached_prompt_tokens_total",
                    "counter",
                    "Prompt tokens of finished API calls served from the prefix cache.",
                    self.cached_tokens,
                ),
                (
                    "paged_chat_api_generation_tokens_total",
                    "counter",
                    "Tokens generated for API calls.",
                    self.generation_tokens,
                ),
            ):
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(lines) + "\n"
