"""The decode launch variants the GPU check chooses between (kernels/triton_attention.py
DECODE_VARIANTS) and the fp32 prefill tiles: each is checked against the fp64 dense oracle on a
NaN-poisoned pool, with and without split-K, and the selection is scoped (the check picks one
from measured GB/s; a test or the check's own `with decode_variant(...)` must not leak it)."""

import pytest
import torch

from kernels import triton_attention as ta
from tests.kernels.helpers import build_case, check, run_backend

VARIANTS = list(ta.DECODE_VARIANTS)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("splits", [None, 3])
def test_every_decode_variant_matches_dense(name, splits):
    # contexts across tile edges of both tile sizes (32 and 64), GQA group 3
    c = build_case(
        16, 6, 2, 64, [(0, 1), (30, 1), (63, 1), (64, 1), (130, 1)], torch.float32, seed=4
    )
    with ta.decode_variant(name) as v:
        assert ta.current_decode_variant() is v
        out = run_backend(c, "triton", num_splits=splits)
    check(c, out)


def test_variant_selection_is_scoped_and_sizes_split_k():
    before = ta.current_decode_variant()
    with ta.decode_variant("w4-t32"):
        # w4-t32 keeps 4 programs per SM at head_dim 64 (vs 2): twice the target, more splits
        many = ta.choose_num_splits(8, 8, 4096, None, 32, num_sms=132, head_dim=64)
    with ta.decode_variant("w4-t64"):
        few = ta.choose_num_splits(8, 8, 4096, None, 32, num_sms=132, head_dim=64)
    assert many > few
    assert ta.current_decode_variant() is before
    with pytest.raises(KeyError):
        ta.set_decode_variant("no-such-variant")


def test_fp32_prefill_tiles_on_gpu_are_the_small_ones():
    """128 x 64 fp32 spilled ~57 KB/thread and took 12.6 s to compile for sm_90 (docs/BENCHMARKS.md)."""
    assert ta.prefill_tiles(torch.float32, True, 4) == (64, 32)
    assert ta.prefill_tiles(torch.bfloat16, True, 4) == (128, 64)
    assert ta.prefill_tiles(torch.float32, False, 4) == (64, 64)
    assert ta.prefill_tiles(torch.float32, True, 128) == (128, 32)  # a group wider than the tile


AOT = """
import json, sys
sys.argv = ["compile_sm90"]
sys.path.insert(0, "scripts")
import compile_sm90 as c
from kernels import triton_attention as ta
from triton.backends.compiler import GPUTarget
t = GPUTarget("cuda", 90, 32)
todo = [c.decode("bf16", 64, v, True) for v in ta.DECODE_VARIANTS]
todo += [c.prefill("fp32", 64, *ta.prefill_tiles(__import__("torch").float32, True, 4))]
print(json.dumps([c.compile_one(*v, t) for v in todo]))
"""


@pytest.mark.slow
def test_attention_variants_compile_for_sm90_and_small_fp32_tiles_spill_less():
    """Ahead-of-time compile for the H200 (the real compiler, no GPU): every decode variant
    compiles, and the fp32 prefill tile in use spills under 8 KB per thread (measured 1.7 KB at
    d=64; the 128 x 64 tile it replaced spilled ~57 KB and took 12.6 s to compile, so it is no longer
    compiled here: the full table, both tiles included, is scripts/compile_sm90.py --only all)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("on a GPU the other tests compile and run these kernels for real")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run(
        [sys.executable, "-c", AOT],
        cwd=root,
        env={**env, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=550,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {x["variant"]: x for x in json.loads(r.stdout.strip().splitlines()[-1])}
    assert all(rows[f"decode bf16 d=64 {v} split"]["registers"] for v in VARIANTS)
    m, n = ta.prefill_tiles(torch.float32, True, 4)
    small = rows[f"prefill fp32 d=64 M={m} N={n}"]
    assert small["spill_stores_b"] is not None and small["spill_stores_b"] < 8192, small
