"""Other Llama-family checkpoints from local HF folders: tiny random llama/mistral/qwen2 configs
(untied embeddings, qkv bias, scaled RoPE) must match transformers' own forward and generate."""

import pytest
import torch

from engine import LLM, SamplingParams


def _tiny(kind, tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

    common = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    if kind == "llama3-rope":
        cfg = LlamaConfig(
            **common,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
    elif kind == "mistral":
        cfg = MistralConfig(**common, tie_word_embeddings=False)
    else:
        cfg = Qwen2Config(**common, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    model.save_pretrained(tmp_path / kind)
    tokenizer.save_pretrained(tmp_path / kind)  # SmolLM2's tokenizer decodes the tiny vocab's ids
    return model, str(tmp_path / kind)


# mistral and qwen2 (with and without windows), qwen3, gemma3, smollm3, phi3 and YaRN run through
# the whole engine in tests/engine/exec/test_families_vs_hf.py; this one keeps the HF-folder path
@pytest.mark.parametrize("kind", ["llama3-rope"])
def test_tiny_checkpoint_matches_transformers(kind, tmp_path, tokenizer):
    model, folder = _tiny(kind, tmp_path, tokenizer)
    llm = LLM(model=folder, num_blocks=64)
    try:
        prompt = list(range(3, 40))
        out = llm.generate(
            {"prompt_token_ids": prompt},
            SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
        )[0]
        x = torch.tensor([prompt])
        with torch.no_grad():
            ref = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=12,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0, len(prompt) :]
        assert out.outputs[0].token_ids == ref.tolist()
    finally:
        llm.shutdown()


def test_gguf_path_is_dequantized_once_and_cached(model_folder):
    """--model pointing at a .gguf file (here the bundled one) resolves to the shared cached folder."""
    import os

    from engine.exec.loader import default_model_path, resolve_hf_folder

    gguf = default_model_path()
    source, folder = resolve_hf_folder(gguf)
    assert source == gguf and folder == model_folder
    assert os.path.exists(os.path.join(folder, "done")) and os.path.exists(
        os.path.join(folder, "config.json")
    )
    with pytest.raises(Exception, match="not a .gguf"):
        resolve_hf_folder(os.path.join(folder, "config.json"))
