"""One real engine and an in-process uvicorn server per test session: /v1 mounted exactly as the app
mounts it (plus /metrics and /api/kv), on a free local port. Clients are the official `openai`
package or plain HTTP. At the end every block must be back (nothing leaked by any test)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

API_KEY = "sk-test-key"
NUM_BLOCKS = 384


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """uvicorn serving `app` in a thread; `url` ends with '/'."""

    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.server = uvicorn.Server(
            uvicorn.Config(
                app,
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
                ws="none",
                timeout_graceful_shutdown=2,
            )
        )
        self.thread = threading.Thread(
            target=self.server.run, daemon=True, name=f"uvicorn-{self.port}"
        )
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


def build_server_app(llm, **api_kw):
    import fastapi

    from routes.openai.api import mount_openai_api
    from routes.metrics import register_routes

    app = fastapi.FastAPI()
    register_routes(app, llm)
    mount_openai_api(app, llm, **api_kw)
    return app


@pytest.fixture(scope="session")
def llm():
    from engine import ServingLLM

    m = ServingLLM(num_blocks=NUM_BLOCKS, max_model_len=1024, max_num_seqs=64)
    yield m
    try:
        assert wait_idle(m)["used_blocks"] == 0, "blocks leaked by the API tests"
    finally:
        m.shutdown()


def wait_idle(llm, timeout: float = 30) -> dict:
    """Stats once no request runs or waits and no block is held beyond pins (or after timeout)."""
    deadline = time.time() + timeout
    while True:
        s = llm.stats()
        idle = (
            s["running"] == 0
            and s["waiting"] == 0
            and s["used_blocks"] == s.get("pinned_blocks", 0)
        )
        if idle or time.time() > deadline:
            return s
        time.sleep(0.05)


@pytest.fixture(scope="session")
def server(llm):
    """Open API (no key), like the default local app."""
    srv = LiveServer(build_server_app(llm))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def keyed_server(llm):
    """API keys required, one allowed origin, a tiny queue bound (max_pending=2) for the 429 test."""
    srv = LiveServer(
        build_server_app(
            llm,
            api_keys=[API_KEY, "sk-second"],
            allowed_origins=["http://good.example"],
            max_pending=2,
        )
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def model_id(server) -> str:
    import json
    import urllib.request

    with urllib.request.urlopen(server.url + "v1/models") as r:
        return json.load(r)["data"][0]["id"]


@pytest.fixture()
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture()
def aclient(server):
    import openai

    return openai.AsyncOpenAI(
        base_url=server.url + "v1", api_key="unused", max_retries=0, timeout=300
    )
