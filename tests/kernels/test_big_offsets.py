"""The GPU check's big-pool stage (scripts/check_big_pool.py) on a pool whose per-layer K slab has
more than 2^31 elements, through the Triton interpreter on CPU.

Why this is possible here: the pool is torch.empty, and Linux commits a page only when it is
written, so an 8 GiB virtual pool costs ~100 MB resident; the interpreter hands kernels the
tensors' own storage (no copy). Its integer math is numpy's, so an index computed in int32 wraps
exactly as on the GPU and lands elsewhere: rope_and_store, store_kv, decode and prefill attention
and copy_blocks are each checked at the top of the pool. On a GPU the same test runs on the device.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from check_big_pool import check_big_pool  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


BIG = """
import json, sys
sys.path.insert(0, "scripts")
from check_big_pool import check_big_pool
bs, kvh, d, layers = 16, 2, 64, 1
slab_blocks = (2**31) // (bs * kvh * d) + 8                 # one K slab just past 2^31 elements
r = check_big_pool(sys.argv[1], "bfloat16", fraction=1.0, kvh=kvh, d=d, bs=bs, layers=layers,
                   max_bytes=slab_blocks * 2 * layers * bs * kvh * d * 2, backend="triton")
print(json.dumps(r))
"""


def test_kernels_at_element_offsets_past_int32():
    """In a child process: an index that wraps in int32 points outside the pool and segfaults the
    interpreter; that must be this test's failure, not the end of the test session."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if DEVICE == "cpu":
        env["TRITON_INTERPRET"] = "1"
    p = subprocess.run(
        [sys.executable, "-c", BIG, DEVICE],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, (
        f"exit {p.returncode} (-11: an out-of-pool address): {p.stderr[-2000:]}"
    )
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["layer_slab_elements"] > 2**31 - 1 and r["offsets_past_int32"]
    assert r["rope_store_exact"] is True, r
    assert r["store_exact"] and r["copy_exact"], r
    assert r["attention_ok"] and r["prefill_ok"], r
    assert r["ok"]


def test_big_pool_check_small_pool_passes_and_sees_offsets():
    """The same stage on a small pool (the smoke shape): every part runs and agrees."""
    r = check_big_pool(DEVICE, "bfloat16", kvh=2, d=64, max_bytes=32 << 20, backend="triton")
    assert not r["offsets_past_int32"]
    assert (
        r["rope_store_exact"]
        and r["store_exact"]
        and r["attention_ok"]
        and r["prefill_ok"]
        and r["copy_exact"]
    ), r
