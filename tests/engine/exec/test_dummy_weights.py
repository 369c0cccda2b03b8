"""load_format="dummy": each shipped config (2 layers) with seeded random weights must give the same
logits as HF transformers' forward holding the very same tensors, and greedy generation through
`LLM` must equal HF `generate`. Vocabularies are cut to 8,192 on CPU (the lm_head GEMM is not what
is under test and a 128k x 4k fp32 table costs GBs); every other dimension is the real one.
"""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.exec import dummy_weights as dw
from engine.exec.loader import ModelLoadError, load_model
from engine.exec.models.llama import AttentionMetadata, LlamaModel

SMALL = {"num_hidden_layers": 2, "vocab_size": 8192}


def engine_logits(config, weights, ids: list[int], block_size: int = 16) -> torch.Tensor:
    """Prefill `ids` as one sequence through the engine's model (torch kernels); logits of every token."""
    model = LlamaModel(
        config, weights, torch.float32, torch.device("cpu"), max_positions=len(ids) + 1
    )
    nb = -(-len(ids) // block_size)
    pool = torch.full(
        (2, model.num_layers, nb, block_size, model.num_kv_heads, model.head_dim), float("nan")
    )
    T = len(ids)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(T),
        block_tables=torch.arange(nb, dtype=torch.int32)[None],
        seq_lens=torch.tensor([T], dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, T], dtype=torch.int32),
        max_seqlen_q=T,
        backend="torch",
    )
    return model.forward(torch.tensor(ids), torch.arange(T), pool, meta, torch.arange(T))


@pytest.mark.parametrize(
    "name",
    [
        "llama-3.2-1b",
        "qwen2.5-0.5b",
        "smollm2-135m",
        pytest.param("llama-3-8b", marks=pytest.mark.slow),
    ],
)
def test_dummy_engine_logits_match_hf_forward(name):
    cfg = dw.load_config(name, SMALL)
    weights = dw.random_weights(cfg, seed=1)
    ids = [(7 * i + 3) % cfg.vocab_size for i in range(37)]  # crosses two block edges
    ours = engine_logits(cfg, weights, ids)
    hf = dw.hf_model_with_weights(cfg, weights)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    err = (ours - ref).abs().max().item()
    assert err < 2e-4, f"{name}: max logit difference {err}"
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    assert ref.std() > 0.05, "random weights too small to tell a wrong kernel from a right one"


def test_random_weights_are_seeded_and_cover_every_parameter():
    cfg = dw.load_config("qwen2.5-0.5b", SMALL)
    a, b, c = (dw.random_weights(cfg, seed=s) for s in (3, 3, 4))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    assert (
        "model.layers.1.self_attn.k_proj.bias" in a and "lm_head.weight" not in a
    )  # qwen2: bias, tied
    assert "lm_head.weight" in dw.random_weights(
        dw.load_config(
            "llama-3-8b",
            {
                "num_hidden_layers": 1,
                "vocab_size": 64,
                "hidden_size": 64,
                "intermediate_size": 64,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
            },
        )
    )


def test_llm_dummy_generates_like_hf_with_token_id_prompts():
    """The whole engine (scheduler, pool, prefix cache) on a dummy model with no tokenizer."""
    llm = LLM(
        model="llama-3.2-1b",
        load_format="dummy",
        hf_overrides=SMALL,
        num_blocks=64,
        seed=5,
        device="cpu",
    )
    try:
        assert llm.model_source == "dummy:llama-3.2-1b"
        prompt = list(range(100, 121))
        out = llm.generate(
            {"prompt_token_ids": prompt},
            SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
        )[0]
        with pytest.raises(ValueError, match="without a tokenizer"):
            llm.generate("hello")
        weights = dw.random_weights(dw.load_config("llama-3.2-1b", SMALL), seed=5)
        hf = dw.hf_model_with_weights(dw.load_config("llama-3.2-1b", SMALL), weights)
        x = torch.tensor([prompt])
        with torch.no_grad():
            ref = hf.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=10,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0, len(prompt) :]
        assert out.outputs[0].token_ids == ref.tolist()
        assert llm.stats()["used_blocks"] == 0
    finally:
        llm.shutdown()


def test_dummy_config_paths_and_errors(tmp_path):
    import json

    src = dw.config_path("smollm2-135m")
    folder = tmp_path / "m"
    folder.mkdir()
    d = json.loads(src.read_text())
    d.update(num_hidden_layers=1, vocab_size=512)
    (folder / "config.json").write_text(json.dumps(d))
    for model in (str(folder), str(folder / "config.json")):
        lm = load_model(model, load_format="dummy")
        assert (
            lm.config.num_hidden_layers == 1
            and lm.weights["model.embed_tokens.weight"].shape[0] == 512
        )
        assert isinstance(lm.tokenizer, dw.TokenIdTokenizer)
    with pytest.raises(ModelLoadError, match="shipped configs"):
        load_model(str(tmp_path / "nope"), load_format="dummy")
    with pytest.raises(ModelLoadError, match="load_format"):
        load_model(str(folder), load_format="pt")
    with pytest.raises(ValueError, match="hf_overrides"):
        LLM(model=str(folder), hf_overrides={"num_hidden_layers": 1})
    d["model_type"] = "gpt2"
    (folder / "config.json").write_text(json.dumps(d))
    with pytest.raises(ModelLoadError, match="unsupported architecture"):
        load_model(str(folder), load_format="dummy")
