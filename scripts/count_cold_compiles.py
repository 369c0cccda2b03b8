"""Count what a cold GPU check compiles, on CPU, by recording the Triton interpreter's launches.

Why: a cold Triton cache costs seconds per specialization on the lent machine, and the check has
one command of at most 10 minutes. Triton compiles once per distinct (kernel, constexprs, argument
dtypes, integer args equal to 1 / divisible by 16, pointer 16-byte alignment, int32 vs int64); the
interpreter runs the same launch sites, so wrapping InterpretedFunction.run and keying launches that
way counts the distinct compiles a GPU run would do (the on-disk cache is shared by every stage and
process, so the union over stages is the cold total).
    TRITON_INTERPRET=1 python scripts/count_cold_compiles.py engines   # warm-ups of the check's engines
    TRITON_INTERPRET=1 python -m pytest -p count_cold_compiles ...     # a test run (the kernel stage)
The key set is written to $COUNT_COMPILES_OUT (JSON) at exit when that is set.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

KEYS: set[tuple] = set()


def _spec(v):
    if isinstance(v, torch.Tensor):
        return ("ptr", str(v.dtype), v.data_ptr() % 16 == 0)
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, int):
        return ("int", v == 1, v % 16 == 0, "i64" if abs(v) >= 2**31 else "i32")
    if isinstance(v, float):
        return ("fp32",)
    return ("const", repr(v))


def _constexprs(fn) -> set[str]:
    import inspect

    return {
        p.name
        for p in inspect.signature(fn).parameters.values()
        if "constexpr" in str(p.annotation)
    }


def _record(self, *args, grid, warmup, **kwargs):
    const = _constexprs(self.fn)  # a constexpr's value is part of the key
    val = lambda n, v: ("constexpr", repr(v)) if n in const else _spec(v)
    spec = [(n, val(n, a)) for n, a in zip(self.arg_names, args)] + sorted(
        (k, val(k, v)) for k, v in kwargs.items()
    )
    KEYS.add((self.fn.__name__,) + tuple(spec))
    return _orig(self, *args, grid=grid, warmup=warmup, **kwargs)


_orig = interpreter.InterpretedFunction.run
interpreter.InterpretedFunction.run = _record


def summary() -> dict:
    by_kernel = Counter(k[0] for k in KEYS)
    return {"distinct_compiles": len(KEYS), "by_kernel": dict(by_kernel.most_common())}


def _dump():
    path = os.environ.get("COUNT_COMPILES_OUT")
    if path:
        Path(path).write_text(json.dumps({**summary(), "keys": sorted(map(repr, KEYS))}, indent=1))


atexit.register(_dump)


def engines(only: str | None = None) -> dict:
    """The warm-up of every engine instance the full check builds (shapes of engine/exec/configs/, one
    layer and a 4k vocabulary: neither changes a Triton specialization), with its table width."""
    from engine.exec import dummy_weights as dw
    from engine.exec.models.llama import LlamaModel
    from engine.exec.warmup import warm_up
    import gpu_check

    plan = [(c, dt, 2048) for dt in ("bfloat16", "float32") for c in gpu_check.CONFIGS]  # numerics
    plan += [("llama-3.2-1b", "bfloat16", 512), ("llama-3.2-1b", "bfloat16", 208)]  # graphs, speed
    if only:
        plan = [p for p in plan if f"{p[0]}:{p[1]}" == only]
    rows = []
    for name, dt, max_len in plan:
        before = set(KEYS)
        cfg = dw.load_config(name, {"num_hidden_layers": 1, "vocab_size": 4096})
        tdt = getattr(torch, dt)
        m = LlamaModel(
            cfg, dw.random_weights(cfg, seed=0, dtype=tdt), tdt, "cpu", max_positions=max_len
        )
        m.use_fused = True  # the CUDA forward (fused Triton layer ops)
        kvh = cfg.num_key_value_heads
        pool = torch.zeros(2, 1, 64, 16, kvh, m.head_dim, dtype=tdt)
        warm_up(m, pool, "triton", -(-max_len // 16), log=lambda s: None)
        rows.append(
            {"engine": f"{name} {dt} max_len {max_len}", "new_compiles": len(KEYS - before)}
        )
        print(
            f"{rows[-1]['engine']}: {rows[-1]['new_compiles']} new compiles (total {len(KEYS)})",
            flush=True,
        )
    return {"engines": rows, **summary()}


if __name__ == "__main__":
    if sys.argv[1:2] == ["engines"]:  # optional: CONFIG:DTYPE, e.g. llama-3.2-1b:bfloat16
        print(json.dumps(engines(sys.argv[2] if len(sys.argv) > 2 else None), indent=1))
    else:
        sys.exit(
            "usage: count_cold_compiles.py engines  (or use it as a pytest plugin: -p count_cold_compiles)"
        )
