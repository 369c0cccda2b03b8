"""bench/host_overhead.py runs and reports every part; the cut it measures holds: a step with no
n > 1 fork hands the runner's logits to the sampler as they are (no gather, which on CUDA is an
index upload + a launch per step). No timing is asserted."""
import torch

from bench import host_overhead


def test_breakdown_has_every_part():
    r = host_overhead.measure(30)
    us = r["us_per_step"]
    for part in host_overhead.PARTS + ("step total", "other", "thread hand-off", "streamed per token"):
        assert part in us
    assert us["step total"] > 0 and all(us[p] >= 0 for p in host_overhead.PARTS)
    assert r["vocab"] == 49152


def test_no_fork_no_logits_copy_and_fork_still_gathers():
    from engine import LLM, SamplingParams
    from engine.sequence import Request
    llm = LLM(model="smollm2-135m", load_format="dummy", hf_overrides={"num_hidden_layers": 1}, device="cpu",
              dtype="float32", num_blocks=64, max_model_len=256)
    try:
        eng = llm.engine
        a = Request("a", list(range(3, 12)), SamplingParams(temperature=0, max_tokens=4))
        b = Request("b", list(range(3, 12)), SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=4))
        eng.add_request(a)
        eng.add_request(b)
        seqs = [a.seqs[0], b.seqs[0]]
        logits = torch.randn(2, 49152)
        out_seqs, out = eng._fork_after_prefill(seqs[:1], logits[:1])
        assert out_seqs == seqs[:1] and out.data_ptr() == logits.data_ptr()      # the same storage
        out_seqs, out = eng._fork_after_prefill(seqs, logits)                      # b forks: 3 rows
        assert len(out_seqs) == 3 and torch.equal(out, logits[[0, 1, 1]])
    finally:
        llm.shutdown()
