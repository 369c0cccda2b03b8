"""bench/host_overhead.py runs and reports every part; the cut it measures holds: a step with no
n > 1 fork hands the runner's logits to the sampler as they are (no gather, which on CUDA is an
index upload + a launch per step). No timing is asserted."""

import torch

from bench import host_overhead


def test_breakdown_has_every_part():
    r = host_overhead.measure(30)
    us = r["us_per_step"]
    for part in host_overhead.PARTS + (
        "step total",
        "other",
        "thread hand-off",
        "streamed per token",
    ):
        assert part in us
    assert us["step total"] > 0 and all(us[p] >= 0 for p in host_overhead.PARTS)
    assert r["vocab"] == 49152


def test_no_fork_means_no_logits_copy():
    """(n > 1 forks still gather: tests/engine/core/test_engine_features.py n-children tests.)"""
    from engine import SamplingParams
    from engine.config import EngineConfig
    from engine.core.llm_engine import LLMEngine
    from engine.exec.loader import load_model
    from engine.core.sequence import Request

    cfg = EngineConfig(
        model="smollm2-135m",
        load_format="dummy",
        num_blocks=64,
        max_model_len=256,
        device="cpu",
        dtype="float32",
    )
    eng = LLMEngine(
        cfg,
        load_model(
            "smollm2-135m",
            load_format="dummy",
            device="cpu",
            dtype=cfg.torch_dtype,
            hf_overrides={"num_hidden_layers": 1},
        ),
    )  # no front thread
    a = Request("a", list(range(3, 12)), SamplingParams(temperature=0, max_tokens=4))
    eng.add_request(a)
    logits = torch.randn(1, 49152)
    out_seqs, out = eng._fork_after_prefill([a.seqs[0]], logits)
    assert out_seqs == [a.seqs[0]] and out is logits
