"""KV-cache arithmetic: bytes per token, traditional vs paged memory, block-size what-if.

Plain functions of numbers (and of the engine's snapshot `sequences`), so they are unit-testable
and the dashboard never hard-codes a model's figures: the live row comes from the loaded config.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float16": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8": 1,
    "fp8": 1,
    "int8": 1,
}
BATCH_SIZES = (1, 8, 32, 64)
WHATIF_BLOCK_SIZES = (8, 16, 32, 64)
BLOCK_TABLE_ENTRY_BYTES = 4  # int32 physical block id per logical block
QUANT_SCALE_BYTES = 4  # kernels/kv_quant.SCALE_BYTES (not imported: ui stays off kernels)


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    heads: int  # attention (query) heads
    kv_heads: int  # key/value heads (== heads without grouped-query attention)
    head_dim: int
    dtype: str  # the KV cache's dtype
    max_len: int
    weights_dtype: str = ""  # set when the KV cache is stored in another dtype than the weights
    layer_windows: tuple = ()  # per layer: its sliding window (0: full attention); () unknown

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def scale_bytes(self) -> int:
        """Per (token, KV head) row: an int8 / fp8 cache stores its fp32 scale (kernels/kv_quant.py)."""
        return QUANT_SCALE_BYTES if self.dtype in ("int8", "fp8", "float8") else 0

    @property
    def bytes_per_token(self) -> int:
        """2 (K and V) x layers x KV heads x (head_dim x dtype bytes + scale bytes)."""
        return (
            2 * self.layers * self.kv_heads * (self.head_dim * self.dtype_bytes + self.scale_bytes)
        )

    @property
    def weights_bytes_per_token(self) -> int:
        """What the same tokens would cost in the weights' dtype (= bytes_per_token if unset)."""
        if not self.weights_dtype or self.weights_dtype == self.dtype:
            return self.bytes_per_token
        return kv_bytes_per_token(
            self.layers, self.kv_heads, self.head_dim, DTYPE_BYTES[self.weights_dtype]
        )

    @property
    def mha_bytes_per_token(self) -> int:
        """The same model if every attention head kept its own K/V (no GQA)."""
        return kv_bytes_per_token(self.layers, self.heads, self.head_dim, self.dtype_bytes)

    @property
    def gqa_factor(self) -> float:
        return self.heads / self.kv_heads


PRESETS = (
    ModelShape("Llama-2-7B", 32, 32, 32, 128, "float16", 4096),
    ModelShape("Mistral-7B", 32, 32, 8, 128, "bfloat16", 32768),
    ModelShape("Llama-3-8B", 32, 32, 8, 128, "bfloat16", 8192),
    ModelShape("Llama-3-70B", 80, 64, 8, 128, "bfloat16", 8192),
)


from engine.exec.model_info import kv_bytes_per_token  # noqa: E402,F401  (the one formula; re-exported)
from engine.observe.savings import blocks_for  # noqa: E402,F401  (the one ceiling division; re-exported)


def shape_from_config(hf_config, dtype: str, max_len: int, name: str = "live model") -> ModelShape:
    """The live model's shape from a transformers config (head_dim falls back to hidden/heads)."""
    heads = int(hf_config.num_attention_heads)
    kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return ModelShape(
        name,
        int(hf_config.num_hidden_layers),
        heads,
        kv_heads,
        int(head_dim),
        str(dtype).replace("torch.", ""),
        int(max_len),
    )


def shape_of(info) -> ModelShape:
    """The live model's shape from the engine's public ModelInfo (engine/exec/model_info.py)."""
    kv = getattr(info, "kv_cache_dtype", "") or info.dtype
    return ModelShape(
        info.name or "live model",
        info.num_layers,
        info.num_attention_heads,
        info.num_kv_heads,
        info.head_dim,
        kv,
        info.max_model_len,
        weights_dtype=info.dtype if kv != info.dtype else "",
        layer_windows=tuple(getattr(info, "layer_windows", ()) or ()),
    )


def batch_table(
    shape: ModelShape,
    avg_len: float,
    block_size: int,
    batches=BATCH_SIZES,
    pool_bytes: int | None = None,
) -> list[dict]:
    """Traditional (pre-allocate max_len per sequence) vs paged (ceil(len / block) blocks) memory."""
    per_tok = shape.bytes_per_token
    length = max(1, round(avg_len))
    paged_tokens = blocks_for(length, block_size) * block_size
    rows = []
    for b in batches:
        trad = b * shape.max_len * per_tok
        paged = b * paged_tokens * per_tok
        rows.append(
            {
                "batch": b,
                "seq_len": length,
                "traditional_bytes": trad,
                "paged_bytes": paged,
                "saved_frac": 1 - paged / trad if trad else 0.0,
                "waste_traditional_frac": 1 - length / shape.max_len,
                "waste_paged_frac": 1 - length / paged_tokens,
                "fits_traditional": None if pool_bytes is None else trad <= pool_bytes,
                "fits_paged": None if pool_bytes is None else paged <= pool_bytes,
            }
        )
    return rows


def block_size_whatif(
    sequences: list[dict], current_block_size: int, block_sizes=WHATIF_BLOCK_SIZES
) -> list[dict]:
    """For the live sequences: internal fragmentation and block-table size at other block sizes.

    Per sequence, without sharing: a sequence with n computed tokens needs ceil(n / b) blocks and
    wastes ceil(n / b) * b - n slots in its last block.
    """
    lens = [int(s["num_computed"]) for s in sequences]
    sizes = sorted(set(block_sizes) | {current_block_size})
    rows = []
    for b in sizes:
        nblocks = [blocks_for(n, b) for n in lens]
        slots = sum(nblocks) * b
        waste = slots - sum(lens)
        rows.append(
            {
                "block_size": b,
                "current": b == current_block_size,
                "sequences": len(lens),
                "table_entries": sum(nblocks),
                "max_table_len": max(nblocks, default=0),
                "table_bytes": sum(nblocks) * BLOCK_TABLE_ENTRY_BYTES,
                "frag_tokens": waste,
                "frag_frac": waste / slots if slots else 0.0,
                "avg_waste_per_seq": waste / len(lens) if lens else 0.0,
            }
        )
    return rows


def fmt_bytes(n: float) -> str:
    """Binary units, 3 significant-ish digits: 737,280 -> '720 KiB', 2**31 -> '2.00 GiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(n):,} B"
            return (
                f"{n:.2f} {unit}"
                if abs(n) < 10
                else f"{n:.1f} {unit}"
                if abs(n) < 100
                else f"{n:,.0f} {unit}"
            )
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover
