"""A test-only OpenAI-compatible server on the app's own FastAPI/uvicorn stack, for the paths a
real engine will not produce on demand: HTTP 500, a stream that breaks off, a slow stream whose
client hangs up. `FakeBackend().start()` serves it on a free local port in a thread.

It is not a fake of our engine (the happy path is tested against a real app.py); it stands in for
a misbehaving remote server, which is the thing under test here.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

VLLM_METRICS = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="fake"} %(usage)s
vllm:num_requests_running{engine="0",model_name="fake"} %(running)s
vllm:num_requests_waiting{engine="0",model_name="fake"} 0.0
vllm:prefix_cache_queries_total{engine="0",model_name="fake"} %(queries)s
vllm:prefix_cache_hits_total{engine="0",model_name="fake"} %(hits)s
vllm:num_preemptions_total{engine="0",model_name="fake"} 0.0
vllm:generation_tokens_total{engine="0",model_name="fake"} %(gen)s
vllm:prompt_tokens_total{engine="0",model_name="fake"} %(queries)s
"""
# a real vLLM writes one cache_config_info line; a test's own (extra_metrics) replaces this one
CACHE_CONFIG = (
    'vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",num_gpu_blocks="1024"}'
    " 1.0\n"
)


def chunk(text=None, finish=None, usage=None, index=0) -> str:
    choices = (
        []
        if usage
        else [{"index": index, "delta": {"content": text} if text else {}, "finish_reason": finish}]
    )
    body = {"id": "x", "object": "chat.completion.chunk", "model": "fake", "choices": choices}
    if usage:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n"


class FakeBackend:
    def __init__(self, mode: str = "ok", key: str | None = None, extra_metrics: str = ""):
        self.mode, self.key = mode, key  # mode: ok | 500 | drop | slow; key: required Bearer key
        self.extra_metrics = extra_metrics  # more /metrics lines (e.g. vllm:cache_config_info)
        self.requests: list[dict] = []
        self.disconnected = threading.Event()
        self.counters = {"usage": 0.25, "running": 0, "queries": 0, "hits": 0, "gen": 0}
        self.app = FastAPI()
        self._routes()

    def _routes(self):
        app = self.app

        @app.get("/v1/models")
        def models():
            return {
                "object": "list",
                "data": [{"id": "fake", "object": "model", "max_model_len": 2048}],
            }

        @app.get("/metrics")
        def metrics():
            own = "" if "vllm:cache_config_info" in self.extra_metrics else CACHE_CONFIG
            return PlainTextResponse(VLLM_METRICS % self.counters + own + self.extra_metrics)

        @app.post("/v1/chat/completions")
        async def chat(body: dict, authorization: str | None = Header(None)):
            self.requests.append(body)
            if self.key is not None and authorization != f"Bearer {self.key}":
                return JSONResponse(
                    {
                        "error": {
                            "message": "Invalid API key",
                            "type": "invalid_request_error",
                            "code": "invalid_api_key",
                        }
                    },
                    status_code=401,
                )
            if self.mode == "500":
                return JSONResponse(
                    {
                        "error": {
                            "message": "CUDA out of memory (simulated)",
                            "type": "server_error",
                            "code": 500,
                        }
                    },
                    status_code=500,
                )

            async def gen():
                try:
                    yield chunk("Hello")
                    yield chunk(" there")
                    if self.mode == "drop":
                        raise RuntimeError("worker died (simulated)")
                    if self.mode == "slow":
                        while True:
                            await asyncio.sleep(0.05)
                            yield chunk(" more")
                    yield chunk(finish="stop")
                    yield chunk(
                        usage={
                            "prompt_tokens": 12,
                            "completion_tokens": 2,
                            "total_tokens": 14,
                            "prompt_tokens_details": {"cached_tokens": 8},
                        }
                    )
                    yield "data: [DONE]\n\n"
                finally:
                    if self.mode == "slow":
                        self.disconnected.set()

            return StreamingResponse(gen(), media_type="text/event-stream")

    def start(self) -> "FakeBackend":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.app, host="127.0.0.1", port=self.port, log_level="critical", ws="none"
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            if time.time() > deadline:
                raise TimeoutError("fake backend did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def unused_url() -> str:
    """A local URL nothing listens on (unreachable backend)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"
