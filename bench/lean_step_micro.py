"""The lean C++ step alone, per phase, and A/B against other builds of it (issue 49).

    python -m bench.lean_step_micro [--dtype float32] [--context 300] [--steps 60] [--threads 2]
                                    [--rows 1] [--phases] [--variant /path/to/other.so ...]

Why: a chat's decode step is the lean step, and on this shared 2-core box a wall-clock tok/s moves
30-50% with the neighbours' load. This drives `LeanStep` directly (no engine thread, no sampler) on
the default model after a `--context`-token prefill, and reports the best and the median of
`--steps` calls (wall ms and the process's CPU ms). `--phases` splits the step into its layers
(the same step with a 4-row LM head) and the final norm + LM head (the step with no layers).
`--variant` loads other builds of kernels/csrc/cpu_lean_step.cpp (e.g. the previous commit's, built
by `--build-ref REV`) and runs them interleaved with the current one, call by call, so a slow spell
hits all of them alike: the ratio of their best times is what a kernel change is judged by here.
`--rows N` steps N sequences' tokens at once (a small decode batch).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time


def build_ref(rev: str) -> str:
    """Compile kernels/csrc/cpu_lean_step.cpp (and its headers) as of git `rev` into a temp .so,
    with the flags kernels/cpu_lean_step.py uses."""
    from kernels.cpu_build import CSRC

    repo = CSRC.parent.parent
    d = tempfile.mkdtemp(prefix=f"lean-{rev}-")
    for f in subprocess.run(
        ["git", "ls-tree", "--name-only", rev, "kernels/csrc/"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split():
        with open(os.path.join(d, os.path.basename(f)), "wb") as out:
            out.write(
                subprocess.run(
                    ["git", "show", f"{rev}:{f}"], cwd=repo, capture_output=True, check=True
                ).stdout
            )
    so = os.path.join(d, "lean.so")
    subprocess.run(
        [
            "g++",
            "-O3",
            "-march=native",
            "-ffp-contract=off",
            "-fopenmp",
            "-shared",
            "-fPIC",
            "-std=c++17",
            os.path.join(d, "cpu_lean_step.cpp"),
            "-o",
            so,
        ],
        check=True,
    )
    return so


def load_variant(path: str, fn_name: str):
    from kernels import cpu_lean_step

    fn = getattr(ctypes.CDLL(path), fn_name)
    ref = getattr(cpu_lean_step._lib(), fn_name)
    fn.argtypes, fn.restype = ref.argtypes, ref.restype
    return fn


def setup(dtype: str, context: int, rows: int, kv: str, quantization: str | None = None):
    import torch
    from bench import kv_accuracy as acc
    from engine.exec.loader import load_model
    from engine.exec.models.llama import AttentionMetadata

    loaded = load_model(None, progress=lambda f, m: None)
    runner = acc.build_runner(
        loaded,
        kv,
        num_blocks=64 + rows * (context // 16 + 2),
        dtype=dtype,
        quantization=quantization,
    )
    model, pool, bs = runner.model, runner.kv_pool, runner.cfg.block_size
    assert model.lean is not None, model.cpu_path
    ids = [(31 * i + 7) % 49152 for i in range(context)]
    nblk = context // bs + 2
    tables = torch.stack(
        [torch.arange(1 + r * nblk, 1 + (r + 1) * nblk, dtype=torch.int32) for r in range(rows)]
    )
    for r in range(rows):  # prefill each sequence's context through the loop
        for a in range(0, context, 128):
            n = min(128, context - a)
            p = torch.arange(a, a + n)
            meta = AttentionMetadata(
                slot_mapping=tables[r, p // bs].long() * bs + p % bs,
                block_tables=tables[r : r + 1],
                seq_lens=torch.tensor([a + n], dtype=torch.int32),
                cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32),
                max_seqlen_q=n,
                backend="torch",
            )
            model.forward(torch.tensor(ids[a : a + n]), p, pool, meta, torch.tensor([n - 1]))
    pos = torch.full((rows,), context, dtype=torch.int64)
    args = dict(
        tokens=torch.tensor([11 + r for r in range(rows)], dtype=torch.int64),
        positions=pos,
        slots=(tables[:, context // bs].long() * bs + context % bs).contiguous(),
        tables=tables,
        seq_lens=torch.full((rows,), context + 1, dtype=torch.int32),
        cu_seqlens_q=torch.arange(rows + 1, dtype=torch.int32),
        kv_pool=pool,
        scale=model.scale,
        rows=torch.arange(rows, dtype=torch.int64),
        rotation=model.kv_rotation,
    )
    return model, args


def phase_steps(model):
    """(name, LeanStep) for the whole step, its layers alone, its head alone."""
    from kernels import cpu_lean_step

    lean = model.lean
    out = [("whole step", lean)]
    rebuild = dict(
        embed=lean.embed,
        norm=lean.norm,
        cos=lean.cos,
        sin=lean.sin,
        num_heads=lean.h,
        num_kv_heads=lean.kvh,
        head_dim=lean.d,
        intermediate=lean.inter,
        eps=lean.eps,
        dtype=lean.dtype,
        tiled=lean.tiled,
    )
    by_ptr = {t.data_ptr(): t for t in lean._keep[6:]}  # the pointer table back to its tensors
    layers = [
        {k: by_ptr.get(int(lean.ptrs[i, j])) for j, k in enumerate(cpu_lean_step.LAYER_KEYS)}
        for i in range(lean.num_layers)
    ]
    small_head = lean.lm_head[:4].contiguous()
    out.append(
        (
            "layers (LM head of 4 rows)",
            cpu_lean_step.LeanStep(
                layers=layers,
                lm_head=small_head,
                lm_scale=None if lean.lm_scale is None else lean.lm_scale[:4].contiguous(),
                **rebuild,
            ),
        )
    )
    out.append(
        (
            "final norm + LM head (no layers)",
            cpu_lean_step.LeanStep(
                layers=[], lm_head=lean.lm_head, lm_scale=lean.lm_scale, **rebuild
            ),
        )
    )
    return out


def timed(call, n: int) -> tuple[list[float], list[float]]:
    wall, cpu = [], []
    for _ in range(n):
        c0, t0 = time.process_time(), time.perf_counter()
        call()
        wall.append(1000 * (time.perf_counter() - t0))
        cpu.append(1000 * (time.process_time() - c0))
    return wall, cpu


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.lean_step_micro", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--dtype", default="float32")
    p.add_argument("--kv", default="auto", help="KV cache dtype (auto = the weights')")
    p.add_argument("--quantization", default=None, help="int8: int8 weights (bf16 activations)")
    p.add_argument("--context", type=int, default=300)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--phases", action="store_true")
    p.add_argument(
        "--loop", action="store_true", help="also time the per-layer loop on the same step"
    )
    p.add_argument(
        "--variant", action="append", default=[], help="another build's .so, run interleaved"
    )
    p.add_argument(
        "--build-ref",
        default=None,
        metavar="REV",
        help="build the lean step as of git REV as a variant",
    )
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    from kernels import cpu_lean_step

    model, args = setup(a.dtype, a.context, a.rows, a.kv, a.quantization)
    lean = model.lean
    variants = [("current", lean._fn)]
    if a.build_ref:
        a.variant.append(build_ref(a.build_ref))
    fn_name = cpu_lean_step._FN[(lean.dtype, lean.int8)]
    for v in a.variant:
        variants.append((v, load_variant(v, fn_name)))
    print(
        f"# lean step micro: {a.dtype} weights, KV {a.kv}, context {a.context}, rows {a.rows}, "
        f"{a.threads} threads, {a.steps} calls each; load {os.getloadavg()[0]:.2f}; {model.cpu_path}"
    )
    ref_logits = lean(**args)
    results = {}
    for rnd in range(a.steps):  # interleaved, call by call
        for name, fn in variants:
            lean._fn = fn
            w, c = timed(lambda: lean(**args), 1)
            results.setdefault(name, ([], []))
            results[name][0].extend(w)
            results[name][1].extend(c)
    lean._fn = variants[0][1]
    if a.loop:  # the model's loop on the same inputs (its own linears, attention kernel)
        from engine.exec.models.llama import AttentionMetadata

        meta = AttentionMetadata(
            slot_mapping=args["slots"],
            block_tables=args["tables"],
            seq_lens=args["seq_lens"],
            cu_seqlens_q=args["cu_seqlens_q"],
            max_seqlen_q=1,
            backend="torch",
        )
        model.lean = None
        try:
            call = lambda: model.forward(
                args["tokens"], args["positions"], args["kv_pool"], meta, args["rows"]
            )
            want = call()
            w, c = timed(call, a.steps)
            results["loop (lean step off)"] = (w, c)
            print(
                f"loop: greedy tokens equal to the lean step's: {torch.equal(want.argmax(-1), ref_logits.argmax(-1))}"
            )
        finally:
            model.lean = lean
    for name, fn in variants[1:]:
        lean._fn = fn
        same = torch.equal(lean(**args), ref_logits)
        lean._fn = variants[0][1]
        print(f"variant {name}: logits bit-identical to current: {same}")
    print(
        "\n| variant | best ms | median ms | CPU ms (best / median) | best vs current | best CPU vs current |"
        "\n|---|---|---|---|---|---|"
    )
    best0, cpu0 = min(results["current"][0]), min(results["current"][1])
    for name, (w, c) in results.items():
        print(
            f"| {os.path.basename(name) if name != 'current' else name} | {min(w):.2f} | "
            f"{statistics.median(w):.2f} | {min(c):.2f} / {statistics.median(c):.2f} | {min(w) / best0:.3f} | "
            f"{min(c) / cpu0:.3f} |"
        )
    if a.phases:
        print("\n| phase | best ms | median ms | CPU ms (median) |\n|---|---|---|---|")
        for name, st in phase_steps(model):
            kw = (
                dict(args, kv_pool=args["kv_pool"][:, : st.num_layers].contiguous())
                if not st.num_layers
                else args
            )
            w, c = timed(lambda: st(**kw), a.steps)
            print(
                f"| {name} | {min(w):.2f} | {statistics.median(w):.2f} | {statistics.median(c):.2f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
