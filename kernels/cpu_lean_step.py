"""A whole model step for a few tokens in one C++ call (kernels/csrc/cpu_lean_step.cpp, ctypes).

Why: one person chatting is the common case of a local server, and there a CPU decode step was
bound by per-call overhead, not by memory: ~300 Python -> C++ hops per token and oneDNN GEMMs
built for many rows. `LeanStep` holds the model's weights as plain row-major pointers (one table
built once) and runs embedding, every layer, the final norm and the LM head in C++. It serves the
shapes `LeanStep.takes` names — one sequence's token or speculative step (<= 17 tokens), or a
small decode batch (<= 8 tokens; <= 17 over an int8 pool) — over a pool in the weights' dtype, or an int8 pool (rotated or
not: the step quantizes k and v on store as the loop does); the model runs its loop for everything
else (fp8 pools, many tokens).

Families beyond Llama (issue 45) add a second per-layer table (`ext`, EXT_KEYS): q/k norms, Gemma's
post-attention and post-MLP norms, the layer's own RoPE table or none, its sliding window; and
model-wide an embedding scale and the MLP activation. A Llama model passes none of it and runs the
C++ exactly as before.
"""

from __future__ import annotations

import ctypes

import torch

from kernels import kv_quant
from kernels.cpu_build import CSRC, LazyLibrary, profiled
from kernels.greedy_head import Int8Screen

_MAX_TOKENS: list[int] = []  # kernels/csrc's kMaxTokens, read when the library loads
_COLUMN_BLOCKS: list[int] = []  # which weight dtypes the build's column-block kernels take (bits)
# (activation dtype, weights int8?) -> exported function
_FN = {
    (torch.float32, False): "lean_step_f32",
    (torch.bfloat16, False): "lean_step_bf16",
    (torch.float32, True): "lean_step_f32_i8",
    (torch.bfloat16, True): "lean_step_bf16_i8",
}
# several sequences over row-major weights: the lean step up to this many tokens (LeanStep.takes)
BATCH_MAX_TOKENS = 8
MAX_GROUP, MAX_DIM, MAX_BLOCK = 16, 256, 128  # paged_decode.h's kMaxGroup / kMaxDim / kMaxBlock
_ERRORS = {
    1: "token id outside the vocabulary",
    2: "position beyond the RoPE table",
    3: "KV slot beyond the pool",
    4: "block table does not cover the sequence (or names a block beyond the pool)",
    5: "logits row outside the step's tokens",
    6: "token count outside 1..max_tokens or above the context",
    8: "a screened LM head over an int8 head, or without its scales and bounds",
    9: "tiled weights where this build has no column-block kernel for them",
}
LAYER_KEYS = (
    "ln1",
    "qkv",
    "qkv_b",
    "o",
    "o_b",
    "ln2",
    "gate_up",
    "down",
    "qkv_s",
    "o_s",
    "gate_up_s",
    "down_s",
)  # the C++ pointer table's order
LINEAR_KEYS = ("qkv", "o", "gate_up", "down")
EXT_KEYS = (
    "q_norm",
    "k_norm",
    "post_attn",
    "post_ff",
    "cos",
    "sin",
    "no_rope",
    "window",
)  # C++ kExt order
ACT_KINDS = {"silu": 0, "gelu_tanh": 1}


class LeanStepFailed(RuntimeError):
    """The step could not start (memory or threads refused); nothing was written, the loop can run."""


def _declare(dll) -> None:
    p, i, L, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
    for name in _FN.values():
        fn = getattr(dll, name)
        fn.argtypes = [
            p,
            i,
            i,
            i,
            i,
            i,
            i,
            p,
            L,
            p,
            p,
            p,
            i,
            p,
            i,
            p,
            p,
            p,
            L,
            p,
            p,
            L,
            p,
            L,
            i,
            p,
            i,
            i,
            p,
            p,
            f,
            f,
            p,
            i,
            i,
            i,
            p,
            p,
            f,
            i,
            p,
            i,
            i,
            p,
            p,
            p,
            i,
        ]
        fn.restype = ctypes.c_int
    if dll.lean_step_ptrs_per_layer() != len(LAYER_KEYS) or dll.lean_step_ext_per_layer() != len(
        EXT_KEYS
    ):
        raise RuntimeError(
            "cpu_lean_step.cpp and LAYER_KEYS / EXT_KEYS disagree on the pointer tables"
        )
    _MAX_TOKENS.append(int(dll.lean_step_max_tokens()))
    for name in ("lean_linear_f32", "lean_linear_bf16", "lean_linear_i8"):
        getattr(dll, name).argtypes = [p, i, p, i, p, p, L, L]
        getattr(dll, name).restype = ctypes.c_int
    _COLUMN_BLOCKS.append(int(dll.lean_step_column_blocks()))


_LIB = LazyLibrary(
    CSRC / "cpu_lean_step.cpp",
    ("-ffp-contract=off",),
    disable_env="PAGED_CHAT_LEAN_STEP",
    declare=_declare,
    label="CPU lean step",
)


def _lib():
    return _LIB.lib


def active_path() -> str:
    return _LIB.active_path()


def available(dtype: torch.dtype, int8_weights: bool = False) -> bool:
    return (dtype, int8_weights) in _FN and _lib() is not None


def column_blocks(dtype: torch.dtype) -> bool:
    """Whether this build's lean step has the column-block kernels for weights of this dtype
    (AVX-512; bf16: AVX512-BF16): kernels/lean_products.py lays weights out for them."""
    bit = {torch.float32: 1, torch.bfloat16: 2}.get(dtype, 0)
    return bool(bit) and _lib() is not None and bool(_COLUMN_BLOCKS[0] & bit)


def library():
    """The built C++ library (ctypes), or None without a compiler: for kernels/lean_products.py."""
    return _lib()


def error_text(code: int, what: str) -> str:
    return _ERRORS.get(code, f"{what} failed ({code})")


class LeanStep:
    """The model's weights as one pointer table for the C++ step. `layers`: per layer a dict with
    LAYER_KEYS' tensors (plain [N, K] weights in `dtype`, or int8 codes with fp32 scales under the
    `_s` keys; absent biases as None). `tiled`: the four layer linears are in lean_products.tile_rows'
    column-block layout instead (plain weights only, every layer). The tensors are held here, so the pointers stay valid."""

    def __init__(
        self,
        *,
        layers: list[dict],
        embed: torch.Tensor,
        norm: torch.Tensor,
        lm_head: torch.Tensor,
        lm_scale: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        intermediate: int,
        eps: float,
        dtype: torch.dtype,
        tiled: bool = False,
        ext: list[dict] | None = None,
        embed_scale: float | None = None,
        act: str = "silu",
        screen: Int8Screen | None = None,
    ):
        int8 = lm_scale is not None
        if not available(dtype, int8):
            raise ValueError(
                f"no lean CPU step for {dtype} ({'int8' if int8 else 'plain'} weights): {active_path()}"
            )
        if num_heads % num_kv_heads or num_heads // num_kv_heads > MAX_GROUP or head_dim > MAX_DIM:
            raise ValueError(
                f"no lean CPU step for {num_heads} heads over {num_kv_heads} KV heads of {head_dim}"
            )
        self._fn = getattr(_lib(), _FN[(dtype, int8)])
        self.dtype, self.int8 = dtype, int8
        self._keep = [embed, norm, lm_head, lm_scale, cos, sin]
        ptrs = torch.zeros(len(layers), len(LAYER_KEYS), dtype=torch.int64)
        tiled_dim = 4 if dtype == torch.bfloat16 else 3  # lean_products.tile_rows' layout
        for i, L in enumerate(layers):
            for j, key in enumerate(LAYER_KEYS):
                t = L.get(key)
                if t is None:
                    continue
                want = (
                    torch.float32
                    if key.endswith("_s")
                    else (torch.int8 if int8 and key in LINEAR_KEYS else dtype)
                )
                if t.dtype != want or not t.is_contiguous() or t.device.type != "cpu":
                    raise ValueError(
                        f"layer {i} {key}: need a contiguous CPU {want} tensor, got {t.dtype}"
                    )
                if key in LINEAR_KEYS and t.dim() != (tiled_dim if tiled else 2):
                    raise ValueError(
                        f"layer {i} {key}: need a {'tiled' if tiled else 'plain [N, K]'} weight, "
                        f"got shape {tuple(t.shape)}"
                    )
                self._keep.append(t)
                ptrs[i, j] = t.data_ptr()
        if tiled and (
            int8
            or not column_blocks(dtype)
            or embed.shape[1] % 16
            or (num_heads * head_dim) % 16
            or intermediate % 16
        ):
            raise ValueError(
                "the tiled layout needs plain weights, a build with its kernel (AVX-512; bf16: "
                "AVX512-BF16) and hidden, attention and intermediate sizes in multiples of 16"
            )
        self.ptrs, self.tiled = ptrs, tiled  # tiled: kernels/lean_products.tile_rows' layout
        self.num_layers, self.hidden = len(layers), embed.shape[1]
        self.h, self.kvh, self.d, self.inter = num_heads, num_kv_heads, head_dim, intermediate
        self.vocab, self.eps = lm_head.shape[0], float(eps)
        self.embed, self.norm, self.lm_head, self.lm_scale = embed, norm, lm_head, lm_scale
        self.cos, self.sin = cos, sin
        self.ext = self._ext_table(ext, dtype, cos.shape[0]) if ext else None
        self.embed_scale = float(embed_scale or 0.0)
        if act not in ACT_KINDS:
            raise ValueError(f"no lean CPU step for the activation {act!r}")
        self.act_kind = ACT_KINDS[act]
        if screen is not None and (
            int8
            or screen.shape != tuple(lm_head.shape)
            or screen.scale.shape[0] != lm_head.shape[0]
            or screen.coef.shape[0] != lm_head.shape[0]
        ):
            raise ValueError("a screened LM head needs a plain head and a copy of its shape")
        self.screen = screen  # kernels/greedy_head.py: greedy steps read its int8 copy of the head

    def _ext_table(self, ext: list[dict], dtype: torch.dtype, positions: int) -> torch.Tensor:
        """EXT_KEYS per layer as int64: tensors by address (held here), no_rope and window as values."""
        if len(ext) != self.num_layers:
            raise ValueError(f"{len(ext)} ext entries for {self.num_layers} layers")
        table = torch.zeros(len(ext), len(EXT_KEYS), dtype=torch.int64)
        for i, E in enumerate(ext):
            for j, key in enumerate(EXT_KEYS):
                v = E.get(key)
                if v is None:
                    continue
                if key in ("no_rope", "window"):
                    table[i, j] = int(v)
                    continue
                size = (
                    self.d
                    if key in ("q_norm", "k_norm")
                    else self.hidden
                    if key.startswith("post")
                    else None
                )
                ok = v.dtype == dtype and v.is_contiguous() and v.device.type == "cpu"
                if key in ("cos", "sin"):
                    ok = (
                        ok
                        and v.dim() == 2
                        and v.shape[1] == self.d
                        and (v.shape[0] == positions or E.get("no_rope"))
                    )
                else:
                    ok = ok and tuple(v.shape) == (size,)
                if not ok:
                    raise ValueError(
                        f"layer {i} {key}: need a contiguous CPU {dtype} tensor of the right shape, "
                        f"got {v.dtype} {tuple(v.shape)}"
                    )
                self._keep.append(v)
                table[i, j] = v.data_ptr()
        return table

    def can_run(
        self, kv_pool: torch.Tensor, rotation: torch.Tensor | None = None, groups: bool = False
    ) -> bool:
        """The pool is one this step can read and write: contiguous, one layer slot per layer (or,
        with KV cache groups, P slots that `layer_kv` maps the layers to), blocks the attention
        kernel takes (paged_decode.h: block <= 128 tokens), and either in the weights' dtype,
        unrotated, or int8 rows (kernels/kv_quant.py), rotated by `rotation` ([d, d] fp32) or not.
        fp8 rows: no."""
        if not (
            kv_pool.is_contiguous()
            and kv_pool.dim() == 6
            and kv_pool.shape[3] <= MAX_BLOCK
            and (
                kv_pool.shape[1] == self.num_layers
                or groups
                and kv_pool.shape[1] <= self.num_layers
            )
        ):
            return False
        if kv_pool.dtype == torch.int8:
            return kv_pool.shape[5] == self.d + kv_quant.SCALE_BYTES and (
                rotation is None
                or (
                    rotation.dtype == torch.float32
                    and rotation.is_contiguous()
                    and tuple(rotation.shape) == (self.d, self.d)
                )
            )
        return kv_pool.dtype == self.dtype and rotation is None and kv_pool.shape[5] == self.d

    def takes(self, num_tokens: int, num_seqs: int, quantized_pool: bool = False) -> bool:
        """Whether a step of this shape is the lean step's: one sequence's token or speculative step
        (up to max_tokens: a verification costs about one token's step and its logits are
        bit-identical to one-token steps'), or a decode batch: up to max_tokens over tiled weights,
        up to BATCH_MAX_TOKENS over row-major ones. Measured (ms a 16-chat decode step, the
        default model on a 544-token shared prompt, the burst of `python -m bench --peers`):
        the loop 58.6 (fp32) / 45.1 (bf16); the lean step over row-major weights 52.7 / 46.4; over
        tiled ones, with the shared prompt's attention as two small products, 44.9 / 35.6. Row-major
        dot products past 8 rows lost to oneDNN's packed GEMMs (`python -m bench.profile_decode
        --batches 1,2,4,8,16`: 48.6 vs 39.2 at 16). Over an int8 pool a batch too takes up to
        max_tokens: there the loop pays the quantizing store and the rotations in torch per layer,
        and the lean step measured 2x its throughput at 12 and 16 chats (225 vs 110 and 250 vs 126
        tok/s, `python -m bench.kv_decode_speed --batches 12,16` with the limit at 8 and at 17)."""
        return num_tokens <= (
            self.max_tokens if num_seqs == 1 or quantized_pool or self.tiled else BATCH_MAX_TOKENS
        )

    @property
    def max_tokens(self) -> int:
        """Tokens one call scores: one, or one plus a speculative draft (kernels/csrc: kMaxTokens)."""
        return _MAX_TOKENS[0]

    def __call__(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        tables: torch.Tensor,
        seq_lens: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        kv_pool: torch.Tensor,
        scale: float,
        rows: torch.Tensor,
        rotation: torch.Tensor | None = None,
        layer_kv: torch.Tensor | None = None,
        argmax_only: bool = False,
    ) -> torch.Tensor:
        """Logits [len(rows), vocab] fp32 of the given rows of one step's T new tokens (T <=
        max_tokens), packed over sequences as AttentionMetadata packs them: tokens, positions,
        slots int64 [T]; tables int32 [S, W]; seq_lens int32 [S] (context incl. this step's
        tokens); cu_seqlens_q int32 [S + 1]; rows int64 [R]. Their K/V go into `slots`. The pool
        and `rotation` must pass can_run (an int8 pool is written quantized).
        KV cache groups (engine/kv/cache_spec.py): `layer_kv` int32 [L, 2] holds each layer's pool
        slot and group; slots are then [G, T] and tables [G, S, W], one per group (released table
        entries written as block 0, never read: the window starts after them).
        argmax_only: every row wants only its argmax (a greedy step): with a screen the logits are
        exact where a row may be the argmax and -inf elsewhere (kernels/greedy_head.py).
        Out-of-range inputs raise ValueError before anything is written."""
        for name, t in (
            ("tokens", tokens),
            ("positions", positions),
            ("slots", slots),
            ("rows", rows),
        ):
            if t.dtype != torch.int64 or not t.is_contiguous():
                raise ValueError(f"{name} must be a contiguous int64 tensor")
        for name, t in (
            ("block tables", tables),
            ("seq_lens", seq_lens),
            ("cu_seqlens_q", cu_seqlens_q),
        ):
            if t.dtype != torch.int32 or not t.is_contiguous():
                raise ValueError(f"{name} must be a contiguous int32 tensor")
        T, R, S = tokens.shape[0], rows.shape[0], seq_lens.shape[0]
        G = 1
        if layer_kv is not None:
            if (
                layer_kv.dtype != torch.int32
                or not layer_kv.is_contiguous()
                or tuple(layer_kv.shape) != (self.num_layers, 2)
            ):
                raise ValueError("layer_kv must be a contiguous int32 [layers, 2] tensor")
            G = int(layer_kv[:, 1].max()) + 1
            if slots.dim() != 2 or slots.shape[0] != G or tables.dim() != 3 or tables.shape[0] != G:
                raise ValueError("with layer_kv, slots are [groups, T] and tables [groups, S, W]")
            tables = tables.view(G * S, -1) if S else tables
        if positions.shape[0] != T or slots.shape[-1] != T:
            raise ValueError("tokens, positions and slots must have one entry per token")
        if tables.dim() != 2 or tables.shape[0] != G * S or cu_seqlens_q.shape[0] != S + 1:
            raise ValueError(
                "block tables, seq_lens and cu_seqlens_q must describe the same sequences"
            )
        if not self.can_run(kv_pool, rotation, groups=layer_kv is not None):
            raise ValueError(
                f"the lean step cannot use this pool ({kv_pool.dtype}, shape {tuple(kv_pool.shape)}) "
                f"{'with' if rotation is not None else 'without'} that rotation"
            )
        nb, bs = kv_pool.shape[2], kv_pool.shape[3]
        logits = torch.empty(R, self.vocab, dtype=torch.float32)
        with profiled("cpu_lean_step"):
            err = self._fn(
                self.ptrs.data_ptr(),
                self.num_layers,
                self.hidden,
                self.h,
                self.kvh,
                self.d,
                self.inter,
                self.embed.data_ptr(),
                self.embed.shape[0],
                tokens.data_ptr(),
                positions.data_ptr(),
                slots.data_ptr(),
                T,
                rows.data_ptr(),
                R,
                self.norm.data_ptr(),
                self.lm_head.data_ptr(),
                None if self.lm_scale is None else self.lm_scale.data_ptr(),
                self.vocab,
                self.cos.data_ptr(),
                self.sin.data_ptr(),
                self.cos.shape[0],
                kv_pool.data_ptr(),
                nb,
                bs,
                tables.data_ptr(),
                tables.shape[1],
                S,
                seq_lens.data_ptr(),
                cu_seqlens_q.data_ptr(),
                self.eps,
                float(scale),
                logits.data_ptr(),
                torch.get_num_threads(),
                int(self.tiled),
                int(kv_pool.dtype == torch.int8),
                None if rotation is None else rotation.data_ptr(),
                None if self.ext is None else self.ext.data_ptr(),
                self.embed_scale,
                self.act_kind,
                None if layer_kv is None else layer_kv.data_ptr(),
                kv_pool.shape[1],
                G,
                *(
                    (scr.codes.data_ptr(), scr.scale.data_ptr(), scr.coef.data_ptr(), scr.blocked)
                    if (scr := self.screen if argmax_only else None) is not None
                    else (None, None, None, 0)
                ),
            )
        if err == 7:
            raise LeanStepFailed(
                "the lean step could not get memory or threads (nothing was written)"
            )
        if err:
            raise ValueError(
                _ERRORS.get(err, f"lean step input error {err}") + f" (tokens {T}, sequences {S}, "
                f"pool {nb} x {bs} slots, RoPE table {self.cos.shape[0]}, vocabulary {self.embed.shape[0]})"
            )
        return logits
