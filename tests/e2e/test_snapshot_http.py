"""Snapshots never wait on compute, through HTTP (issue 26, point 7): a real app process prefills a
cold burst of long API prompts in one engine step of several seconds, and GET /api/kv (what the
Memory tab's page and outside dashboards poll) keeps answering meanwhile.

Why through HTTP as well as tests/engine/observe/test_snapshot_never_waits.py: the route, its scoping and
the server's thread pool sit between a reader and the shared snapshot; any of them could queue a
read behind the engine step again.

The bound. The design says 0.5 s; the snapshot's own wait is at most 0.2 s, and nearly every read
measured here took 0.2-0.25 s. This test allows BOUND_S = 2.0 s (4x the design's figure) because on
a loaded 2-core CI box the prefill's torch threads take every core and an HTTP answer waits for the
OS to schedule the server thread (one read took 1.57 s with the load average at 8). It proves
something only if the engine was inside one step much longer than the bound, so it measures that
too: a read that answered with a snapshot taken 2.5 x BOUND_S ago (its `time`) came while a take
waited that long for the engine (the burst's one step took ~20 s on that box). Had the read waited
for the take, as before issue 26, it would have taken about that long itself.
"""

import json
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.slow

BOUND_S = 2.0
PROMPTS = 8  # x ~450 tokens, prefilled together (one step: --max-num-batched-tokens 8192)


def test_api_kv_answers_within_the_bound_while_a_cold_burst_prefills(launch):
    server = launch(
        args=[
            "--num-blocks",
            "640",
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "16",
            "--max-num-batched-tokens",
            "8192",
        ]
    )
    model = httpx.get(server.url + "v1/models").json()["data"][0]["id"]
    server.get("api/kv")  # the page was open before the burst: the first take is done
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    prompts = [
        " ".join(f"{words[(i * 7 + k) % len(words)]}{i}-{k}" for k in range(150))
        for i in range(PROMPTS)
    ]
    finished = []

    def complete(prompt):
        r = httpx.post(
            server.url + "v1/completions",
            timeout=600,
            json={"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0.0},
        )
        finished.append(r.status_code)

    calls = [threading.Thread(target=complete, args=(p,), daemon=True) for p in prompts]
    for c in calls:
        c.start()
    reads = []  # (seconds the GET took, age of the snapshot it answered with)
    deadline = time.time() + 400
    while any(c.is_alive() for c in calls) and time.time() < deadline:
        t0 = time.time()
        snap = json.loads(server.get("api/kv", timeout=120))
        t1 = time.time()
        reads.append((t1 - t0, t1 - snap["time"]))
        time.sleep(0.05)
    for c in calls:
        c.join(timeout=60)
    assert finished == [200] * PROMPTS, finished
    worst = max(took for took, _ in reads)
    oldest = max(age for _, age in reads)
    print(
        f"\n{len(reads)} reads during the burst: slowest {worst:.2f} s, oldest snapshot {oldest:.1f} s"
    )
    assert worst < BOUND_S, (
        f"a GET /api/kv took {worst:.2f} s while the engine prefilled ({len(reads)} reads)"
    )
    assert oldest >= 2.5 * BOUND_S, (
        f"no read came while the engine was busy for 2.5 x {BOUND_S} s (oldest snapshot {oldest:.1f} s): "
        f"the burst was too short to test the bound"
    )
