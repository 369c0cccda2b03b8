"""Decode CUDA-graph buckets, checked on CPU: the graph replay is emulated by running the same
padded forward over the same static buffers (engine/exec/cuda_graphs.py), so what a graph would compute
is checked here — padding to the bucket, fixed-width block tables with stale entries, pad rows that
must not store K/V — against HF generate on the same random weights. The real capture runs on
CUDA in scripts/gpu_check.sh."""

import torch

from engine import LLM, SamplingParams
from engine.exec import dummy_weights as dw
from engine.exec.cuda_graphs import DecodeGraphs, bucket_sizes

SMALL = {"num_hidden_layers": 2, "vocab_size": 4096}


def test_bucket_sizes():
    assert bucket_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert bucket_sizes(48) == [1, 2, 4, 8, 16, 32, 48]
    assert bucket_sizes(1) == [1]
    assert bucket_sizes(300) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]


def _capture_runners(monkeypatch) -> list:
    """The ModelRunner each LLM builds, caught on the class (no reach into the LLM's internals)."""
    from engine.exec.model_runner import ModelRunner

    runners, real_init = [], ModelRunner.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        runners.append(self)

    monkeypatch.setattr(ModelRunner, "__init__", init)
    return runners


def test_padded_bucket_decode_matches_hf_generate(monkeypatch):
    runners = _capture_runners(monkeypatch)
    llm = LLM(
        model="smollm2-135m",
        load_format="dummy",
        hf_overrides=SMALL,
        num_blocks=96,
        seed=3,
        device="cpu",
        max_num_seqs=6,
        max_model_len=200,
    )
    try:
        runner = runners[-1]
        graphs = DecodeGraphs(
            runner.model, runner.kv_pool, llm.config.block_size, 6, 200, runner.backend
        )
        calls = []
        real_run = graphs.run
        graphs.run = lambda plan: calls.append(len(plan)) or real_run(plan)
        # 5 sequences of different lengths decode together: bucket 8 > max 6 -> buckets 1,2,4,6;
        # 5 and 3 rows are padded, and tables are rewritten row by row as sequences finish
        graphs.capture()
        runner.graphs = graphs
        prompts = [
            [(13 * j + 7 * i + 1) % 4096 for i in range(n)]
            for j, n in enumerate((5, 17, 31, 16, 40))
        ]
        lens = [9, 12, 4, 14, 7]
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in lens],
        )
        assert calls and max(calls) == 5 and 3 in calls, (
            f"graph path not taken as expected: {calls}"
        )
        cfg = dw.load_config("smollm2-135m", SMALL)
        hf = dw.hf_model_with_weights(cfg, dw.random_weights(cfg, seed=3))
        for p, m, o in zip(prompts, lens, outs):
            x = torch.tensor([p])
            with torch.no_grad():
                ref = hf.generate(
                    x,
                    attention_mask=torch.ones_like(x),
                    max_new_tokens=m,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                )[0, len(p) :]
            assert o.outputs[0].token_ids == ref.tolist()
        assert llm.stats()["used_blocks"] == 0
    finally:
        llm.shutdown()


def test_enforce_eager_and_cpu_have_no_graphs(monkeypatch):
    """On CPU there is nothing to capture; enforce_eager reaches the runner's config."""
    runners = _capture_runners(monkeypatch)
    llm = LLM(
        model="smollm2-135m",
        load_format="dummy",
        hf_overrides=SMALL,
        num_blocks=8,
        device="cpu",
        enforce_eager=True,
    )
    try:
        runner = runners[-1]
        assert runner.cfg.enforce_eager is True
        assert runner.graphs is None and runner.warmup_stats == {}
    finally:
        llm.shutdown()
