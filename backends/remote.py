"""`RemoteEngine`: the chat UI's engine interface (engine/protocol.ChatEngine) on top of any
OpenAI-compatible server (vLLM, SGLang, llama.cpp's server, another app.py).

Why the same interface: the UI, storage and Turn code stay exactly as they are for the embedded
engine; `app.py --backend URL` only swaps the object behind `ctx.llm`.

What differs, and why behaviour stays correct:
- Sessions: the remote side has none. `end_session` / `close_session` are no-ops and every turn
  sends the full conversation (`previous_ids` are ignored); the server's prefix cache (vLLM's
  automatic prefix caching, SGLang's radix cache) finds the shared history itself.
- Token ids: the server tokenizes, so streams have no ids and `count_prompt_tokens` is only an
  estimate (the server refuses a too-long prompt with a 400, which becomes the user's message).
- Errors before the first byte (unreachable, HTTP 4xx/5xx) raise `BackendError` (a ValueError, so
  the UI treats it like a refused prompt: a clear message, nothing generated, nothing lost);
  errors mid-stream end the reply with `error` set (the text so far is stored as such).
"""

from __future__ import annotations

import re
import threading
import time
import uuid

import httpx

from backends.remote_stream import RemoteStream
from engine.exec.model_info import ModelInfo
from engine.text.prepared_prompt import PreparedPrompt

DEFAULT_MAX_MODEL_LEN = 4096  # when /v1/models does not say (vLLM and app.py do)
CHARS_PER_TOKEN = 4  # estimate only: an underestimate lets the server decide


_BLOCK_SIZE = (
    re.compile(r'^vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"', re.M),  # vLLM
    re.compile(r"^paged_chat_kv_block_size_tokens(?:\{[^}]*\})? (\d+)", re.M),
)  # app.py


def block_size_of(metrics_text: str) -> int:
    """The KV block size a backend's Prometheus text states (vLLM's cache_config_info label, or
    this app's own gauge); 0 when it states none (the chat header then says it is not known)."""
    for pattern in _BLOCK_SIZE:
        m = pattern.search(metrics_text)
        if m:
            return int(m.group(1))
    return 0


class BackendError(ValueError):
    """The backend could not take the request; the message is meant for the user."""


def error_message(response) -> str:
    """OpenAI error JSON's message, else the start of the body."""
    try:
        body = response.json()
        err = body.get("error", body) if isinstance(body, dict) else body
        msg = err.get("message") if isinstance(err, dict) else err
        return str(msg or body)[:300]
    except Exception:
        return (response.text or response.reason_phrase or "")[:300]


class RemoteEngine:
    """Chat against `url` (the server root or its /v1). Thread-safe; one HTTP connection per reply."""

    kind = "remote"

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        timeout: float = 10.0,
        name: str | None = None,
        on_finished=None,
    ):
        """name: this replica's name in reply stats when the app spreads over several (None: one
        backend, no name shown); on_finished(stream): called once per reply when its stream ends."""
        self.name, self.on_finished = name, on_finished
        root = url.rstrip("/")
        self.root = root[:-3] if root.endswith("/v1") else root
        self.url, self.api_key = self.root + "/v1", api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # connect/read timeouts only bound the wait for the next byte; a long reply streams freely
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout, read=300.0))
        self._streams: dict[str, RemoteStream] = {}
        self._lock = threading.Lock()
        self.model, self._max_model_len, self.startup_error = model, DEFAULT_MAX_MODEL_LEN, None
        self.model_root: str | None = None  # where the server loaded it from (vLLM: "root")
        self._block_size = 0  # the backend's KV block size, if its /metrics say (0: unknown)
        self.discover()

    # ---- discovery ---------------------------------------------------------------------------
    def discover(self) -> bool:
        """Ask /v1/models for the model id and context length. An unreachable backend is not fatal:
        the app still serves the stored chats, and each send says what is wrong."""
        try:
            r = self.http.get(self.url + "/models", timeout=5.0)
            if r.status_code != 200:
                raise BackendError(
                    f"GET /v1/models answered HTTP {r.status_code}: {error_message(r)}"
                )
            data = r.json().get("data") or [{}]
            card = next((m for m in data if m.get("id") == self.model), data[0])
            self.model = self.model or card.get("id")
            self._max_model_len = int(card.get("max_model_len") or self._max_model_len)
            self.model_root = card.get("root") if isinstance(card.get("root"), str) else None
            self.startup_error = None
            self._block_size = block_size_of(self.metrics_text() or "")
            return True
        except (httpx.HTTPError, BackendError, ValueError) as e:
            self.startup_error = f"backend {self.root} unavailable: {e}"
            return False

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def model_source(self) -> str:
        return f"{self.model or '?'} at {self.root}"

    def model_info(self) -> ModelInfo:
        return ModelInfo(
            name=self.model or "remote",
            source=self.root,
            architecture="remote",
            num_layers=0,
            num_attention_heads=0,
            num_kv_heads=0,
            head_dim=0,
            hidden_size=0,
            vocab_size=0,
            dtype="?",
            max_model_len=self._max_model_len,
            block_size=self._block_size,
            num_blocks=0,
            kv_bytes_per_token=0,
            max_num_seqs=0,
            attention_backend="remote",
            device="remote",
        )

    def get_tokenizer(self):
        return None

    def count_prompt_tokens(self, messages: list[dict], thinking: bool | None = None) -> int:
        return sum(len(str(m.get("content") or "")) for m in messages) // CHARS_PER_TOKEN

    def prepare_chat(
        self,
        messages: list[dict],
        *,
        previous_ids: list[int] | None = None,
        session_id: str | None = None,
        thinking: bool | None = None,
    ) -> PreparedPrompt:
        """No ids here (the server tokenizes): the messages and the length estimate."""
        return PreparedPrompt(
            tuple(messages), thinking, self.count_prompt_tokens(messages, thinking)
        )

    # ---- generation --------------------------------------------------------------------------
    def request_body(self, messages: list[dict], params) -> dict:
        body = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if params is not None:
            body.update(
                n=params.n,
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=params.max_tokens,
            )
            if params.seed is not None:
                body["seed"] = params.seed
            if params.stop:
                body["stop"] = params.stop
            if params.top_k and params.top_k > 0:  # vLLM / SGLang / app.py extras
                body["top_k"] = params.top_k
            if params.repetition_penalty != 1.0:
                body["repetition_penalty"] = params.repetition_penalty
        return body

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
        prepared: PreparedPrompt | None = None,
    ) -> RemoteStream:
        """Send the whole conversation; return once the server accepted it (headers received).
        A per-user `cache_salt` (under --auth) is sent as vLLM's `cache_salt` field, which keeps
        one user's prefix-cache hits from revealing another's text on servers that honour it.
        `thinking` (not None) goes as vLLM's `chat_template_kwargs: {"enable_thinking": ...}`.
        `prepared` carries no ids for a remote engine: the messages are what is sent."""
        if self.model is None and not self.discover():
            raise BackendError(f"Cannot reach the backend: {self.startup_error}")
        rid = request_id or f"chat-{uuid.uuid4().hex[:12]}"
        body = self.request_body(messages, params)
        if cache_salt:
            body["cache_salt"] = cache_salt
        if thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": bool(thinking)}
        sent = time.monotonic()
        try:
            req = self.http.build_request(
                "POST", self.url + "/chat/completions", json=body, headers={"X-Request-Id": rid}
            )
            response = self.http.send(req, stream=True)
        except httpx.HTTPError as e:
            raise BackendError(
                f"Cannot reach the backend at {self.root}: {type(e).__name__}: {e}"
            ) from None
        if response.status_code != 200:
            try:
                response.read()
                msg = error_message(response)
            finally:
                response.close()
            raise BackendError(
                f"The backend at {self.root} answered HTTP {response.status_code}: {msg}"
            )
        stream = RemoteStream(
            response,
            rid,
            getattr(params, "n", 1) or 1,
            sent,
            on_close=self._forget,
            served_by=self.name,
            on_finished=self.on_finished,
        )
        with self._lock:
            if not stream._aborted.is_set():
                self._streams[rid] = stream
        return stream

    def load(self) -> tuple[int, int]:
        """(streams this app has open on the backend, 0): the server's own queue is behind its
        /metrics, which the Memory tab reads; admission here must not cost an HTTP round trip."""
        with self._lock:
            return (len(self._streams), 0)

    def _forget(self, rid: str) -> None:
        with self._lock:
            self._streams.pop(rid, None)

    def abort(self, request_id: str) -> bool:
        with self._lock:
            stream = self._streams.get(request_id)
        if stream is None:
            return False
        stream.abort()
        return True

    # ---- sessions: the server has none (full prompt every turn; its prefix cache reuses) -------
    def end_session(self, session_id: str) -> bool:
        return False

    def close_session(self, session_id: str) -> bool:
        return False

    # ---- memory: only what the server exposes --------------------------------------------------
    def snapshot(self) -> dict:
        """The backend's KV snapshot when it is another app.py (GET /api/kv); RuntimeError otherwise."""
        return self._kv(fresh=True)

    def latest_snapshot(self) -> dict:
        return self._kv(fresh=False)

    def _kv(self, fresh: bool) -> dict:
        try:
            r = self.http.get(self.root + "/api/kv" + ("?fresh=1" if fresh else ""), timeout=5.0)
        except httpx.HTTPError as e:
            raise RuntimeError(f"backend unreachable: {e}") from None
        if r.status_code != 200 or "json" not in r.headers.get("content-type", ""):
            raise RuntimeError(
                f"the backend exposes no KV snapshot (GET /api/kv: HTTP {r.status_code})"
            )
        return r.json()

    def metrics_text(self) -> str | None:
        """The backend's Prometheus /metrics text, or None when it serves none."""
        try:
            r = self.http.get(self.root + "/metrics", timeout=5.0)
        except httpx.HTTPError:
            return None
        return r.text if r.status_code == 200 else None

    def shutdown(self) -> None:
        with self._lock:
            streams = list(self._streams.values())
        for s in streams:
            s.abort()
        self.http.close()
