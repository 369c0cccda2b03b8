"""Round fp32 values to a 16-bit dtype the way torch does (round to nearest even), inside Triton.

Why: the fused kernels must round where eager torch rounds to match transformers bit for bit, and
`x.to(tl.bfloat16)` truncates under the CPU interpreter (measured: ~50% of random values differ
from torch), so the tests on CPU could not tell a right kernel from a wrong one. Rounding the fp32
bit pattern by hand gives the same result on the GPU and in the interpreter; the value returned is
fp32 holding an exactly representable 16-bit value, so a later `.to(dtype)` is exact.
"""

import triton
import triton.language as tl


@triton.jit
def round_as(x, DT: tl.constexpr):
    """fp32 x rounded to DT (bf16 / fp16 / fp32), returned as fp32."""
    if DT == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    elif DT == tl.float16:
        return x.to(tl.float16).to(tl.float32)  # fp16 casts round correctly in the interpreter
    else:
        return x
