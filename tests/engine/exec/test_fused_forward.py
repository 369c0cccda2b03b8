"""The CUDA forward loop (fused Triton layer ops, engine/exec/models/llama_fused.py) must agree with the
eager loop that matches transformers. On CPU the fused ops run in the Triton interpreter.
A prefill of 37 tokens (across block edges) then a decode step over the cached K/V, 2 layers of
each GQA shape; fp32 to float rounding, bf16 to a few bf16 ulps of the logits' scale."""

import pytest
import torch

from engine.exec import dummy_weights as dw
from engine.exec.models.llama import AttentionMetadata, LlamaModel

SMALL = {"num_hidden_layers": 2, "vocab_size": 4096}
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: interpreted Triton


def two_steps(model: LlamaModel, ids: list[int], backend: str, bs: int = 16) -> list[torch.Tensor]:
    nb = -(-(len(ids) + 1) // bs) + 1
    dev = model.device
    pool = torch.full(
        (2, model.num_layers, nb, bs, model.num_kv_heads, model.head_dim),
        float("nan"),
        dtype=model.dtype,
        device=dev,
    )
    table = torch.arange(1, nb, dtype=torch.int32).flip(0)[None]  # block 0 never used
    slots = lambda a, b: torch.tensor(
        [int(table[0, p // bs]) * bs + p % bs for p in range(a, b)], device=dev
    )
    T = len(ids)
    outs = []
    for start, toks in ((0, ids[:-1]), (T - 1, ids[-1:])):
        n, end = len(toks), start + len(toks)
        meta = AttentionMetadata(
            slot_mapping=slots(start, end),
            block_tables=table.to(dev),
            seq_lens=torch.tensor([end], dtype=torch.int32, device=dev),
            cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32, device=dev),
            max_seqlen_q=n,
            backend=backend,
        )
        outs.append(
            model.forward(
                torch.tensor(toks, device=dev),
                torch.arange(start, end, device=dev),
                pool,
                meta,
                torch.arange(n, device=dev),
            ).cpu()
        )
    return outs


@pytest.mark.parametrize(
    "name,dtype,backend",
    [
        ("smollm2-135m", torch.float32, "torch"),
        ("qwen2.5-0.5b", torch.float32, "triton"),
        ("smollm2-135m", torch.bfloat16, "torch"),
        pytest.param("llama-3.2-1b", torch.bfloat16, "torch", marks=pytest.mark.slow),
        pytest.param("qwen2.5-0.5b", torch.bfloat16, "triton", marks=pytest.mark.slow),
    ],
)
def test_fused_loop_matches_eager_loop(name, dtype, backend):
    cfg = dw.load_config(name, SMALL)
    w = dw.random_weights(cfg, seed=2)
    model = LlamaModel(cfg, w, dtype, DEVICE, max_positions=64)
    ids = [(11 * i + 5) % cfg.vocab_size for i in range(38)]
    model.use_fused = False
    eager = two_steps(model, ids, backend)
    model.use_fused = True
    fused = two_steps(model, ids, backend)
    for e, f in zip(eager, fused):
        assert not f.isnan().any()
        scale = e.abs().max().item()
        tol = 1e-5 * scale if dtype == torch.float32 else 4 * torch.finfo(dtype).eps * scale
        err = (e - f).abs().max().item()
        assert err <= tol, f"max logit difference {err:.3g} > {tol:.3g} (logit scale {scale:.3g})"
        if dtype == torch.float32:
            assert torch.equal(e.argmax(-1), f.argmax(-1))
