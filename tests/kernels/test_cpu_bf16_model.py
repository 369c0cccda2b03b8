"""bf16 on CPU (what --dtype auto picks on an avx512_bf16/AMX machine) checked against HF.

Tolerance rule: bf16 keeps 8 significant bits, so no bf16 implementation matches fp32; HF's own
bf16 forward is the yardstick. On the same token ids, the engine's bf16 error against HF fp32
must be no larger than twice HF-bf16's error against HF fp32 (max and mean, logits of a prefill
and the logprobs of 16 decode steps that go through the paged decode kernel). A kernel bug (wrong
block, wrong scale, lost precision in accumulation) gives errors far beyond 2x; a different but
valid op order or fusion stays within it.
"""

import copy

import torch

from engine import LLM, SamplingParams
from engine.config import EngineConfig, cpu_has_fast_bf16, resolve_dtype

CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Explain in two sentences why the sky is blue."},
]


def test_dtype_auto_follows_cpu_flags():
    assert EngineConfig(device="cpu", dtype="auto").dtype == (
        "bfloat16" if cpu_has_fast_bf16() else "float32"
    )
    assert resolve_dtype(None, "cpu") == "float32"  # the library default stays exact
    assert resolve_dtype("auto", "cuda:0") == "bfloat16"


def test_engine_bf16_error_within_twice_hf_bf16(model_folder, hf_model, monkeypatch):
    from engine.exec.model_runner import ModelRunner

    runners, real_init = [], ModelRunner.__init__

    def init(self, *a, **kw):  # the runner, caught on the class (no reach into the LLM)
        real_init(self, *a, **kw)
        runners.append(self)

    monkeypatch.setattr(ModelRunner, "__init__", init)
    llm = LLM(model=model_folder, dtype="bfloat16", num_blocks=64)
    try:
        assert llm.model_info().dtype == "bfloat16"
        assert runners[-1].kv_pool.dtype == torch.bfloat16  # KV follows the weights
        out = llm.chat(
            CHAT, SamplingParams(temperature=0, max_tokens=16, logprobs=0, ignore_eos=True)
        )[0]
        model = runners[-1].model
        P = len(out.prompt_token_ids)
        ids = out.prompt_token_ids + out.outputs[0].token_ids
        from engine.exec.models.llama import AttentionMetadata

        T, bs = P, 16
        pool = torch.zeros(
            2, model.num_layers, 64, bs, model.num_kv_heads, model.head_dim, dtype=torch.bfloat16
        )
        table = torch.randperm(64)[: (T + bs - 1) // bs]
        slots = torch.tensor([int(table[p // bs]) * bs + p % bs for p in range(T)])
        meta = AttentionMetadata(
            slots,
            table.to(torch.int32)[None],
            torch.tensor([T], dtype=torch.int32),
            torch.tensor([0, T], dtype=torch.int32),
            T,
            "torch",
        )
        ours = model.forward(
            torch.tensor(ids[:P]), torch.arange(T), pool, meta, torch.arange(T)
        ).double()
        ours_lp = torch.tensor([t.logprob for t in out.outputs[0].logprobs], dtype=torch.float64)
    finally:
        llm.shutdown()
    hf16 = copy.deepcopy(hf_model).to(torch.bfloat16)
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].double()
        r16 = hf16(torch.tensor([ids])).logits[0].double()
    gen = out.outputs[0].token_ids
    pick = lambda logits: (
        logits[P - 1 : -1].log_softmax(-1).gather(-1, torch.tensor(gen)[:, None]).squeeze(-1)
    )
    e_prefill, h_prefill = (ours - ref[:P]).abs(), (r16[:P] - ref[:P]).abs()
    e_decode, h_decode = (ours_lp - pick(ref)).abs(), (pick(r16) - pick(ref)).abs()
    assert h_prefill.max() > 0  # the yardstick is not degenerate
    assert e_prefill.max() <= 2 * h_prefill.max() and e_prefill.mean() <= 2 * h_prefill.mean()
    assert e_decode.max() <= 2 * max(h_decode.max(), 1e-3) and e_decode.mean() <= 2 * max(
        h_decode.mean(), 1e-3
    )
