"""The compiled CPU row pass (kernels/cpu_sampling.py) and the all-rows-sample batch path.

The row pass must return exactly the K largest values of each row (as a multiset; which of several
tied tokens at the boundary it keeps is free, as with torch.topk) with their true token ids, and
the row's log-sum-exp within float rounding of an fp64 reference. The chat's usual batch (every
row samples, repetition penalty) then goes through it and must pick the reference sampler's token
for every row, with the kernel and with the torch ops.
"""

import shutil

import pytest
import torch

from engine.sampling.sampler import make_generator, sample
from engine.sampling.sampling_params import SamplingParams
from kernels import cpu_sampling
from tests.engine.sampling.helpers import reference_batch


def test_the_compiled_pass_is_active_where_a_compiler_exists():
    has_compiler = (shutil.which("g++") or shutil.which("c++")) is not None
    assert (cpu_sampling._lib() is not None) == has_compiler, cpu_sampling.active_path()


@pytest.mark.parametrize("kind", ["peaked", "ties", "neg_inf", "k_equals_v", "all_neg_inf"])
def test_row_stats_against_fp64_reference(kind):
    g = torch.Generator().manual_seed(3)
    R, V, K = 7, 5000, 256
    x = torch.randn(R, V, generator=g) * 4
    if kind == "ties":
        x = torch.randint(-5, 6, (R, V), generator=g).float()
    if kind == "neg_inf":
        x[:, ::3] = float("-inf")
    if kind == "k_equals_v":
        V = K = 300
        x = x[:, :V].contiguous()
    if kind == "all_neg_inf":
        x[2] = float("-inf")
    vals, idx, lse = cpu_sampling.row_stats(x, K)
    assert torch.equal(x.gather(-1, idx), vals)  # ids point at their values
    assert all(len(set(r.tolist())) == K for r in idx)  # no token twice
    want = x.topk(K, -1).values
    assert torch.equal(vals.sort(-1, descending=True).values, want)  # the K largest, as a multiset
    ref = torch.logsumexp(x.double(), -1)
    finite = torch.isfinite(ref)
    torch.testing.assert_close(lse.double()[finite], ref[finite], atol=2e-6, rtol=1e-6)
    assert torch.equal(lse[~finite], ref[~finite].float())


def test_row_stats_declines_what_it_cannot_run():
    assert cpu_sampling.row_stats(torch.randn(4, 100, dtype=torch.float64), 10) is None
    assert cpu_sampling.row_stats(torch.randn(100, 4).t(), 2) is None  # not contiguous
    assert cpu_sampling.row_stats(torch.randn(4, 100), 101) is None
    assert (
        cpu_sampling.row_stats(torch.randn(2, 50000), cpu_sampling.MAX_K + 1) is None
    )  # torch's tier


@pytest.mark.parametrize("use_kernel", [True, False])
def test_all_rows_sampling_with_repetition_penalty_matches_reference(use_kernel, monkeypatch):
    if not use_kernel:
        monkeypatch.setattr(cpu_sampling, "row_stats", lambda l, k: None)
    calls = []
    real = cpu_sampling.row_stats
    monkeypatch.setattr(cpu_sampling, "row_stats", lambda l, k: (calls.append(k), real(l, k))[1])
    rng = torch.Generator().manual_seed(99)
    B, V, mismatches = 48, 4000, []
    for batch in range(12):
        logits = torch.randn(B, V, generator=rng) * (0.3 if batch % 4 == 0 else 3.5)
        logits[:, 7:11] = (
            logits[:, 7:11].max() if batch % 3 == 0 else logits[:, 7:11]
        )  # ties at the top
        params = [
            SamplingParams(
                temperature=[0.7, 1.0, 1.3][i % 3],
                top_p=[0.95, 0.8, 1.0][i % 3],
                top_k=[-1, -1, -1, 50][i % 4],
                min_p=[0.0, 0.05][i % 2],
                repetition_penalty=[1.1, 1.0, 1.5][(i // 2) % 3],
            )
            for i in range(B)
        ]
        hist = [
            torch.randint(
                0, V, (int(torch.randint(0, 300, (1,), generator=rng)),), generator=rng
            ).tolist()
            for _ in range(B)
        ]
        seeds = [batch * 100 + i for i in range(B)]
        before = logits.clone()
        got = sample(logits, params, [make_generator(s) for s in seeds], hist, [0] * B)
        assert torch.equal(logits, before)  # the caller's logits are left as they were
        want = reference_batch(logits, params, seeds, hist, [0] * B)
        mismatches += [(batch, i) for i in range(B) if got[i] != want[i]]
    assert not mismatches, mismatches[:5]
    assert calls  # the row-stats hook was reached
