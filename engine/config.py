"""Engine configuration, validated once, with defaults that suit a 2-core CPU or one GPU."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# The one list of block sizes every part accepts (the KV manager checks against it too): powers of
# two the kernels' tiles divide, 8 (tests, tiny pools) to 128 (long contexts on a GPU).
BLOCK_SIZES = (8, 16, 32, 64, 128)
ALLOWED_BLOCK_SIZES = BLOCK_SIZES


def cache_root() -> Path:
    """Where the app keeps what it derives (dequantized weights, the KV tier's files):
    $PAGED_CHAT_CACHE, else $XDG_CACHE_HOME/paged-chat, else ~/.cache/paged-chat."""
    root = os.environ.get("PAGED_CHAT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "paged-chat")
    return Path(root)

ATTENTION_BACKENDS = ("auto", "torch", "triton")
KV_CACHE_ROTATIONS = ("auto", "hadamard", "none")   # kernels/kv_quant.py: rotation_for
DEFAULT_CPU_KV_CACHE_GIB = 2.0      # ~2,900 blocks of 16 tokens for SmolLM2-135M in fp32
DEFAULT_GPU_MEMORY_FRACTION = 0.85  # of free device memory after the weights are loaded


def cpu_has_fast_bf16() -> bool:
    """avx512_bf16 or AMX-bf16 in /proc/cpuinfo: oneDNN then runs bf16 GEMMs natively (measured
    2.2-2.4x fp32 at batch 32 on the project's box); without them bf16 is emulated and slower."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def resolve_dtype(dtype: str | None, device: str) -> str:
    """None: float32 on CPU (exact, token-identical to HF fp32), bfloat16 on CUDA.
    "auto": bfloat16 where the hardware is fast at it (CUDA, or a CPU with avx512_bf16/AMX),
    else float32. The KV pool always takes the weights' dtype."""
    if dtype == "auto":
        if device.startswith("cuda"):
            return "bfloat16"
        return "bfloat16" if cpu_has_fast_bf16() else "float32"
    if dtype is None:
        return "float32" if device == "cpu" else "bfloat16"
    return dtype


def check_kv_cache_dtype(kv_cache_dtype: str, device: str) -> None:
    """vLLM's --kv-cache-dtype values. fp8 (e4m3) needs a CUDA device of compute capability 8.9+
    (Ada / Hopper): elsewhere it is refused here, before any memory is allocated."""
    from kernels.kv_quant import KV_CACHE_DTYPES
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    if kv_cache_dtype == "fp8":
        if not device.startswith("cuda"):
            raise ValueError(f"kv_cache_dtype='fp8' needs a CUDA GPU with fp8 (compute capability 8.9+); "
                             f"device {device!r} has none: use kv_cache_dtype='int8' (every device)")
        import torch
        cap = torch.cuda.get_device_capability(torch.device(device))
        if cap < (8, 9):
            raise ValueError(f"kv_cache_dtype='fp8' needs compute capability 8.9+ (Ada/Hopper); {device} is "
                             f"sm_{cap[0]}{cap[1]}: use kv_cache_dtype='int8'")


@dataclass
class EngineConfig:
    model: str | None = None
    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_gib: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    device: str | None = None
    dtype: str | None = None
    seed: int = 0
    attention_backend: str = "auto"
    enable_prefix_caching: bool = True
    load_format: str = "auto"          # "dummy": config + seeded random weights (engine/exec/dummy_weights.py)
    enforce_eager: bool = False        # True: no CUDA graphs for decode (always eager on CPU)
    quantization: str | None = None    # "int8": weight-only int8, per-channel scales (CPU; engine/exec/cpu_linear.py)
    kv_cache_dtype: str = "auto"       # the pool's format (kernels/kv_quant.py); "auto" = the weights' dtype
    kv_cache_rotation: str = "auto"    # int8/fp8 pools: "auto"/"hadamard" rotate q, k, v per head (kv_quant.hadamard); "none"
    scheduling_policy: str = "fair"    # "fair": per-tenant VTC + priorities; "fcfs" (engine/core/fairness.py)
    kv_offload_gib: float | str | None = None   # second KV tier (engine/kv/kv_tier_setup.py): None/0 off, "auto"
    kv_offload_dir: str | None = None  # its folder on CPU (default <cache>/kv-tier)
    speculative: str | None = None     # "ngram" / "suffix": drafts from the conversation (engine/core/speculation.py)
    num_speculative_tokens: int = 5    # the longest draft; the adaptive rule picks 0..this per request and step
    speculative_adaptive: bool = True  # False: always draft the longest the proposer finds (tests, benches)
    lean_step: str = "auto"            # CPU, one chat or a few tokens: the whole step in one C++ call (kernels/cpu_lean_step.py)
    max_pin_fraction: float = 0.10     # pinned prefixes may hold at most this share of the pool (engine/kv/pinning.py)

    def __post_init__(self):
        import torch                   # here, not at module level: the KV manager imports this file
        if self.block_size not in ALLOWED_BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {ALLOWED_BLOCK_SIZES}, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be > 0, got {self.kv_cache_gib}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        if self.scheduling_policy not in ("fair", "fcfs"):
            raise ValueError(f"scheduling_policy must be 'fair' or 'fcfs', got {self.scheduling_policy!r}")
        if self.lean_step not in ("auto", "on", "off"):
            raise ValueError(f"lean_step must be 'auto', 'on' or 'off', got {self.lean_step!r}")
        if self.speculative not in (None, "ngram", "suffix"):
            raise ValueError(f"speculative must be 'ngram', 'suffix' or None, got {self.speculative!r}")
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError(f"num_speculative_tokens must be in 1..16, got {self.num_speculative_tokens}")
        if not 0.0 <= self.max_pin_fraction <= 1.0:
            raise ValueError(f"max_pin_fraction must be in 0..1, got {self.max_pin_fraction}")
        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.quantization not in (None, "int8"):
            raise ValueError(f"quantization must be 'int8' or None, got {self.quantization!r}")
        if self.quantization == "int8":
            if not self.device.startswith("cpu"):
                raise ValueError("quantization='int8' is a CPU option (torch's CPU int8 weight kernel)")
            if self.dtype in (None, "auto"):
                # torch's int8-weight kernel is fast with bf16 activations and ~20x slower with
                # fp32 ones (measured here); int8 already gives up fp32 exactness
                self.dtype = "bfloat16"
        self.dtype = resolve_dtype(self.dtype, self.device)
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be auto, float32, float16 or bfloat16, got {self.dtype!r}")
        check_kv_cache_dtype(self.kv_cache_dtype, self.device)
        if self.kv_cache_rotation not in KV_CACHE_ROTATIONS:
            raise ValueError(f"kv_cache_rotation must be one of {KV_CACHE_ROTATIONS}, got {self.kv_cache_rotation!r}")
        if self.max_num_batched_tokens is None:
            # CPU: 512, chosen by measurement (bench/serving.py --budgets 512,2048, chat burst of 16):
            # 2,048 never improved TTFT p50 (1.75 vs 2.29 s fp32; 2.22 vs 3.8 s bf16) and its
            # throughput gain was inside noise (+10% fp32 in one run, -28% and -11% in two others);
            # a 512-token chunk also keeps streams live while a long prompt prefills.
            # GPU: bigger chunks are nearly free.
            self.max_num_batched_tokens = 512 if self.device == "cpu" else 8192

    @property
    def torch_dtype(self) -> "torch.dtype":
        import torch
        return getattr(torch, self.dtype)
