"""--kv-cache-dtype through the engine (random Llama-shaped weights, 2 layers: fast): the pool's
format and size, the stats / metrics contract, refusal of fp8 without the hardware, and that
sharing, n > 1 (copy-on-write of a quantized partial block) and frees leave no block behind."""

import pytest
import torch

from engine import LLM, ServingLLM
from engine.config import EngineConfig
from engine.sampling.sampling_params import SamplingParams
from kernels import kv_quant
from routes.metrics import prometheus_text

SMALL = {"num_hidden_layers": 2, "vocab_size": 8192}


def dummy(kv: str, **kw) -> LLM:
    return ServingLLM(
        model="llama-3.2-1b",
        load_format="dummy",
        hf_overrides=SMALL,
        num_blocks=64,
        seed=5,
        device="cpu",
        dtype="float32",
        kv_cache_dtype=kv,
        **kw,
    )


def test_fp8_is_refused_off_cuda_and_unknown_dtypes_are_rejected():
    with pytest.raises(ValueError, match="fp8.*CUDA"):
        EngineConfig(device="cpu", kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        EngineConfig(device="cpu", kv_cache_dtype="int4")


def test_int8_pool_layout_stats_and_metrics():
    llm = dummy("int8")
    try:
        info = llm.model_info()
        pool = llm.engine.runner.kv_pool
        assert pool.dtype == torch.int8 and pool.shape[-1] == info.head_dim + kv_quant.SCALE_BYTES
        expect = 2 * info.num_layers * info.num_kv_heads * (info.head_dim + 4)
        assert info.kv_cache_dtype == "int8" and info.kv_bytes_per_token == expect
        st = llm.stats()
        assert st["kv_cache_dtype"] == "int8" and st["kv_bytes_per_token"] == expect
        assert (
            st["weights_kv_bytes_per_token"]
            == 2 * info.num_layers * info.num_kv_heads * info.head_dim * 4
        )
        text = prometheus_text(llm.snapshot())
        assert 'paged_chat_kv_cache_dtype_info{kv_cache_dtype="int8"} 1' in text
        assert f"paged_chat_kv_bytes_per_token {expect}" in text
    finally:
        llm.shutdown()


@pytest.mark.parametrize("kv", ["int8", "bfloat16"])
def test_quantized_pool_sharing_and_forks_leave_no_block_behind(kv):
    """Two prompts sharing 40 tokens (a prefix hit on full blocks), n=3 samples each forking a
    partial block (copy-on-write of codes + scales); every block is free again afterwards, and the
    outputs follow the prompt (the same request twice, greedy, gives the same tokens)."""
    llm = dummy(kv)
    try:
        total = llm.stats()["total_blocks"]
        base = list(range(100, 140))
        prompts = [{"prompt_token_ids": base + [7, 8, 9]}, {"prompt_token_ids": base + [11, 12]}]
        outs = llm.generate(
            prompts, SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=1, ignore_eos=True)
        )
        assert all(len(c.token_ids) == 12 for o in outs for c in o.outputs)
        g1 = llm.generate(
            prompts[0], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
        )
        g2 = llm.generate(
            prompts[0], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
        )
        assert g1[0].outputs[0].token_ids == g2[0].outputs[0].token_ids
        st = llm.stats()
        assert st["used_blocks"] == 0 and st["free_blocks"] == total and st["prefix_cache_hits"] > 0
    finally:
        llm.shutdown()
