"""What transformers' GGUF reader leaves out for the families we run, read from the file ourselves.

transformers dequantizes a GGUF into an HF model (engine/exec/loader.py caches it as a folder). For
three things it does not know, the file says what the model is and we complete the config:
- `smollm3`: no mapping at all ("architecture smollm3 is not supported"). llama.cpp writes SmolLM3
  exactly as a Llama (same tensor names, q/k rows permuted for its rotate-pairs RoPE) and knows its
  no-RoPE layers by the architecture alone (every fourth, `n_no_rope_layer_step = 4`); so while
  transformers reads such a file, `smollm3` is registered in its GGUF tables with Llama's keys and
  tensor processor, and the config it builds is a SmolLM3Config (no_rope_layer_interval 4).
- `phi3` (Phi-3.5 / Phi-4-mini): the GGUF names the rotated dims (`phi3.rope.dimension_count`, 96
  of 128 for Phi-4-mini) and carries LongRoPE's factors as tensors (`rope_factors_long/short`)
  with the original context length; transformers drops all three, and the model then rotates every
  dim with plain RoPE (a known cause of garbage from Phi-4-mini GGUFs). We put them back.
- `gemma3`: the global layers' linear RoPE scaling (`gemma3.rope.scaling.factor`, 8 for 4B+).
- `llama` (3.1, 3.2): the "llama3" RoPE scaling, which llama.cpp stores as one divisor per frequency
  (`rope_freqs.weight`); transformers ignores the tensor and the model would run with plain RoPE.
  The divisors go into the config as `rope_freq_factors` (an extra key transformers keeps) and the
  engine's RoPE tables divide by them (engine/exec/models/rope.py).
- any: the head size (`<arch>.attention.key_length`) where transformers' mapping has no key for it
  (Qwen3's: it falls back to Qwen3Config's 128, right for the released models only).
The completed config is handed to transformers before it builds the model.
Everything else (tensors, dequantization, tokenizer, chat template) is transformers' reading.
"""

from __future__ import annotations

import contextlib


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.parts[f.data[0]] if len(f.data) == 1 else [f.parts[i] for i in f.data]
    if isinstance(v, list):
        return [x.tolist()[0] if hasattr(x, "tolist") else x for x in v]
    if v.dtype.kind in "iuf" and v.size == 1:
        return v.tolist()[0]
    return bytes(v).decode("utf-8")


def architecture(path: str) -> str:
    import gguf

    return str(_field(gguf.GGUFReader(path), "general.architecture", ""))


@contextlib.contextmanager
def reader_knows(arch: str):
    """While transformers reads a file of `arch`, its GGUF tables know our mappings (smollm3)."""
    if arch != "smollm3":
        yield
        return
    from transformers import modeling_gguf_pytorch_utils as G
    from transformers.integrations import ggml

    added = arch not in ggml.GGUF_CONFIG_MAPPING
    if added:
        ggml.GGUF_CONFIG_MAPPING[arch] = dict(ggml.GGUF_CONFIG_MAPPING["llama"])
        G.GGUF_SUPPORTED_ARCHITECTURES.append(arch)
        G.TENSOR_PROCESSORS[arch] = G.TENSOR_PROCESSORS["llama"]
    try:
        yield
    finally:
        if added:
            ggml.GGUF_CONFIG_MAPPING.pop(arch, None)
            G.GGUF_SUPPORTED_ARCHITECTURES.remove(arch)
            G.TENSOR_PROCESSORS.pop(arch, None)


def complete_config(path: str, cfg: dict) -> dict:
    """The HF config dict transformers built from GGUF `path`, completed from the file (module doc)."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = str(_field(reader, "general.architecture", ""))
    cfg = dict(cfg)
    key_length = _field(reader, f"{arch}.attention.key_length")  # Qwen3's mapping drops it
    if key_length and int(key_length) != int(cfg.get("head_dim") or 0):
        cfg["head_dim"] = int(key_length)
    pad = cfg.get("pad_token_id")
    if isinstance(pad, int) and not 0 <= pad < int(cfg.get("vocab_size") or 0):
        cfg["pad_token_id"] = None  # a config class's default that this vocabulary lacks
    if arch == "qwen3moe":  # transformers' table has no key for the experts' width; llama.cpp's
        ff = _field(reader, "qwen3moe.expert_feed_forward_length")  # qwen3moe graph always
        if ff:  # renormalises the top-k weights
            cfg["moe_intermediate_size"] = int(ff)
        cfg["norm_topk_prob"] = True
    if arch == "smollm3":
        cfg["no_rope_layer_interval"] = 4
        cfg["no_rope_layers"] = [
            int((i + 1) % 4 != 0) for i in range(int(cfg["num_hidden_layers"]))
        ]
        cfg.setdefault("use_sliding_window", False)
    elif arch == "phi3":
        _phi3(reader, cfg)
    elif arch == "llama":
        t = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
        if t is not None:  # Llama 3.1+ scaling, stored as a divisor per frequency (rope.py)
            cfg["rope_freq_factors"] = [float(x) for x in t.data.reshape(-1)]
    elif arch == "gemma3":
        kind = _field(reader, "gemma3.rope.scaling.type")
        factor = _field(reader, "gemma3.rope.scaling.factor")
        if kind == "linear" and factor and float(factor) != 1.0:
            params = dict(cfg.get("rope_parameters") or {})
            full = dict(params.get("full_attention") or {"rope_theta": cfg.get("rope_theta", 1e6)})
            full.update(rope_type="linear", factor=float(factor))
            params["full_attention"] = full
            cfg["rope_parameters"] = params
    return cfg


def _phi3(reader, cfg: dict) -> None:
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    params = dict(cfg.get("rope_parameters") or {})
    rot = _field(reader, "phi3.rope.dimension_count")
    if rot and int(rot) < head_dim:
        cfg["partial_rotary_factor"] = params["partial_rotary_factor"] = int(rot) / head_dim
    tensors = {t.name: t for t in reader.tensors}
    long_t, short_t = (
        tensors.get("rope_factors_long.weight"),
        tensors.get("rope_factors_short.weight"),
    )
    if long_t is not None and short_t is not None:
        orig = _field(reader, "phi3.rope.scaling.original_context_length") or cfg.get(
            "max_position_embeddings"
        )
        params.update(
            rope_type="longrope",
            long_factor=[float(x) for x in long_t.data.reshape(-1)],
            short_factor=[float(x) for x in short_t.data.reshape(-1)],
            original_max_position_embeddings=int(orig),
        )
        params.pop("type", None)
        cfg["original_max_position_embeddings"] = int(orig)
    window = _field(reader, "phi3.attention.sliding_window")
    if window:
        cfg["sliding_window"] = int(window)
    cfg["rope_parameters"] = params
