"""python -m bench [--workload chat|multiturn|decode|all] [--sessions N] [--quick] [--json out.json]
   python -m bench --with-vllm | --serving [bench/serving.py options]   (engine vs vLLM-CPU)
   python -m bench --kv-dtypes [bench/kv_dtypes.py options]   (fp32 / bf16 / int8 KV: capacity, decode)
   python -m bench --fairness [bench/fairness.py options]              (fair scheduling vs FCFS)
   python -m bench --tier [--with-vllm] [bench/kv_tier_bench.py options]   (the KV tier on vs off, vLLM-CPU)
   python -m bench --speculative [bench/speculative_bench.py options]   (speculation on / off, llama.cpp)
   python -m bench --kv-events [bench/kv_events_reader.py options]   (the KV-event reader: memory, CPU per 10^5 events)
   python -m bench --kv-groups [bench/kv_groups_bench.py options]   (KV cache groups vs full-attention paging)
   python -m bench --state [bench/state_bench.py options]   (linear-attention states, MoE)
   python -m bench --peers [bench/peers.py options]   (engine vs llama.cpp and vLLM-CPU, each alone, checked)

Runs the engine and its HF transformers baselines side by side on the same token ids, measures the
machine's own limits in the same run, prints a Markdown report and writes JSON + Markdown under
bench/results/ (or next to --json). See docs/BENCHMARKS.md for what every number means.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[2])
    p.add_argument("--workload", choices=("chat", "multiturn", "decode", "all"), default="all")
    p.add_argument("--sessions", type=int, default=None, help="chat sessions (default 32; quick 4)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, a short system prompt, one repetition (smoke test)",
    )
    p.add_argument("--json", default=None, help="output JSON path (Markdown written next to it)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-cache-gib", type=float, default=1.0, help="engine KV pool size")
    p.add_argument("--skip", default="", help="comma list of: hf_seq, hf_cb, bf16, limits")
    return p.parse_args(argv)


def main(argv=None) -> int:
    rest = list(sys.argv[1:] if argv is None else argv)
    if (
        "--peers" in rest
    ):  # each system in its own process, peers checked (issue 49): bench/peers.py
        from bench import peers

        return peers.main([x for x in rest if x != "--peers"])
    if "--kv-dtypes" in rest:
        # capacity and decode speed per KV cache format (issue 22): bench/kv_dtypes.py
        from bench import kv_dtypes

        return kv_dtypes.main([x for x in rest if x != "--kv-dtypes"])

    if "--fairness" in rest:  # fair scheduling vs FCFS (issue 24): bench/fairness.py
        from bench import fairness

        return fairness.main([x for x in rest if x != "--fairness"])

    if (
        "--speculative" in rest
    ):  # speculative decoding on vs off, llama.cpp (issue 28): bench/speculative_bench.py
        from bench import speculative_bench

        return speculative_bench.main([x for x in rest if x != "--speculative"])

    if (
        "--kv-events" in rest
    ):  # the KV-event reader's memory and CPU (issue 50): bench/kv_events_reader.py
        from bench import kv_events_reader

        return kv_events_reader.main([x for x in rest if x != "--kv-events"])
    if "--kv-groups" in rest:  # KV cache groups: capacity and decode, Gemma-3-1B shapes (issue 45)
        from bench import kv_groups_bench

        return kv_groups_bench.main([x for x in rest if x != "--kv-groups"])
    if "--state" in rest:  # linear-attention states and MoE (issue 51)
        from bench import state_bench

        return state_bench.main([x for x in rest if x != "--state"])

    if "--tier" in rest:  # the second KV tier, on vs off (issue 23): bench/kv_tier_bench.py
        from bench import kv_tier_bench

        return kv_tier_bench.main([x for x in rest if x != "--tier"])
    if "--with-vllm" in rest or "--serving" in rest:
        # the product's own workloads against vLLM-CPU (issue 15): bench/serving.py
        from bench import serving

        return serving.main([x for x in rest if x != "--serving"])
    args = parse_args(argv)
    # the engine's own default (engine/__init__.py), set before torch loads so HF gets it too
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if args.threads:  # before torch is imported, so every thread (the engine's too) gets it
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from tqdm import tqdm

    from bench import machine, report, suite
    from bench.hf_runner import load_hf
    from engine import ServingLLM

    started = time.strftime("%Y-%m-%d %H:%M:%S")
    t_start, load_start = time.perf_counter(), os.getloadavg()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    sizes = (
        suite.Sizes.quick(args.sessions)
        if args.quick
        else suite.Sizes(sessions=args.sessions or 32)
    )
    workloads = ["chat", "multiturn", "decode"] if args.workload == "all" else [args.workload]
    steps = 3 + 2 * ("limits" not in skip)
    steps += sum(
        {
            "chat": suite.chat_steps(sizes, skip),
            "multiturn": suite.multiturn_steps(sizes),
            "decode": suite.decode_steps(sizes),
        }[w]
        for w in workloads
    )
    bar = tqdm(total=steps, file=sys.stderr, desc="bench", unit="step", dynamic_ncols=True)

    def tick(msg: str) -> None:
        bar.set_postfix_str(msg[:60])
        bar.update(1)

    llm = ServingLLM(kv_cache_gib=args.kv_cache_gib, progress=lambda f, m: None)
    tick("engine loaded")
    hf = load_hf(llm.hf_folder)
    tick("HF model loaded")
    num_params = sum(p.numel() for p in hf.parameters())
    limit_samples = []
    if "limits" not in skip:
        limit_samples.append(machine.measure_limits(num_params, quick=args.quick))
        tick("machine limits (start)")
    ctx = suite.Ctx(llm, hf, sizes, args.seed, tick, skip)
    results = {}
    try:
        suite.warm_up(ctx)  # first touches of the KV pool and allocator, not measured
        tick("warm-up")
        for w in workloads:
            results[w] = {
                "chat": suite.run_chat,
                "multiturn": suite.run_multiturn,
                "decode": suite.run_decode,
            }[w](ctx)
        if "limits" not in skip:
            limit_samples.append(machine.measure_limits(num_params, quick=args.quick))
            tick("machine limits (end)")
        engine_stats = llm.stats()
    finally:
        ctx.close()
        llm.shutdown()
        bar.close()

    if "chat" in results:
        c = results["chat"]
        c["sessions_fit"] = report.sessions_fit(
            c["prompt_lens"],
            c["output_lens"],
            c["shared_prefix_tokens"],
            engine_stats["block_size"],
            engine_stats["kv_bytes_per_token"],
            max_model_lens=(hf.config.max_position_embeddings, 2048),
        )
    result = {
        "started": started,
        "command": "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "args": vars(args),
        "quick": args.quick,
        "sizes": vars(sizes) | {"decode_batches": list(sizes.decode_batches)},
        "machine": machine.machine_info(REPO),
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "elapsed_s": time.perf_counter() - t_start,
        "limits": machine.combine_limits(limit_samples) if limit_samples else None,
        "engine": {
            "model": llm.model_source,
            "config": {k: v for k, v in vars(llm.config).items()},
            "stats_at_end": engine_stats,
        },
        "workloads": results,
        "notes": notes(args, sizes),
    }
    result["targets"] = report.targets(result)
    md = report.render_markdown(result)
    out = args.json or os.path.join(
        RESULTS, time.strftime("bench-%Y%m%d-%H%M%S") + ("-quick" if args.quick else "") + ".json"
    )
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write(md)
    print(md)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def notes(args, sizes) -> list[str]:
    n = [
        "Engine requests of a burst are submitted from one thread each so they reach the engine together; "
        "times are taken by the client on receipt of each token.",
        "HF token times come from a logits processor called once per generation step (whole batch); "
        "EOS is disabled (eos_token_id=-1) so every system generates the same number of tokens.",
        "Each engine repetition uses its own cache_salt, so no repetition reuses another's KV.",
        f"HF one-at-a-time runs the first {sizes.hf_seq_subsample} chat requests only (subsample).",
        f"Sizes: chat {sizes.sessions} sessions, engine repetitions {sizes.engine_reps}, HF static "
        f"{sizes.hf_static_reps}; decode outputs {sizes.decode_max_tokens} tokens; multiturn replies up to "
        f"{sizes.mt_max_tokens} tokens."
        + (
            " Smaller than the issue's (32 sessions, 64-token decode outputs) "
            "so a full run fits ~15 min on the shared 2-core box."
            if sizes.sessions < 32 or sizes.decode_max_tokens < 64
            else ""
        ),
        "HF generate_batch KV bytes are its preallocated paged cache tensor, not the blocks it used.",
    ]
    if args.quick:
        n.append("Quick mode: tiny sizes and one repetition; numbers are not meaningful.")
    return n


if __name__ == "__main__":
    raise SystemExit(main())
