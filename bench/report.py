"""Derived tables (sessions in a KV budget, targets) and the Markdown rendering of a result."""

from __future__ import annotations

MIB = 2**20


def sessions_fit(
    prompt_lens,
    output_lens,
    shared_prefix: int,
    block_size: int,
    kv_bytes_per_token: int,
    budget_bytes: int = 256 * MIB,
    max_model_lens=(8192, 2048),
) -> dict:
    """How many of the chat workload's sessions (at their final length, taken in order and cycled)
    fit in a KV budget under each allocation scheme, and the bytes the whole workload needs."""
    lens = [p + k for p, k in zip(prompt_lens, output_lens)]
    n = len(lens)
    per_block = kv_bytes_per_token * block_size
    budget_tokens, budget_blocks = budget_bytes // kv_bytes_per_token, budget_bytes // per_block
    shared = shared_prefix // block_size  # only full blocks are shared
    blocks = [-(-x // block_size) for x in lens]

    def fit(first: int, per_session) -> int:
        used, count = first, 0
        while count < 100_000:
            need = per_session(count % n)
            if used + need > budget_blocks:
                break
            used, count = used + need, count + 1
        return count

    rows = []
    for L in max_model_lens:
        rows.append(
            {
                "scheme": f"contiguous, max_model_len={L} reserved per session",
                "sessions": budget_tokens // L,
                "workload_bytes": n * L * kv_bytes_per_token,
            }
        )
    widest = max(prompt_lens) + max(output_lens)
    rows.append(
        {
            "scheme": f"contiguous, batch-wide max length {widest} (HF static batch)",
            "sessions": budget_tokens // widest,
            "workload_bytes": n * widest * kv_bytes_per_token,
        }
    )
    rows.append(
        {
            "scheme": f"paging, {block_size}-token blocks",
            "sessions": fit(0, lambda i: blocks[i]),
            "workload_bytes": sum(blocks) * per_block,
        }
    )
    rows.append(
        {
            "scheme": f"paging + sharing the {shared}-block common prefix",
            "sessions": fit(shared, lambda i: blocks[i] - shared),
            "workload_bytes": (shared + sum(b - shared for b in blocks)) * per_block,
        }
    )
    return {
        "budget_bytes": budget_bytes,
        "budget_tokens": budget_tokens,
        "budget_blocks": budget_blocks,
        "session_lengths_mean": sum(lens) / n,
        "shared_prefix_tokens": shared_prefix,
        "rows": rows,
    }


def _target(name, value, threshold, higher_is_better=True, detail=""):
    met = (
        None if value is None else (value >= threshold if higher_is_better else value <= threshold)
    )
    return {"target": name, "value": value, "threshold": threshold, "met": met, "detail": detail}


def targets(result: dict) -> list[dict]:
    out, w, lim = [], result["workloads"], result.get("limits") or {}
    if "chat" in w:
        r = w["chat"]["ratios"]
        out.append(
            _target(
                "chat: engine tokens/s >= 3x HF static batching",
                r["tokens_per_s_engine_over_hf_static"],
                3.0,
            )
        )
        out.append(
            _target(
                "chat: engine peak KV <= 1/4 of HF static batching's",
                r["peak_kv_engine_over_hf_static"],
                0.25,
                higher_is_better=False,
            )
        )
    if "multiturn" in w:
        ns = w["multiturn"]["new_session_cached_system_prompt"]
        out.append(
            _target(
                "TTFT, new session with cached system prompt >= 5x faster than cold",
                ns["speedup"],
                5.0,
                detail=f"{ns['samples']} sessions",
            )
        )
    if "decode" in w:
        bs = w["decode"]["batches"]
        if "32" in bs and lim:
            v = bs["32"]["systems"]["engine"]["decode_tokens_per_s"]
            out.append(
                _target(
                    "decode B=32 >= 50% of the compute-bound limit",
                    v / lim["compute_bound_tok_s"] if v else None,
                    0.5,
                )
            )
        if "1" in bs and lim:
            v = bs["1"]["systems"]["engine"]["decode_tokens_per_s"]
            out.append(
                _target(
                    "decode B=1 >= 50% of the weight-bandwidth limit",
                    v / lim["weight_bw_bound_tok_s"] if v else None,
                    0.5,
                )
            )
        for b, key, name in (
            ("32", "compute_bound_tok_s", "compute-bound"),
            ("1", "weight_bw_bound_tok_s", "weight-bandwidth"),
        ):
            v = (bs.get(b, {}).get("systems", {}).get("engine_bf16") or {}).get(
                "decode_tokens_per_s"
            )
            if v and lim:
                out.append(
                    _target(
                        f"(option) engine dtype=bfloat16, decode B={b} >= 50% of the fp32 {name} "
                        f"limit",
                        v / lim[key],
                        0.5,
                        detail=f"{100 * v / lim[key + '_bf16'] if key + '_bf16' in lim else 0:.0f}% "
                        f"of the bf16 {name} limit",
                    )
                )
    return out


def _f(x, fmt="{:.1f}", none="-"):
    return none if x is None else fmt.format(x)


def _ms(x):
    return _f(x * 1000 if x is not None else None, "{:.0f}")


def _system_table(systems: dict, ref: dict) -> list[str]:
    lines = [
        "| system | requests | output tok/s | engine / this | TTFT p50 / p95 ms | ITL p50 / p95 ms "
        "| peak KV MiB | prefill computed / cached | note |",
        "|" + "---|" * 9,
    ]
    for name, s in systems.items():
        if "error" in s:
            lines.append(f"| {name} | - | failed | - | - | - | - | - | {s['error'][:120]} |")
            continue
        note = "; ".join(str(s[k]) for k in ("subsample", "note", "kv_bytes_kind") if s.get(k))
        if s.get("reps", 1) > 1:
            note = (
                f"median of {s['reps']} runs "
                + "/".join(_f(v, "{:.0f}") for v in s["tokens_per_s_reps"])
                + (f"; {note}" if note else "")
            )
        if s.get("setup_s") is not None:
            note += "; its manager allocates the cache in its own thread, inside the timed window"
        ratio = (
            ref["tokens_per_s"] / s["tokens_per_s"]
            if s is not ref and s.get("tokens_per_s")
            else None
        )
        lines.append(
            f"| {name} | {s['requests']} | {_f(s['tokens_per_s'])} | {_f(ratio, '{:.2f}x')} "
            f"| {_ms(s['ttft_p50_s'])} / {_ms(s['ttft_p95_s'])} | {_ms(s['itl_p50_s'])} / {_ms(s['itl_p95_s'])} "
            f"| {_f((s['peak_kv_bytes'] or 0) / MIB)} | {s['prefill_tokens_computed']} / {s['prefill_tokens_cached']} "
            f"| {note} |"
        )
    return lines


def render_markdown(result: dict) -> str:
    m, lim, w = result["machine"], result.get("limits"), result["workloads"]
    L = [
        f"# Benchmark run {result['started']}",
        "",
        f"`{result['command']}` — {m['cpu_model']}, {m['cores']} cores, torch {m['torch']} "
        f"({m['torch_threads']} threads, {m['device']}), transformers {m['transformers']}, "
        f"commit {m['commit'][:10]} ({m['dirty_files']} dirty files), load average start "
        f"{_f(result['loadavg_start'][0], '{:.2f}')} end {_f(result['loadavg_end'][0], '{:.2f}')}, "
        f"total {result['elapsed_s']:.0f} s."
        + (" **Quick mode (tiny sizes).**" if result["quick"] else ""),
        "",
    ]
    if lim:
        g = lim["gemm_flops"]
        L += [
            "## Machine limits (best of the measurements in this run)",
            "",
            "| measure | value |",
            "|---|---|",
        ]
        L += [f"| fp32 GEMM {k} | {v / 1e9:.1f} GFLOP/s |" for k, v in g.items()]
        L += [
            f"| fp32 GEMM {k} (256 MiB of distinct weights) | {v / 1e9:.1f} GFLOP/s |"
            for k, v in lim["gemm_flops_cold_weights"].items()
        ]
        L += [
            f"| bf16 GEMM {k} | {v / 1e9:.1f} GFLOP/s |" for k, v in lim["gemm_flops_bf16"].items()
        ]
        L += [
            f"| memory read bandwidth | {lim['read_bytes_per_s'] / 1e9:.1f} GB/s |",
            f"| compute-bound decode (2 x {lim['num_params'] / 1e6:.1f} M FLOP/token, best GEMM) "
            f"| {lim['compute_bound_tok_s']:.0f} tok/s |",
            f"| same at the [32,576]x[576,1536] GEMM rate | {lim['compute_bound_tok_s_b32_shape']:.0f} tok/s |",
            f"| same with weights streamed from memory (cold) | {lim['compute_bound_tok_s_b32_cold']:.0f} tok/s |",
            f"| weight-bandwidth-bound batch-1 decode ({lim['weight_bytes_fp32'] / 1e6:.0f} MB/token) "
            f"| {lim['weight_bw_bound_tok_s']:.0f} tok/s |",
            f"| batch-1 decode at torch's cold-weight GEMV rate | {lim['gemv_bound_tok_s_b1_cold']:.0f} tok/s |",
            f"| bf16 weights: compute-bound / weight-bandwidth-bound | {lim['compute_bound_tok_s_bf16']:.0f} / "
            f"{lim['weight_bw_bound_tok_s_bf16']:.0f} tok/s |",
            "",
        ]
    if "chat" in w:
        c = w["chat"]
        L += [
            f"## chat — {c['sizes']['sessions']} sessions, shared prefix {c['shared_prefix_tokens']} tokens, "
            f"outputs {c['sizes']['out_min']}-{c['sizes']['out_max']} tokens (EOS ignored)",
            "",
        ]
        L += _system_table(c["systems"], c["systems"]["engine"])
        L += [
            "",
            "Tokens identical to the engine's (greedy): "
            + ", ".join(
                f"{k} {v['identical']}/{v['compared']}"
                for k, v in c["token_match_vs_engine"].items()
            ),
            "",
        ]
        fit = c["sessions_fit"]
        L += [
            f"### Sessions that fit in a {fit['budget_bytes'] / MIB:.0f} MiB KV budget "
            f"({fit['budget_tokens']} tokens; chat sessions average {fit['session_lengths_mean']:.0f} tokens)",
            "",
            "| scheme | sessions that fit | KV for this workload's sessions, MiB |",
            "|---|---|---|",
        ]
        L += [
            f"| {r['scheme']} | {r['sessions']} | {r['workload_bytes'] / MIB:.1f} |"
            for r in fit["rows"]
        ]
        L += [
            f"| engine measured peak (all sessions at once) | - | "
            f"{c['systems']['engine']['peak_kv_bytes'] / MIB:.1f} |",
            "",
        ]
    if "multiturn" in w:
        mt = w["multiturn"]
        names = list(mt["per_turn"][0]["ttft_p50_s"])
        L += [
            f"## multiturn — {mt['sizes']['conversations']} conversations x {mt['sizes']['turns']} turns, "
            f"up to {mt['sizes']['max_tokens_per_turn']} tokens per reply, one request at a time",
            "",
            "| turn | prompt tokens (mean) | "
            + " | ".join(f"TTFT p50 ms {n}" for n in names)
            + " | prefill computed "
            + " / ".join(names)
            + " |",
            "|" + "---|" * (len(names) + 3),
        ]
        for t in mt["per_turn"]:
            L.append(
                f"| {t['turn']} | {t['prompt_tokens_mean']:.0f} | "
                + " | ".join(_ms(t["ttft_p50_s"][n]) for n in names)
                + " | "
                + " / ".join(str(t["prefill_computed_total"][n]) for n in names)
                + " |"
            )
        ns = mt["new_session_cached_system_prompt"]
        L += [
            "",
            f"New session whose system prompt is cached: TTFT p50 {_ms(ns['ttft_cached_p50_s'])} ms vs cold "
            f"{_ms(ns['ttft_cold_p50_s'])} ms = {_f(ns['speedup'], '{:.2f}x')} ({ns['samples']} sessions). "
            f"Later turns, session vs no reuse: {_f(mt['later_turns_ttft_speedup_session_vs_no_reuse'], '{:.2f}x')}. "
            f"Same reply ids with and without the session: {mt['all_ids_identical_session_vs_prefix_only']}.",
            "",
        ]
    if "decode" in w:
        d = w["decode"]
        L += [
            f"## decode — prompts of {d['sizes']['prompt_len']} tokens, {d['sizes']['max_tokens']} new tokens each",
            "",
            "| batch | engine decode tok/s | engine end-to-end tok/s | HF decode tok/s | engine / HF "
            "| % compute-bound | % weight-BW-bound | ITL p50 ms engine / HF | same ids | engine bf16 decode tok/s "
            "(% of fp32 / bf16 compute-bound) |",
            "|" + "---|" * 10,
        ]
        for b, r in d["batches"].items():
            e, h = r["systems"]["engine"], r["systems"]["hf_static_batch"]
            v = e["decode_tokens_per_s"]
            pc = _f(100 * v / lim["compute_bound_tok_s"], "{:.0f}%") if lim and v else "-"
            pb = _f(100 * v / lim["weight_bw_bound_tok_s"], "{:.0f}%") if lim and v else "-"
            tm = r["token_match_vs_engine"]
            bf = (r["systems"].get("engine_bf16") or {}).get("decode_tokens_per_s")
            bfs = (
                "-"
                if bf is None
                else f"{bf:.1f}"
                + (
                    f" ({100 * bf / lim['compute_bound_tok_s']:.0f}% / {100 * bf / lim['compute_bound_tok_s_bf16']:.0f}%)"
                    if lim
                    else ""
                )
            )
            L.append(
                f"| {b} | {_f(v)} | {_f(e['tokens_per_s'])} | {_f(h['decode_tokens_per_s'])} "
                f"| {_f(r['decode_ratio_engine_over_hf'], '{:.2f}x')} | {pc} | {pb} "
                f"| {_ms(e['itl_p50_s'])} / {_ms(h['itl_p50_s'])} | {tm['identical']}/{tm['compared']} | {bfs} |"
            )
        g = d.get("generate_api")
        if g:
            a, t = g["llm_generate"], g["threaded_submit"]
            L += [
                "",
                f"Admission: the B={g['batch']} burst through `LLM.generate` took {a['steps']} engine steps "
                f"and {a['wall_s']:.1f} s ({a['tokens_per_s']:.1f} tok/s, at most {a['peak_running']} sequences "
                f"running together) vs {t['steps']} steps and {t['wall_s']:.1f} s ({t['tokens_per_s']:.1f} tok/s) "
                f"when submitted from one thread per request; same ids: {g['same_ids']}.",
            ]
        L.append("")
    if result.get("targets"):
        L += [
            "## Targets",
            "",
            "| target | value | threshold | met | detail |",
            "|---|---|---|---|---|",
        ]
        for t in result["targets"]:
            met = {True: "met", False: "**not met**", None: "n/a"}[t["met"]]
            L.append(
                f"| {t['target']} | {_f(t['value'], '{:.2f}')} | {t['threshold']} | {met} | {t['detail']} |"
            )
        L.append("")
    if result.get("notes"):
        L += ["## Notes", ""] + [f"- {n}" for n in result["notes"]] + [""]
    return "\n".join(L)
