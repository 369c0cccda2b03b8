"""The three workloads, each running the engine and its baselines interleaved on the same ids."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from bench import engine_runner as er
from bench import hf_runner as hr
from bench.metrics import combine, ratio, summarize, token_match
from bench.workloads import (
    SHORT_SYSTEM_PROMPT,
    SYSTEM_PROMPT,
    chat_workload,
    common_prefix_len,
    decode_prompts,
    multiturn_workload,
)


@dataclass
class Sizes:
    """Defaults sized so a full run stays near 15 minutes on the shared 2-core box; the issue's
    sizes are --sessions 32 with 64-token decode outputs (about twice as long)."""

    sessions: int = 32
    out_min: int = 16
    out_max: int = 256
    engine_reps: int = 2
    hf_static_reps: int = 1
    hf_seq_subsample: int = 4
    hf_cb_subsample: int = 16
    hf_cb_deadline_s: float = 150.0
    mt_conversations: int = 8
    mt_turns: int = 4
    mt_max_tokens: int = 16
    decode_batches: tuple = (1, 8, 32, 64)
    decode_prompt_len: int = 16
    decode_max_tokens: int = 32
    decode_engine_reps: int = 2
    system_prompt: str = (
        SYSTEM_PROMPT  # the chat and multiturn workloads' shared prompt (~300 tokens)
    )

    @classmethod
    def quick(cls, sessions: int | None = None) -> "Sizes":
        return cls(
            sessions=sessions or 4,
            out_min=4,
            out_max=12,
            engine_reps=1,
            hf_static_reps=1,
            hf_seq_subsample=2,
            hf_cb_subsample=2,
            hf_cb_deadline_s=90.0,
            mt_conversations=2,
            mt_turns=2,
            mt_max_tokens=6,
            decode_batches=(1, 4),
            decode_max_tokens=8,
            decode_engine_reps=1,
            system_prompt=SHORT_SYSTEM_PROMPT,
        )


class Ctx:
    """What every workload needs: the engine, the HF model, the tokenizer and a progress hook."""

    def __init__(self, llm, hf, sizes: Sizes, seed: int, tick, skip: set):
        self.llm, self.hf, self.sizes, self.seed, self.tick, self.skip = (
            llm,
            hf,
            sizes,
            seed,
            tick,
            skip,
        )
        self.tok = llm.get_tokenizer()
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        self._hf_cb = None

    def bf16_engine(self):
        """A second engine with bf16 weights and KV (decode only): what the CPU's bf16 GEMMs give."""
        if getattr(self, "_bf16", None) is None:
            from engine import ServingLLM

            self._bf16 = ServingLLM(kv_cache_gib=0.5, dtype="bfloat16", progress=lambda f, m: None)
        return self._bf16

    def close(self):
        if getattr(self, "_bf16", None) is not None:
            self._bf16.shutdown()
            self._bf16 = None

    def hf_cb_model(self):
        if self._hf_cb is None:  # its own copy: the manager swaps the attention implementation
            self._hf_cb = hr.load_hf(self.llm.hf_folder)
        return self._hf_cb


def warm_up(ctx: Ctx) -> None:
    prompts = decode_prompts(ctx.tok, 8, ctx.sizes.decode_prompt_len, ctx.seed + 99)
    er.run_burst(ctx.llm, prompts, [8] * 8, cache_salt="warm-up")
    hr.run_static(ctx.hf, prompts, [8] * 8, ctx.pad)


def chat_steps(sizes: Sizes, skip: set) -> int:
    n = sizes.engine_reps + sizes.hf_static_reps
    return n + ("hf_seq" not in skip) + 2 * ("hf_cb" not in skip)


def run_chat(ctx: Ctx) -> dict:
    s = ctx.sizes
    reqs = chat_workload(ctx.tok, s.sessions, s.out_min, s.out_max, ctx.seed, s.system_prompt)
    prompts, ks = [r.prompt_ids for r in reqs], [r.max_tokens for r in reqs]
    engine_rows, static_rows, first_engine, first_static = [], [], None, None
    for rep in range(max(s.engine_reps, s.hf_static_reps)):  # interleaved: E, H, E, H, E
        if rep < s.engine_reps:
            run = er.run_burst(ctx.llm, prompts, ks, cache_salt=f"chat-{ctx.seed}-{rep}")
            first_engine = first_engine or run
            engine_rows.append(summarize(run, "engine"))
            ctx.tick(f"chat: engine rep {rep + 1}")
        if rep < s.hf_static_reps:
            run = hr.run_static(ctx.hf, prompts, ks, ctx.pad)
            first_static = first_static or run
            static_rows.append(summarize(run, "hf_static_batch"))
            ctx.tick(f"chat: HF static batch rep {rep + 1}")
    engine = combine(engine_rows)
    systems = {"engine": engine, "hf_static_batch": combine(static_rows)}
    matches = {"hf_static_batch": token_match(first_engine["timings"], first_static["timings"])}
    if "hf_seq" not in ctx.skip:
        n = min(s.hf_seq_subsample, len(prompts))
        run = hr.run_one_at_a_time(ctx.hf, prompts[:n], ks[:n], ctx.pad)
        run["subsample"] = f"first {n} of {len(prompts)} requests, run one after another"
        systems["hf_sequential"] = combine([summarize(run, "hf_sequential")])
        matches["hf_sequential"] = token_match(first_engine["timings"][:n], run["timings"])
        ctx.tick("chat: HF one at a time")
    if "hf_cb" not in ctx.skip:
        n = min(s.hf_cb_subsample, len(prompts))
        sub = first_engine
        if n < len(prompts):  # a smaller set: the engine runs the same requests for a fair ratio
            sub = er.run_burst(ctx.llm, prompts[:n], ks[:n], cache_salt=f"chat-cb-{ctx.seed}")
            systems[f"engine_same_{n}"] = combine([summarize(sub, "engine")])
        ctx.tick(f"chat: engine on the same {n} requests as generate_batch")
        try:
            run = hr.run_continuous(
                ctx.hf_cb_model(), prompts[:n], ks[:n], ctx.pad, s.hf_cb_deadline_s
            )
            if n < len(prompts):
                run["subsample"] = f"first {n} of {len(prompts)} requests"
            if run["timed_out"]:
                run["note"] = (
                    f"stopped after {s.hf_cb_deadline_s:.0f} s; {run['finished']} of {n} finished"
                )
            systems["hf_generate_batch"] = combine([summarize(run, "hf_generate_batch")])
            matches["hf_generate_batch"] = token_match(sub["timings"], run["timings"])
        except Exception as e:  # report, do not crash the whole run
            systems["hf_generate_batch"] = {"system": "hf_generate_batch", "error": repr(e)[:500]}
        ctx.tick("chat: HF generate_batch")
    base = systems["hf_static_batch"]
    return {
        "sizes": {"sessions": s.sessions, "out_min": s.out_min, "out_max": s.out_max},
        "prompt_lens": [len(p) for p in prompts],
        "output_lens": ks,
        "shared_prefix_tokens": common_prefix_len(prompts),
        "systems": systems,
        "token_match_vs_engine": matches,
        "ratios": {
            "tokens_per_s_engine_over_hf_static": ratio(
                engine["tokens_per_s"], base["tokens_per_s"]
            ),
            "peak_kv_engine_over_hf_static": ratio(engine["peak_kv_bytes"], base["peak_kv_bytes"]),
            "ttft_p50_hf_static_over_engine": ratio(base["ttft_p50_s"], engine["ttft_p50_s"]),
        },
        "engine_peak_used_blocks": first_engine["peak_used_blocks"],
        "kv_bytes_per_block": first_engine["kv_bytes_per_block"],
    }


def multiturn_steps(sizes: Sizes) -> int:
    return sizes.mt_conversations


def run_multiturn(ctx: Ctx) -> dict:
    s, llm = ctx.sizes, ctx.llm
    convs = multiturn_workload(s.mt_conversations, s.mt_turns, ctx.seed, s.system_prompt)
    turns = []
    for c, conv in enumerate(convs):
        sid = f"mt-{ctx.seed}-{os.getpid()}-{c}"
        for t, msg in enumerate(conv.user_messages):
            conv.history.append({"role": "user", "content": msg})
            sess, st_s = er.run_sequential(
                llm, None, s.mt_max_tokens, session_id=sid, messages=list(conv.history)
            )
            ids = sess.prompt_ids
            nos, st_n = er.run_sequential(
                llm, ids, s.mt_max_tokens, cache_salt=f"mt-nosession-{ctx.seed}"
            )
            cold, st_c = er.run_sequential(llm, ids, 1, cache_salt=f"mt-cold-{ctx.seed}-{c}-{t}")
            hf = hr.prefill_ttft(ctx.hf, ids, ctx.pad)
            conv.history.append(
                {
                    "role": "assistant",
                    "content": ctx.tok.decode(sess.token_ids, skip_special_tokens=True),
                }
            )
            turns.append(
                {
                    "conversation": c,
                    "turn": t + 1,
                    "prompt_tokens": len(ids),
                    "output_tokens": len(sess.token_ids),
                    "ttft_s": {
                        "engine_session": sess.ttft,
                        "engine_prefix_cache_only": nos.ttft,
                        "engine_no_reuse": cold.ttft,
                        "hf_generate": hf.ttft,
                    },
                    "prefill_computed": {
                        "engine_session": st_s.get("prompt_tokens_computed_total"),
                        "engine_prefix_cache_only": st_n.get("prompt_tokens_computed_total"),
                        "engine_no_reuse": st_c.get("prompt_tokens_computed_total"),
                        "hf_generate": len(ids),
                    },
                    "cached_tokens": {
                        "engine_session": sess.cached_tokens,
                        "engine_prefix_cache_only": nos.cached_tokens,
                    },
                    "same_ids_session_vs_prefix_only": sess.token_ids == nos.token_ids,
                }
            )
        llm.end_session(sid)
        ctx.tick(f"multiturn: conversation {c + 1}")
    systems = list(turns[0]["ttft_s"])
    per_turn = []
    for t in range(1, s.mt_turns + 1):
        rows = [r for r in turns if r["turn"] == t]
        per_turn.append(
            {
                "turn": t,
                "prompt_tokens_mean": statistics.mean(r["prompt_tokens"] for r in rows),
                "ttft_p50_s": {k: statistics.median(r["ttft_s"][k] for r in rows) for k in systems},
                "prefill_computed_total": {
                    k: sum(r["prefill_computed"][k] for r in rows) for k in systems
                },
            }
        )
    # a new session whose system prompt is already cached (turn 1 of every conversation but the first)
    warm = [
        r["ttft_s"]["engine_session"] for r in turns if r["turn"] == 1 and r["conversation"] > 0
    ]
    cold = [
        r["ttft_s"]["engine_no_reuse"] for r in turns if r["turn"] == 1 and r["conversation"] > 0
    ]
    later = [r for r in turns if r["turn"] > 1]
    return {
        "sizes": {
            "conversations": s.mt_conversations,
            "turns": s.mt_turns,
            "max_tokens_per_turn": s.mt_max_tokens,
        },
        "turns": turns,
        "per_turn": per_turn,
        "new_session_cached_system_prompt": {
            "ttft_cached_p50_s": statistics.median(warm) if warm else None,
            "ttft_cold_p50_s": statistics.median(cold) if cold else None,
            "speedup": ratio(statistics.median(cold), statistics.median(warm)) if warm else None,
            "samples": len(warm),
        },
        "later_turns_ttft_speedup_session_vs_no_reuse": ratio(
            statistics.median(r["ttft_s"]["engine_no_reuse"] for r in later),
            statistics.median(r["ttft_s"]["engine_session"] for r in later),
        )
        if later
        else None,
        "prefill_computed_total": {
            k: sum(r["prefill_computed"][k] for r in turns) for k in systems
        },
        "all_ids_identical_session_vs_prefix_only": all(
            r["same_ids_session_vs_prefix_only"] for r in turns
        ),
    }


def decode_steps(sizes: Sizes) -> int:
    return len(sizes.decode_batches) * (sizes.decode_engine_reps + 2) + 1


def run_decode(ctx: Ctx) -> dict:
    s = ctx.sizes
    out = {
        "sizes": {
            "batches": list(s.decode_batches),
            "prompt_len": s.decode_prompt_len,
            "max_tokens": s.decode_max_tokens,
        },
        "batches": {},
    }
    first_engine_by_batch = {}
    for b in s.decode_batches:
        prompts = decode_prompts(ctx.tok, b, s.decode_prompt_len, ctx.seed)
        ks = [s.decode_max_tokens] * b
        erows, first_engine, hf_row, bf_row = [], None, None, None
        for rep in range(s.decode_engine_reps):  # interleaved: E, H, E
            run = er.run_burst(ctx.llm, prompts, ks, cache_salt=f"dec-{ctx.seed}-{b}-{rep}")
            first_engine = first_engine or run
            erows.append(summarize(run, "engine"))
            ctx.tick(f"decode B={b}: engine rep {rep + 1}")
            if rep == 0:
                hrun = hr.run_static(ctx.hf, prompts, ks, ctx.pad)
                hf_row = combine([summarize(hrun, "hf_static_batch")])
                ctx.tick(f"decode B={b}: HF")
                if "bf16" not in ctx.skip:
                    brun = er.run_burst(ctx.bf16_engine(), prompts, ks, cache_salt=f"dec-bf16-{b}")
                    bf_row = combine([summarize(brun, "engine_bf16")])
                    bf_row["token_match_vs_fp32_engine"] = token_match(
                        first_engine["timings"], brun["timings"]
                    )
                ctx.tick(f"decode B={b}: engine bf16")
        eng = combine(erows)
        first_engine_by_batch[str(b)] = first_engine
        out["batches"][str(b)] = {
            "systems": {
                "engine": eng,
                "hf_static_batch": hf_row,
                **({"engine_bf16": bf_row} if "bf16" not in ctx.skip else {}),
            },
            "decode_ratio_engine_over_hf": ratio(
                eng["decode_tokens_per_s"], hf_row["decode_tokens_per_s"]
            ),
            "token_match_vs_engine": token_match(first_engine["timings"], hrun["timings"]),
        }
    # the same burst through LLM.generate, which submits one request at a time
    b = max(x for x in s.decode_batches if x <= 32)
    prompts = decode_prompts(ctx.tok, b, s.decode_prompt_len, ctx.seed)
    api = er.run_generate_api(ctx.llm, prompts, s.decode_max_tokens)
    ref = out["batches"][str(b)]["systems"]["engine"]
    out["generate_api"] = {
        "batch": b,
        "llm_generate": {k: v for k, v in api.items() if k != "token_ids"},
        "threaded_submit": {
            "tokens_per_s": ref["tokens_per_s"],
            "steps": ref["stats"].get("steps"),
            "wall_s": ref["wall_s"],
        },
        "same_ids": api["token_ids"]
        == [t.token_ids for t in first_engine_by_batch[str(b)]["timings"]],
    }
    ctx.tick(f"decode B={b}: LLM.generate admission")
    return out
