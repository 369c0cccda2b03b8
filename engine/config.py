"""Engine configuration, validated once, with defaults that suit a 2-core CPU or one GPU."""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, dataclass, field, fields
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
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "paged-chat"
    )
    return Path(root)


ATTENTION_BACKENDS = ("auto", "torch", "triton")
KV_CACHE_ROTATIONS = ("auto", "hadamard", "none")  # kernels/kv_quant.py: rotation_for
DEFAULT_CPU_KV_CACHE_GIB = 2.0  # ~2,900 blocks of 16 tokens for SmolLM2-135M in fp32
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
        raise ValueError(
            f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}"
        )
    if kv_cache_dtype == "fp8":
        if not device.startswith("cuda"):
            raise ValueError(
                f"kv_cache_dtype='fp8' needs a CUDA GPU with fp8 (compute capability 8.9+); "
                f"device {device!r} has none: use kv_cache_dtype='int8' (every device)"
            )
        import torch

        cap = torch.cuda.get_device_capability(torch.device(device))
        if cap < (8, 9):
            raise ValueError(
                f"kv_cache_dtype='fp8' needs compute capability 8.9+ (Ada/Hopper); {device} is "
                f"sm_{cap[0]}{cap[1]}: use kv_cache_dtype='int8'"
            )


def parse_offload_gib(v):
    """--kv-offload-gib: 'auto' or a number of GiB >= 0."""
    if v is None or v == "auto":
        return v
    x = float(v)
    if x < 0:
        raise ValueError(f"kv_offload_gib must be >= 0 or 'auto', got {v!r}")
    return x


def parse_tenant_weights(values: list[str] | None) -> dict[str, float]:
    """--tenant-weight name=2 (repeatable) -> {"name": 2.0}."""
    out: dict[str, float] = {}
    for v in values or []:
        name, sep, w = v.rpartition("=")
        try:
            weight = float(w)
        except ValueError:
            weight = -1.0
        if not sep or not name or not weight > 0:
            raise ValueError(f"--tenant-weight expects NAME=WEIGHT with WEIGHT > 0, got {v!r}")
        out[name] = weight
    return out


def opt(
    default,
    help: str,
    *,
    flag: bool = True,
    cli_default=MISSING,
    group: str | None = None,
    parse=None,
    **argparse_kw,
):
    """A config field that is also a command-line flag (`--field-name`, app.py): its help text,
    argparse options, the flag's default where it differs from the library's (`cli_default`; e.g.
    the app turns the KV tier on, `LLM()` leaves it off), and `parse`, a converter from the flag's
    value to the field's. flag=False: a library-only field. One place per engine option."""
    return field(
        default=default,
        metadata=dict(
            help=help,
            flag=flag,
            cli_default=cli_default,
            group=group,
            parse=parse,
            argparse=argparse_kw,
        ),
    )


@dataclass
class EngineConfig:
    """Every engine option, validated once. Adding one is one field here: `LLM(field=...)` takes it
    and app.py's flags are made from these fields (`add_arguments` / `from_args`)."""

    model: str | None = opt(
        None,
        "HF folder or .gguf file (default: SmolLM2-135M-Instruct). The app takes several, or a folder "
        "of .gguf files: the first is served, the chat page's model picker switches to the others",
        nargs="+",
        metavar="PATH",
        parse=lambda v: v[0] if isinstance(v, list) else v,
    )
    block_size: int = opt(16, "tokens per KV block", type=int)
    num_blocks: int | None = opt(None, "KV pool size in blocks", type=int, group="pool")
    kv_cache_gib: float | None = opt(None, "KV pool size in GiB", type=float, group="pool")
    max_model_len: int | None = opt(None, "context length (prompt + reply)", type=int)
    max_num_seqs: int = opt(64, "sequences decoded together; more wait", type=int)
    max_num_batched_tokens: int | None = opt(
        None,
        "tokens one engine step may compute (prefill chunks + decodes); default 512 on CPU, "
        "8192 on CUDA",
        type=int,
        metavar="N",
    )
    device: str | None = opt(None, "cpu or cuda[:N] (default: cuda when available)")
    dtype: str | None = opt(
        None,
        "weights and KV dtype. auto (default): bfloat16 on CUDA or on a CPU with AVX512-BF16/AMX "
        "(~2.4x faster decode, no longer bit-matches HF fp32), else float32",
        cli_default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
    )
    seed: int = opt(0, "seed of requests that send none", type=int)
    attention_backend: str = opt(
        "auto",
        "attention kernels: auto (Triton on CUDA, else torch), torch, triton",
        choices=list(("auto", "torch", "triton")),
    )
    enable_prefix_caching: bool = opt(
        True,
        "reuse the KV of shared prefixes (--no-enable-prefix-caching: off)",
        action=argparse.BooleanOptionalAction,
    )
    load_format: str = opt(
        "auto",
        "auto, or dummy: the model's config with seeded random weights "
        "(engine/exec/dummy_weights.py)",
        choices=["auto", "dummy"],
    )
    enforce_eager: bool = opt(False, "CUDA: no decode CUDA graphs", action="store_true")
    quantization: str | None = opt(
        None,
        "int8: weight-only int8 weights with per-channel scales (CPU, bf16 activations); fastest "
        "at batch 1, slightly less accurate",
        choices=["int8"],
    )
    kv_cache_dtype: str = opt(
        "auto",
        "KV pool format (vLLM's flag). auto (default): the weights' dtype; int8: ~1.9x the bf16 "
        "tokens in the same memory, any device (accuracy: docs/BENCHMARKS.md); fp8: e4m3, CUDA sm_89+ only",
        choices=["auto", "float32", "bfloat16", "float16", "int8", "fp8"],
    )
    kv_cache_rotation: str = opt(
        "auto",
        "int8/fp8 KV: rotate K, V (and q, and the attention output back) per head by a fixed "
        "Hadamard matrix before quantizing; auto (default): on for int8/fp8 with a power-of-two head_dim; "
        "none: off",
        choices=list(("auto", "hadamard", "none")),
    )
    scheduling_policy: str = opt(
        "fair",
        "fair (default): per-user virtual token counters + priorities; fcfs: arrival order",
        choices=["fair", "fcfs"],
        group="fair scheduling",
    )
    tenant_weights: dict | None = opt(
        None,
        "a tenant's share weight (default 1); tenants: user:NAME under --auth, the --api-key name, "
        "api (keyless /v1), local, demo-user-K. Repeatable",
        group="fair scheduling",
        parse=parse_tenant_weights,
        action="append",
        metavar="NAME=W",
        dest_flag="--tenant-weight",
    )
    max_queued_requests: int | None = opt(
        None,
        "requests that may wait, over all tenants; more get 429 / a busy sentence",
        type=int,
        group="fair scheduling",
    )
    max_queued_tokens: int | None = opt(
        None, "prompt tokens that may wait, overall", type=int, group="fair scheduling"
    )
    tenant_max_queued_requests: int | None = opt(
        None, "requests one tenant may have waiting", type=int, group="fair scheduling"
    )
    tenant_max_queued_tokens: int | None = opt(
        None, "prompt tokens one tenant may have waiting", type=int, group="fair scheduling"
    )
    starvation_wait_s: float = opt(
        5.0,
        "fair: the longest a lower-priority request that could run waits while higher ones are "
        "served; then one of theirs is paused for it (issue 48.1)",
        type=float,
        metavar="SECONDS",
        group="fair scheduling",
        dest_flag="--starvation-wait",
    )
    kv_offload_gib: float | str | None = opt(
        None,
        "second KV tier behind the pool (CPU: files under --kv-offload-dir, survive a restart; CUDA: "
        "host memory): evicted, parked and preempted blocks are kept there instead of recomputed. 'auto' "
        "(the app's default): min(8 GiB, 10%% of free disk) on CPU, a quarter of free RAM on CUDA; 0 turns "
        "it off",
        cli_default="auto",
        parse=parse_offload_gib,
        metavar="GIB",
    )
    kv_offload_dir: str | None = opt(
        None,
        "folder of the disk KV tier (default: <cache>/kv-tier; 0700, files 0600)",
        metavar="DIR",
    )
    speculative: str | None = opt(
        None,
        "speculative decoding: draft the next tokens from the conversation itself and verify them in "
        "one step (exact for greedy, same distribution when sampling). ngram: prompt lookup over this chat; "
        "suffix: also the user's recent replies. It backs off by itself where it would not pay. Default off",
        cli_default="off",
        choices=["ngram", "suffix", "off"],
    )
    num_speculative_tokens: int = opt(
        5,
        "the longest draft (1..16, default 5); the adaptive rule picks 0..K per request and step",
        type=int,
        metavar="K",
    )
    speculative_adaptive: bool = opt(
        True, "False: always draft the longest the proposer finds (tests, benches)", flag=False
    )
    lean_step: str = opt(
        "auto",
        "CPU, one conversation decoding: run the whole step in one C++ call (1.5-2.3x tokens/s at "
        "fp32 here). It reads plain weights, so fp32/bf16 keep a second copy of the layer weights (+405 MiB "
        "fp32 for the default model; int8: none). auto (default): on when that copy is under 1.5 GiB; off: "
        "the per-layer loop only",
        choices=["auto", "on", "off"],
    )
    max_pin_fraction: float = opt(
        0.10, "pinned shared prompts may hold at most this share of the pool", type=float
    )
    kv_cache_groups: bool = opt(
        True,
        "layers of one attention kind share a KV cache group, and a sliding-window group gives back "
        "the blocks its window has passed (--no-kv-cache-groups: one block table for every layer, the "
        "layout before groups; for comparisons: python -m bench --kv-groups)",
        action=argparse.BooleanOptionalAction,
    )
    state_slots: int | None = opt(
        None,
        "models with linear-attention layers (Qwen3.5): fixed-size state slots beside the KV "
        "pool, held by running sequences, parked chats and prefix checkpoints; default "
        "1.5 x max-num-seqs + 16, at most half the KV budget",
        type=int,
        metavar="N",
    )

    def __post_init__(self):
        import torch  # here, not at module level: the KV manager imports this file

        if self.block_size not in ALLOWED_BLOCK_SIZES:
            raise ValueError(
                f"block_size must be one of {ALLOWED_BLOCK_SIZES}, got {self.block_size}"
            )
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.state_slots is not None and self.state_slots < 1:
            raise ValueError(f"state_slots must be >= 1, got {self.state_slots}")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be > 0, got {self.kv_cache_gib}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}"
            )
        if self.scheduling_policy not in ("fair", "fcfs"):
            raise ValueError(
                f"scheduling_policy must be 'fair' or 'fcfs', got {self.scheduling_policy!r}"
            )
        if not 0 < self.starvation_wait_s <= 3600:
            raise ValueError(
                f"starvation_wait_s must be in (0, 3600] seconds, got {self.starvation_wait_s}"
            )
        if self.lean_step not in ("auto", "on", "off"):
            raise ValueError(f"lean_step must be 'auto', 'on' or 'off', got {self.lean_step!r}")
        if self.speculative == "off":
            self.speculative = None
        self.kv_offload_gib = parse_offload_gib(self.kv_offload_gib)
        if self.speculative not in (None, "ngram", "suffix"):
            raise ValueError(
                f"speculative must be 'ngram', 'suffix' or None, got {self.speculative!r}"
            )
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError(
                f"num_speculative_tokens must be in 1..16, got {self.num_speculative_tokens}"
            )
        if not 0.0 <= self.max_pin_fraction <= 1.0:
            raise ValueError(f"max_pin_fraction must be in 0..1, got {self.max_pin_fraction}")
        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.quantization not in (None, "int8"):
            raise ValueError(f"quantization must be 'int8' or None, got {self.quantization!r}")
        if self.quantization == "int8":
            if not self.device.startswith("cpu"):
                raise ValueError(
                    "quantization='int8' is a CPU option (torch's CPU int8 weight kernel)"
                )
            if self.dtype in (None, "auto"):
                # torch's int8-weight kernel is fast with bf16 activations and ~20x slower with
                # fp32 ones (measured here); int8 already gives up fp32 exactness
                self.dtype = "bfloat16"
        self.dtype = resolve_dtype(self.dtype, self.device)
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(
                f"dtype must be auto, float32, float16 or bfloat16, got {self.dtype!r}"
            )
        check_kv_cache_dtype(self.kv_cache_dtype, self.device)
        if self.kv_cache_rotation not in KV_CACHE_ROTATIONS:
            raise ValueError(
                f"kv_cache_rotation must be one of {KV_CACHE_ROTATIONS}, got {self.kv_cache_rotation!r}"
            )
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

    @property
    def queue_bounds(self) -> tuple[int | None, int | None, int | None, int | None]:
        """(max_queued_requests, max_queued_tokens, tenant_max_queued_requests,
        tenant_max_queued_tokens): engine/core/admission.QueueBounds' fields, in order."""
        return (
            self.max_queued_requests,
            self.max_queued_tokens,
            self.tenant_max_queued_requests,
            self.tenant_max_queued_tokens,
        )


def _flag_name(f) -> str:
    return f.metadata["argparse"].get("dest_flag") or "--" + f.name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One command-line flag per EngineConfig field (help, choices and the app's defaults from the
    field's metadata): app.py adds no engine flag by hand, so a new option is one field."""
    groups: dict[str, object] = {}
    for f in fields(EngineConfig):
        m = f.metadata
        if not m.get("flag", False):
            continue
        kw = {k: v for k, v in m["argparse"].items() if k != "dest_flag"}
        default = m["cli_default"] if m["cli_default"] is not MISSING else f.default
        g = m["group"]
        if g and g not in groups:  # pool: --num-blocks / --kv-cache-gib, one or the other
            groups[g] = (
                parser.add_mutually_exclusive_group()
                if g == "pool"
                else parser.add_argument_group(g)
            )
        target = groups[g] if g else parser
        target.add_argument(_flag_name(f), dest=f.name, default=default, help=m["help"], **kw)


def from_args(args: argparse.Namespace, **extra) -> EngineConfig:
    """The EngineConfig of parsed flags (`add_arguments`); `extra` sets fields that have no flag.
    ValueError (with the flag's name) when a value is refused."""
    kw = {}
    for f in fields(EngineConfig):
        if not f.metadata.get("flag", False) or not hasattr(args, f.name):
            continue
        v = getattr(args, f.name)
        parse = f.metadata["parse"]
        if parse is not None and v is not None:
            try:
                v = parse(v)
            except ValueError as e:
                raise ValueError(f"{_flag_name(f)}: {e}") from None
        kw[f.name] = v
    return EngineConfig(**kw, **extra)
