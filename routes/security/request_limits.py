"""Input limits for /v1, checked before FastAPI parses a body and before anything is tokenized (#29.8, #29.9).

Why a middleware of its own: the UI had limits (ui/chat/limits.py) but /v1 had none, so a 31 MB
body cost 45 s of server CPU (JSON parse and validation on the event loop, then tokenizing) and
stalled `/metrics` for seconds; 20,000 completion prompts were all tokenized before the queue bound
said 429. Here one pass, in a worker thread, decides from the raw bytes:

- body size: `Content-Length` over the cap -> 413 before a byte is read; a body that grows past the
  cap while being read -> 413 too (chunked uploads);
- bad bytes: not UTF-8, not JSON, numbers past Python's digit limit, nesting deeper than MAX_DEPTH,
  lone surrogates (`"\\ud800"`, which the tokenizer cannot encode: it used to be a plain-text 500)
  -> 400 in OpenAI's error shape, never FastAPI's `{"detail": ...}`;
- work: more than MAX_MESSAGES messages, more than MAX_CHARS characters of text, more than
  MAX_VALUES JSON values, or more prompts x n than the API could ever admit -> 400; the queue
  already full for this many sequences -> 429 (Retry-After), before a prompt is tokenized. Under
  fair scheduling "full" is the caller's own bound (its key's sequences), never all tenants'.
Everything else passes through with its body replayed; the route still validates fields itself.
"""

from __future__ import annotations

import asyncio
import json

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from routes.security.asgi_body import BodyTooLarge, read_body, replaying
from routes.openai.errors import error_body

MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_MESSAGES = 1_000
MAX_CHARS = 400_000  # all strings of one request together (the UI allows 100,000 per message)
MAX_VALUES = 200_000  # JSON values (token ids of a pre-tokenized prompt count one each)
MAX_DEPTH = 32
DRAIN_BYTES = 64 * 1024 * 1024  # an oversized body is read and dropped up to this much, so the
# client sees the 413 instead of a reset connection


class RequestRefused(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str = "invalid_value",
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = (
            status,
            message,
            param,
            code,
            headers,
        )

    def response(self) -> JSONResponse:
        body = error_body(self.status, self.message, self.param, self.code)
        if self.status in (400, 413):
            body["error"]["type"] = "invalid_request_error"
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def _walk(value, limits: "Limits", path: str, depth: int, counts: list[int]) -> None:
    """Depth, characters, values and lone surrogates, in one pass over the parsed document."""
    if depth > limits.max_depth:
        raise RequestRefused(
            400, f"the request nests deeper than {limits.max_depth} levels", path or None
        )
    counts[1] += 1
    if counts[1] > limits.max_values:
        raise RequestRefused(
            400, f"the request holds more than {limits.max_values:,} values", path or None
        )
    if isinstance(value, str):
        counts[0] += len(value)
        if counts[0] > limits.max_chars:
            raise RequestRefused(
                400,
                f"the request holds more than {limits.max_chars:,} characters of text "
                f"(this server's limit per request)",
                path or None,
                "too_long",
            )
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise RequestRefused(
                400,
                f"{path or 'a string'}: contains a lone surrogate (\\ud800-\\udfff), "
                f"which is not text",
                path or None,
            ) from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _walk(k, limits, path, depth + 1, counts)
            _walk(v, limits, f"{path}.{k}" if path else str(k), depth + 1, counts)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _walk(v, limits, f"{path}[{i}]", depth + 1, counts)


class Limits:
    def __init__(
        self,
        max_body_bytes=MAX_BODY_BYTES,
        max_messages=MAX_MESSAGES,
        max_chars=MAX_CHARS,
        max_values=MAX_VALUES,
        max_depth=MAX_DEPTH,
    ):
        self.max_body_bytes, self.max_messages, self.max_chars = (
            max_body_bytes,
            max_messages,
            max_chars,
        )
        self.max_values, self.max_depth = max_values, max_depth

    def check(self, body: bytes) -> dict | None:
        """The parsed document, or RequestRefused. Runs in a worker thread."""
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RequestRefused(
                400, f"the request body is not valid UTF-8 (byte {e.start})"
            ) from None
        try:
            doc = json.loads(text)
        except RecursionError:
            raise RequestRefused(
                400, f"the request nests deeper than {self.max_depth} levels"
            ) from None
        except ValueError as e:  # JSONDecodeError, and ints past sys.get_int_max_str_digits
            raise RequestRefused(
                400, f"the request body is not valid JSON: {str(e)[:120]}"
            ) from None
        _walk(doc, self, "", 0, [0, 0])
        if not isinstance(doc, dict):
            return None
        messages = doc.get("messages")
        if isinstance(messages, list) and len(messages) > self.max_messages:
            raise RequestRefused(
                400,
                f"messages: at most {self.max_messages:,} messages per request, got "
                f"{len(messages):,}",
                "messages",
            )
        return doc


def sequences_asked(doc: dict | None) -> int:
    """How many engine sequences the request would take: prompts x n (0 when unknown)."""
    if not isinstance(doc, dict):
        return 0
    n = doc.get("n", 1)
    n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and prompt and not all(isinstance(x, int) for x in prompt):
        return len(prompt) * n
    return n if ("prompt" in doc or "messages" in doc) else 0


class RequestLimits:
    """ASGI middleware for the /v1 app. server: routes.openai.api.OpenAIServer (its queue bound)."""

    def __init__(self, app, server=None, limits: Limits | None = None):
        self.app, self.server, self.limits = app, server, limits or Limits()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        try:
            body = await self._read(scope, receive)
            if body is None:
                return
            doc = await asyncio.to_thread(self.limits.check, body)
            self._check_capacity(sequences_asked(doc), scope)
        except RequestRefused as e:
            if self.server is not None:
                self.server.metrics.count(_endpoint(scope.get("path", "")), e.status)
            return await e.response()(scope, receive, send)
        await self.app(scope, replaying(body, receive), send)

    async def _read(self, scope, receive) -> bytes | None:
        cap = self.limits.max_body_bytes
        length = dict(scope.get("headers", [])).get(b"content-length", b"")
        too_big = RequestRefused(
            413,
            f"the request body is larger than this server's limit of {cap:,} bytes",
            code="request_too_large",
        )
        if length.isdigit() and int(length) > cap:
            if int(length) <= DRAIN_BYTES:
                await _drain(receive, DRAIN_BYTES)
            raise too_big
        try:
            return await read_body(receive, cap)
        except BodyTooLarge:
            await _drain(receive, DRAIN_BYTES)
            raise too_big from None

    def _check_capacity(self, seqs: int, scope=None) -> None:
        """The route's own capacity rule (OpenAIServer.capacity_refusal), before anything is parsed
        or tokenized: per caller first (its key's bounds), then the server's (issue 48.3)."""
        srv = self.server
        if srv is None or seqs == 0:
            return
        if seqs > srv.max_pending:
            raise RequestRefused(
                400,
                f"this request asks for {seqs:,} sequences (prompts x n); this server "
                f"runs at most {srv.max_pending:,} API sequences at once",
                "prompt",
            )
        tenant = srv.access.tenant_of(Headers(scope=scope)) if scope is not None else "api"
        try:
            reason = srv.capacity_refusal(seqs, tenant)
        except Exception:  # engine gone: the route answers 503 with its own words
            return
        if reason is not None:
            raise RequestRefused(429, reason, code="queue_full", headers={"Retry-After": "1"})


async def _drain(receive, limit: int) -> None:
    """Read and drop the rest of a body (constant memory), at most `limit` bytes."""
    seen = 0
    while seen <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _endpoint(path: str) -> str:
    for suffix, name in (
        ("/chat/completions", "chat_completions"),
        ("/completions", "completions"),
    ):
        if path.rstrip("/").endswith(suffix):
            return name
    return "other"
