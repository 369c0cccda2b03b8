"""One streamed chat completion from a remote OpenAI-compatible server, shaped like the embedded
engine's request stream (`RequestOutputDelta`s; sync iteration, `async for`, `.abort()`).

Why a reader thread: the UI consumes engine streams with `async for` on Gradio's loop, and the
embedded engine's deltas arrive from another thread too. Reading the HTTP response with a plain
(sync) httpx client in a thread keeps the event loop free, and `abort()` can close the response
from any thread: closing the connection is how a client tells vLLM / SGLang / app.py to stop
generating and free the request's KV blocks.

Deltas carry `metrics` in the embedded engine's keys (prompt_tokens, cached_tokens, output_tokens,
ttft_s, tokens_per_s) measured here, on the client side: TTFT is from sending the request to the
first text; cached tokens only when the server reports `prompt_tokens_details.cached_tokens`.
"""

from __future__ import annotations

import json
import socket
import threading
import time

from engine.core.sequence import RequestOutputDelta
from engine.front.handover import Handover

_END = object()


def iter_sse_events(lines):
    """Client side of routes.openai.stream.sse: the JSON objects of an OpenAI SSE stream, given its
    text lines; stops at [DONE]. Here, with the backend that reads such streams (the UI on vLLM,
    SGLang or another app.py), since backends must not import routes."""
    for line in lines:
        line = line.strip()
        if not line.startswith("data:"):
            continue  # blank separators, ": keep-alive" comments, event: names
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


class RemoteStream:
    def __init__(
        self,
        response,
        request_id: str,
        n: int,
        sent_at: float,
        on_close=None,
        served_by: str | None = None,
        on_finished=None,
    ):
        self.request_id, self.n, self.sent_at = request_id, n, sent_at
        self._on_finished = on_finished  # called with this stream once it has ended
        self.served_by = served_by  # which replica, when the app spreads over several
        self.prompt_ids = None  # the remote side tokenizes; we never see the ids
        self._response, self._on_close = response, on_close
        self._handover = Handover()  # blocking or `async for` consumer (engine/front/handover.py)
        self._aborted = threading.Event()
        self._first: float | None = None
        self._counts = [0] * n
        self._reasons: list[str | None] = [None] * n
        self._usage: dict = {}
        self._thread = threading.Thread(target=self._read, daemon=True, name=f"remote-{request_id}")
        self._thread.start()

    # ---- reader thread -----------------------------------------------------------------------
    def _metrics(self, i: int) -> dict:
        m = {
            "state": "running",
            "output_tokens": self._usage.get("completion_tokens", self._counts[i])
            if self.n == 1
            else self._counts[i],
        }
        if "prompt_tokens" in self._usage:
            m["prompt_tokens"] = self._usage["prompt_tokens"]
        cached = (self._usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        if cached is not None:
            m["cached_tokens"] = cached
        if self.served_by:
            m["served_by"] = self.served_by
        if self._first is not None:
            m["ttft_s"] = self._first - self.sent_at
            decode = time.monotonic() - self._first
            if decode > 0 and m["output_tokens"] > 1:
                m["tokens_per_s"] = (m["output_tokens"] - 1) / decode
        return m

    def _read(self) -> None:
        error = None
        try:
            for event in iter_sse_events(self._response.iter_lines()):
                if self._aborted.is_set():
                    break
                if "error" in event and not event.get("choices"):
                    err = event["error"]
                    error = err.get("message") if isinstance(err, dict) else str(err)
                    break
                if event.get("usage"):
                    self._usage = event["usage"]
                for c in event.get("choices") or []:
                    i = int(c.get("index", 0))
                    if not 0 <= i < self.n:
                        continue
                    text = (c.get("delta") or {}).get("content") or c.get("text") or ""
                    if text:
                        self._first = self._first or time.monotonic()
                        self._counts[i] += 1
                        self._emit(
                            RequestOutputDelta(
                                self.request_id, i, text, [], metrics=self._metrics(i)
                            )
                        )
                    if c.get("finish_reason"):
                        self._reasons[i] = c["finish_reason"]
        except Exception as e:  # connection dropped, bad JSON, closed by abort()
            if not self._aborted.is_set():
                error = f"the backend's stream broke off: {type(e).__name__}: {e}"
        finally:
            self._close_response()
        for i in range(self.n):
            reason, err = self._reasons[i], error
            if self._aborted.is_set():
                reason, err = reason or "abort", None
            elif reason is None and err is None:
                err = "the backend closed the stream before the reply finished"
            if err is not None:
                reason = "error"
            m = self._metrics(i)
            m["state"] = "finished"
            self._emit(
                RequestOutputDelta(
                    self.request_id,
                    i,
                    "",
                    [],
                    finished=True,
                    finish_reason=reason,
                    error=err,
                    metrics=m,
                )
            )
        if self._on_finished is not None:
            try:
                self._on_finished(self)
            except Exception:  # bookkeeping must never break the reply
                pass
        self._emit(_END)

    def _emit(self, item) -> None:
        """Hand one item to the consumer: straight onto its event loop once it iterates with
        `async for` (no thread parked per stream), else onto the thread-safe queue."""
        try:
            self._handover.put(item)
        except RuntimeError:  # the consumer's event loop is closed: nobody listens any more
            pass

    def _close_response(self) -> None:
        try:
            self._response.close()
        except Exception:
            pass
        if self._on_close is not None:
            self._on_close(self.request_id)

    def usage(self) -> dict:
        """The server's `usage` object of this reply (empty until it arrives, at the end)."""
        return dict(self._usage)

    # ---- consumer side -----------------------------------------------------------------------
    def abort(self) -> None:
        """Stop reading and hang up; the server sees the disconnect and aborts the request."""
        if not self._aborted.is_set():
            self._aborted.set()
            self._hang_up()
            self._close_response()

    def _hang_up(self) -> None:
        """Shut the socket down before closing it. Why: the reader thread sits in recv() on it, and
        on Linux a close() from another thread neither wakes that recv nor sends the FIN, so the
        server kept generating until its next chunk came back here; shutdown() does both at once."""
        try:
            sock = self._response.extensions["network_stream"].get_extra_info("socket")
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except Exception:  # no socket (a test transport) or already closed
            pass

    def __iter__(self):
        while True:
            d = self._handover.get()
            if d is _END:
                return
            yield d

    def __aiter__(self):
        return self._agen()

    async def _agen(self):
        while True:
            d = await self._handover.aget()
            if d is _END:
                return
            yield d
