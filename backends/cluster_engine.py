"""`ClusterEngine`: the chat on several OpenAI-compatible replicas at once (`app.py --backend URL
--backend URL ...`), each optionally with its KV-event stream (`--backend-kv-events`).

Why in the app and not only behind a router: the Memory tab of a cluster must know which replica
served each turn and what each one caches, and a router in front hides both. With a router in
front (llm-d, vLLM's production-stack router) give `--backend ROUTER` once and the replicas'
event streams with `--backend-kv-events`: the tab then draws the replicas, and the chat goes
through the router (docs/SCALE_OUT.md).

How a turn picks its replica (`routing`):
- "conversation" (default): by a hash of the conversation's first messages (the system prompt
  and the first user message), so every later turn of a chat lands on the replica that holds its
  history, and different chats spread over the replicas. Like a session-affinity router.
- "round-robin": each turn to the next replica. Every replica then prefills the same history
  again; the Memory tab shows what that duplicates.
A replica that refuses or cannot be reached is skipped for that turn (the next in order is tried).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
import uuid
from collections import deque
from urllib.parse import urlsplit

from backends.kv_cluster import Cluster, Replica
from backends.remote import BackendError, RemoteEngine

ROUTING = ("conversation", "round-robin")
LANDINGS_KEPT = 200


def replica_name(url: str) -> str:
    """host:port of a replica URL: short, and the same words an operator's config uses."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    return parts.netloc or url


def conversation_key(messages: list[dict]) -> int:
    """The first system message and the first user message: what stays the same on every turn."""
    first = [m for m in messages if m.get("role") == "system"][:1] + [
        m for m in messages if m.get("role") == "user"
    ][:1]
    text = "\x1e".join(f"{m.get('role')}\x1f{m.get('content')}" for m in first)
    return int.from_bytes(
        hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=8).digest(), "big"
    )


class ClusterEngine:
    """ChatEngine over several RemoteEngines; `cluster_view()` gives the Memory tab its model."""

    kind = "remote"

    def __init__(
        self,
        urls: list[str],
        *,
        api_key: str | None = None,
        model: str | None = None,
        kv_events: list[str] | None = None,
        routing: str = "conversation",
        timeout: float = 10.0,
        tokenizer: str | None = None,
    ):
        if routing not in ROUTING:
            raise ValueError(f"routing must be one of {', '.join(ROUTING)}")
        if kv_events and len(kv_events) > max(1, len(urls)) and len(urls) != 1:
            raise ValueError(
                "give one --backend-kv-events per --backend, in the same order "
                "(or one --backend, a router, and one per replica behind it)"
            )
        self.routing = routing
        self.landings: deque = deque(maxlen=LANDINGS_KEPT)
        self._pending: dict[str, tuple[str | None, str]] = {}
        self._lock = threading.Lock()
        self._rr = itertools.count()
        names = [replica_name(u) for u in urls]
        # one URL (a router, or one replica): the reply line names no replica, as without events
        self.engines = [
            RemoteEngine(
                u,
                api_key=api_key,
                model=model,
                timeout=timeout,
                name=n if len(urls) > 1 else None,
                on_finished=self._finished,
            )
            for u, n in zip(urls, names)
        ]
        kv_events = list(kv_events or [])
        if len(urls) == 1 and len(kv_events) > 1:  # a router in front of several replicas
            replicas = [Replica(replica_name(spec.split(",")[0]), None, spec) for spec in kv_events]
        else:
            kv_events += [None] * (len(urls) - len(kv_events))
            replicas = [Replica(n, e, spec) for n, e, spec in zip(names, self.engines, kv_events)]
        self.sent_to = names[0] if len(urls) == 1 else None  # landings' "replica" behind a router
        self.cluster = Cluster(
            replicas,
            tokenizer_folders=[tokenizer]
            if tokenizer
            else [e.model_root for e in self.engines if e.model_root],
        )
        first = self.engines[0]
        self.model, self.root = first.model, first.root
        self.startup_error = (
            "; ".join(e.startup_error for e in self.engines if e.startup_error) or None
        )

    # ---- what the tab reads --------------------------------------------------------------------
    def cluster_view(self) -> Cluster:
        return self.cluster

    def recent_landings(self) -> list:
        """The latest finished turns: {at, replica, salt, prompt_tokens, cached_tokens}."""
        return list(self.landings)

    def start(self) -> ClusterEngine:
        self.cluster.start()
        return self

    # ---- ChatEngine ----------------------------------------------------------------------------
    @property
    def max_model_len(self) -> int:
        return min(e.max_model_len for e in self.engines)

    @property
    def model_source(self) -> str:
        return f"{self.model or '?'} on " + ", ".join(e.root for e in self.engines)

    def model_info(self):
        return self.engines[0].model_info()

    def get_tokenizer(self):
        return None

    def count_prompt_tokens(self, messages: list[dict], thinking: bool | None = None) -> int:
        return self.engines[0].count_prompt_tokens(messages, thinking)

    def prepare_chat(
        self,
        messages: list[dict],
        *,
        previous_ids: list[int] | None = None,
        session_id: str | None = None,
        thinking: bool | None = None,
    ):
        return self.engines[0].prepare_chat(messages, thinking=thinking)

    def order(self, messages: list[dict]) -> list[RemoteEngine]:
        """The replicas in the order this turn tries them (the first one normally serves it)."""
        n = len(self.engines)
        start = (
            next(self._rr) % n if self.routing == "round-robin" else conversation_key(messages) % n
        )
        return [self.engines[(start + k) % n] for k in range(n)]

    def submit_chat(
        self,
        messages: list[dict],
        params=None,
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        previous_ids: list[int] | None = None,
        cache_salt: str | None = None,
        tenant: str | None = None,
        priority: int = 0,
        thinking: bool | None = None,
        prepared=None,  # a remote engine's prepared prompt has no ids: messages go
    ):
        rid = request_id or f"chat-{uuid.uuid4().hex[:12]}"
        errors = []
        for eng in self.order(messages):
            with self._lock:
                self._pending[rid] = (cache_salt, eng.name)
            try:
                return eng.submit_chat(
                    messages, params, request_id=rid, cache_salt=cache_salt, thinking=thinking
                )
            except BackendError as e:
                with self._lock:
                    self._pending.pop(rid, None)
                errors.append(str(e))
                if "HTTP 4" in str(e):  # the request itself is refused: same everywhere
                    break
        raise BackendError(errors[-1] if len(errors) == 1 else " / ".join(errors))

    def _finished(self, stream) -> None:
        with self._lock:
            salt, name = self._pending.pop(stream.request_id, (None, stream.served_by))
        name = name or f"{self.sent_to} (a router or one replica: which one is not known here)"
        usage = stream.usage()
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        self.landings.append(
            {
                "at": time.time(),
                "replica": name,
                "salt": salt,
                "prompt_tokens": usage.get("prompt_tokens"),
                "cached_tokens": cached,
            }
        )

    def abort(self, request_id: str) -> bool:
        return any(e.abort(request_id) for e in self.engines)

    def load(self) -> tuple[int, int]:
        return (sum(e.load()[0] for e in self.engines), 0)

    def end_session(self, session_id: str) -> bool:
        return False

    def close_session(self, session_id: str) -> bool:
        return False

    def snapshot(self) -> dict:
        raise RuntimeError(
            "a cluster has no single block pool; the Memory tab draws each replica's"
        )

    def latest_snapshot(self) -> dict:
        return self.snapshot()

    def metrics_text(self) -> str | None:
        """The first replica's /metrics (RemoteBackend); the tab reads every replica's itself."""
        return self.engines[0].metrics_text()

    def shutdown(self) -> None:
        self.cluster.stop()
        for e in self.engines:
            e.shutdown()
