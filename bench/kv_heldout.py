"""KV formats on the held-out chats (bench/heldout_chats.py), the engine beside llama.cpp (issue 49).

`python -m bench.kv_accuracy --heldout [--llama-server PATH --llama-gguf F32.gguf]`

For every KV format and both CPU paths (the lean C++ step, one chat at a time; the per-layer loop,
all chats in one batch), on the 30 held-out chats:
  greedy  the first 64 greedy tokens (EOS ignored) against fp32 KV's (which equal HF fp32 greedy:
          checked here by one HF forward per chat): identical replies, and the mean share of the 64
          tokens before the first difference;
  KL      teacher-forced on that fp32 reply (64 positions per chat: the prompt's last token, then the
          reply's), mean KL(HF fp32 || engine) in nats over the full vocabulary, and top-1 agreement;
  KL@100  the same KL over HF's 100 most likely tokens plus one bucket for the rest: what a
          server's top-100 log-probabilities allow, so the llama.cpp rows are comparable.
llama.cpp (optional): llama-server with the F32 GGUF, each --cache-type-k/-v in turn (flash
attention on: quantized V needs it; off for f32, where it would cast the cache to F16), on the
same prompt ids; its reference is its own f32 KV (greedy, and KL@100 at the same positions, fed one
token per request over the server's prompt cache, so every position after the prompt is a decode
step reading the quantized cache). A row beside it, "llama.cpp f32 vs HF", says how close the two
fp32 models are.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import torch

from bench import heldout_chats, kv_accuracy as acc

N_NEW = 64  # greedy tokens per chat, and teacher-forced positions per chat
TOP = 100  # KL@100: the reference's top tokens kept, the rest one bucket
EOS = 2  # <|im_end|>: llama.cpp's ignore_eos forbids it, so its replies are compared up to it


def kl_top(p_logp: torch.Tensor, q_logp: torch.Tensor, top: int = TOP) -> torch.Tensor:
    """Per position KL(P || Q) over P's `top` tokens plus one bucket for the rest (a lower bound of
    the full KL). p_logp, q_logp: [n, vocab] log-probabilities (float64)."""
    idx = p_logp.topk(top, -1).indices
    lp, lq = p_logp.gather(-1, idx), q_logp.gather(-1, idx)
    pr = (1 - lp.exp().sum(-1)).clamp_min(1e-300)
    qr = (1 - lq.exp().sum(-1)).clamp_min(1e-300)
    return (lp.exp() * (lp - lq)).sum(-1) + pr * (pr.log() - qr.log())


def kl_from_top(ref: list[dict], got: list[dict]) -> tuple[float, float]:
    """KL@top and top-1 agreement from two servers' top-N log-probabilities per position (dicts
    token -> logprob): KL over ref's listed tokens plus one bucket for the rest, as kl_top. A token
    of ref missing from got's list gets got's smallest listed probability (it is below it; happens
    only far down the tail)."""
    kls, same = [], 0
    for r, g in zip(ref, got):
        if r is None or g is None:  # a position the server returned no probabilities for
            continue
        floor = min(g.values())
        q = {t: g.get(t, floor) for t in r}
        p_rest = max(1 - sum(math.exp(v) for v in r.values()), 1e-300)
        q_rest = max(1 - sum(math.exp(v) for v in q.values()), 1e-300)
        kls.append(
            sum(math.exp(lp) * (lp - q[t]) for t, lp in r.items())
            + p_rest * (math.log(p_rest) - math.log(q_rest))
        )
        same += max(r, key=r.get) == max(g, key=g.get)
    return sum(kls) / len(kls), same / len(kls)


def greedy_stats(refs: list[list[int]], outs: list[list[int]], stop: int | None = None) -> dict:
    """stop: compare only up to the reference's first `stop` token (llama.cpp's ignore_eos forbids
    EOS, where the engine's emits it and goes on; agreement then counts over that prefix)."""
    if stop is not None:
        cut = [r.index(stop) if stop in r else len(r) for r in refs]
        refs, outs = [r[:c] for r, c in zip(refs, cut)], [o[:c] for o, c in zip(outs, cut)]
        fr = [
            next((i for i, (a, b) in enumerate(zip(r, o)) if a != b), len(r)) / max(1, len(r))
            for r, o in zip(refs, outs)
        ]
        return {
            "identical": sum(a == b for a, b in zip(refs, outs)),
            "chats": len(refs),
            "agreement": round(sum(fr) / len(fr), 4),
            "compared_up_to_eos": True,
        }
    return {
        "identical": sum(a == b for a, b in zip(refs, outs)),
        "chats": len(refs),
        "agreement": round(acc.agreement(refs, outs, N_NEW), 4),
    }


def engine_greedy(model_folder, kv: str, path: str, seqs) -> list[list[int]]:
    from engine import LLM

    kv_dtype, _, rot = kv.partition("/")
    llm = LLM(
        model_folder,
        dtype="float32",
        kv_cache_dtype=kv_dtype,
        kv_cache_rotation=rot or "auto",
        kv_cache_gib=0.5,
        lean_step="auto" if path == "lean" else "off",
    )
    try:
        if path == "lean":  # one chat at a time: the lean step's decode
            return [acc.engine_greedy(llm, [s], N_NEW)[0] for s in seqs]
        return acc.engine_greedy(llm, seqs, N_NEW)  # all at once: batched decode on the loop
    finally:
        llm.shutdown()


def hf_checks_reply(hf, seq: list[int], reply: list[int]) -> bool:
    """HF fp32's argmax at every position of seq + reply equals the next reply token (so the reply
    is HF's own greedy continuation)."""
    with torch.inference_mode():
        lg = hf(torch.tensor([seq + reply])).logits[0, len(seq) - 1 : len(seq) + len(reply) - 1]
    return lg.argmax(-1).tolist() == reply


def kl_rows(ref_lp: list[torch.Tensor], got: list[torch.Tensor]) -> dict:
    """Mean KL (full vocabulary and KL@100) and top-1 over the reply positions; got: per chat the
    logits of those positions [N_NEW, vocab]."""
    kl = kl100 = 0.0
    same = n = 0
    for r, g in zip(ref_lp, got):
        g = g.double().log_softmax(-1)
        kl += float((r.exp() * (r - g)).sum())
        kl100 += float(kl_top(r, g).sum())
        same += int((r.argmax(-1) == g.argmax(-1)).sum())
        n += r.shape[0]
    return {"positions": n, "kl": kl / n, "kl100": kl100 / n, "top1": same / n}


def teacher_forced(
    loaded, kv: str, path: str, full: list[list[int]], ref_lp: list[torch.Tensor]
) -> dict:
    runner = acc.build_runner(
        loaded, kv, num_blocks=1024, lean_step="auto" if path == "lean" else "off"
    )
    got = [
        g[-N_NEW - 1 : -1].clone()
        for g in acc.engine_logits(  # not views: the whole logits (1.5 GB) go
            runner, full, decode=N_NEW, group=1 if path == "lean" else None
        )
    ]
    del runner
    return kl_rows(ref_lp, got)


def emulated(hf, scheme: str, seqs, full, refs, ref_lp) -> dict:
    """HF fp32 with its K/V (and for llama.cpp-q8_0 its query) fake-quantized like llama.cpp's
    q8_0 cache (bench/kv_accuracy.fake_q8_0): what the test of the rule compares the engine with."""
    with acc.hf_kv_format(hf, scheme), torch.inference_mode():
        outs = [acc.hf_greedy(hf, [s], N_NEW)[0] for s in seqs]
        got = [hf(torch.tensor([f])).logits[0, -N_NEW - 1 : -1].clone() for f in full]
    return {"greedy": greedy_stats(refs, outs)} | kl_rows(ref_lp, got)


def run_engine(
    formats: list[str],
    paths: list[str],
    out: dict,
    chats: int | None = None,
    emulate: tuple[str, ...] = (),
) -> None:
    from transformers import AutoModelForCausalLM
    from engine.exec.loader import load_model

    loaded = load_model(None)
    hf = AutoModelForCausalLM.from_pretrained(loaded.hf_folder, dtype=torch.float32).eval()
    seqs = heldout_chats.token_ids(loaded.tokenizer)[:chats]
    out["prompt_tokens"] = [len(s) for s in seqs]
    t = time.perf_counter()
    refs = engine_greedy(loaded.hf_folder, "float32", "lean", seqs)
    checked = [hf_checks_reply(hf, s, r) for s, r in zip(seqs, refs)]
    for i, ok in enumerate(checked):  # not HF's: take HF's own greedy reply as the reference
        if not ok:
            refs[i] = acc.hf_greedy(hf, [seqs[i]], N_NEW)[0]
    out["reference"] = {
        "replies": refs,
        "engine_fp32_kv_equals_hf_greedy": sum(checked),
        "seconds": round(time.perf_counter() - t, 1),
    }
    print(
        f"reference: fp32 KV greedy = HF greedy on {sum(checked)}/{len(seqs)} chats",
        file=sys.stderr,
    )
    full = [s + r for s, r in zip(seqs, refs)]
    with torch.inference_mode():
        ref_lp = [
            hf(torch.tensor([f])).logits[0, -N_NEW - 1 : -1].double().log_softmax(-1) for f in full
        ]
    out["engine"] = {}
    for kv in formats:
        # the lean step reads only pools in the weights' dtype or int8: other pools run the loop
        for path in paths if kv.startswith("int8") else [p for p in paths if p == "loop"]:
            t = time.perf_counter()
            row = {"greedy": greedy_stats(refs, engine_greedy(loaded.hf_folder, kv, path, seqs))}
            row |= teacher_forced(loaded, kv, path, full, ref_lp)
            row["seconds"] = round(time.perf_counter() - t, 1)
            out["engine"][f"{kv} {path}"] = row
            print(f"engine {kv} {path}: {json.dumps(row)}", file=sys.stderr, flush=True)
    for sch in emulate:
        t = time.perf_counter()
        row = emulated(hf, sch, seqs, full, refs, ref_lp)
        row["seconds"] = round(time.perf_counter() - t, 1)
        out["engine"][f"HF + {sch} (emulated) hf"] = row
        print(f"HF {sch}: {json.dumps(row)}", file=sys.stderr, flush=True)
    out["_full"] = full


def run_llama(
    server: str,
    gguf: str,
    cache_types: list[str],
    full: list[list[int]],
    seqs_len: list[int],
    refs: list[list[int]],
    hf_top: list[list[dict]] | None,
    out: dict,
    threads: int = 1,
) -> None:
    from bench import llama_cpp_peer as lc

    res, top_by = {}, {}
    for ct in cache_types:
        t = time.perf_counter()
        # f32 without flash attention: with it, ggml casts an F32 cache to F16 (llama-graph.cpp) and
        # accumulates V in F16, which is no f32 reference; quantized V needs flash attention
        fa = "off" if ct == "f32" else "on"
        with lc.Server(
            server, gguf, threads=threads, extra=["-fa", fa, "-ctk", ct, "-ctv", ct, "-c", "4096"]
        ) as srv:
            greedy = [srv.complete(f[:n], N_NEW)["tokens"] for f, n in zip(full, seqs_len)]
            tops = [srv.teacher_forced_top(f, n, TOP) for f, n in zip(full, seqs_len)]
        top_by[ct] = [p for chat in tops for p in chat]
        missing = [i for i, p in enumerate(top_by[ct]) if p is None]
        res[ct] = {
            "greedy_vs_engine_ref": greedy_stats(refs, greedy, stop=EOS),
            "_greedy": greedy,
            "flash_attn": fa,
            "positions_without_probs": missing,
            "seconds": round(time.perf_counter() - t, 1),
        }
        print(
            f"llama.cpp {ct}: {json.dumps({k: v for k, v in res[ct].items() if k[0] != '_'})}",
            file=sys.stderr,
            flush=True,
        )
    base = cache_types[0]
    for ct in cache_types:
        res[ct]["greedy_vs_own_" + base] = greedy_stats(res[base]["_greedy"], res[ct]["_greedy"])
        res[ct]["kl100_vs_own_" + base], res[ct]["top1_vs_own_" + base] = kl_from_top(
            top_by[base], top_by[ct]
        )
        if hf_top is not None:
            res[ct]["kl100_vs_hf"], res[ct]["top1_vs_hf"] = kl_from_top(hf_top, top_by[ct])
    for ct in cache_types:
        res[ct].pop("_greedy")
    out["llama_cpp"] = {"server": server, "gguf": gguf, "threads": threads, "rows": res}


def report(out: dict) -> str:
    lines = [
        f"# KV formats on the held-out chats ({out['started']}, commit {out.get('commit')})",
        "",
        f"`{out['command']}`; load {out['load_start']} -> {out.get('load_end')}; "
        f"{len(out['prompt_tokens'])} chats, prompts {min(out['prompt_tokens'])}-"
        f"{max(out['prompt_tokens'])} tokens, {N_NEW} greedy tokens each; reference: fp32 KV greedy "
        f"(= HF fp32 greedy on {out['reference']['engine_fp32_kv_equals_hf_greedy']} chats)",
        "",
        "| engine KV (fp32 weights) | path | identical replies | greedy agreement (64) | "
        "mean KL vs HF fp32 | KL@100 | top-1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in out["engine"].items():
        kv, path = name.rsplit(" ", 1)
        g = r["greedy"]
        lines.append(
            f"| {kv} | {path} | {g['identical']}/{g['chats']} | {g['agreement']:.3f} | "
            f"{r['kl']:.2e} | {r['kl100']:.2e} | {100 * r['top1']:.2f}% |"
        )
    lc = out.get("llama_cpp")
    if lc:
        base = next(iter(lc["rows"]))
        lines += [
            "",
            f"llama.cpp (`{os.path.basename(lc['server'])}`, {os.path.basename(lc['gguf'])}, "
            f"flash attention on, off for f32): each cache type against its own {base} KV; 'identical vs "
            "engine ref' compares up to the reference's first EOS (llama.cpp's ignore_eos forbids it)",
            "",
            f"| llama.cpp KV | identical replies vs {base} | greedy agreement vs {base} | "
            f"KL@100 vs {base} | top-1 vs {base} | KL@100 vs HF fp32 | identical vs engine ref |",
            "|---|---|---|---|---|---|---|",
        ]
        for ct, r in lc["rows"].items():
            g, e = r["greedy_vs_own_" + base], r["greedy_vs_engine_ref"]
            lines.append(
                f"| {ct} | {g['identical']}/{g['chats']} | {g['agreement']:.3f} | "
                f"{r['kl100_vs_own_' + base]:.2e} | {100 * r['top1_vs_own_' + base]:.2f}% | "
                f"{r.get('kl100_vs_hf', float('nan')):.2e} | {e['identical']}/{e['chats']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    import argparse
    import subprocess

    p = argparse.ArgumentParser(prog="python -m bench.kv_accuracy --heldout")
    p.add_argument("--kv", default="int8/hadamard,int8/none,bfloat16,float16")
    p.add_argument("--paths", default="lean,loop")
    p.add_argument("--llama-server", default=None)
    p.add_argument("--llama-gguf", default=None, help="the F32 GGUF of the default model")
    p.add_argument("--llama-kv", default="f32,f16,q8_0,q4_0")
    p.add_argument(
        "--llama-threads",
        type=int,
        default=1,
        help="llama.cpp's threads (1: its spinning threads crawl on a busy machine; no effect on its numbers)",
    )
    p.add_argument(
        "--from-json",
        default=None,
        help="reuse an earlier run's engine part (its reference replies): run llama.cpp only",
    )
    p.add_argument(
        "--emulate",
        default="q8_0,llama.cpp-q8_0",
        help="HF with fake-quantized K/V (bench/kv_accuracy.fake_q8_0): q8_0, llama.cpp-q8_0 (+ query)",
    )
    p.add_argument("--chats", type=int, default=None, help="the first N chats only (a smoke run)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    out = {
        "command": "python -m bench.kv_accuracy --heldout " + " ".join(argv),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_start": [round(x, 2) for x in os.getloadavg()],
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        ).stdout.strip(),
    }
    formats = [f for f in a.kv.split(",") if f and f != "float32"]
    if a.from_json:
        with open(a.from_json) as f:
            prev = json.load(f)
        from engine.exec.loader import load_model

        seqs = heldout_chats.token_ids(load_model(None).tokenizer)[: a.chats]
        out |= {k: prev[k] for k in ("prompt_tokens", "reference", "engine")}
        out["engine_part_from"] = f"{a.from_json} ({prev['command']}, commit {prev.get('commit')})"
        full = [s + r for s, r in zip(seqs, prev["reference"]["replies"])]
    else:
        run_engine(
            formats, a.paths.split(","), out, a.chats, tuple(x for x in a.emulate.split(",") if x)
        )
        full = out.pop("_full")
    if a.llama_server:
        n = out["prompt_tokens"]
        hf_top = None
        from transformers import AutoModelForCausalLM
        from engine.exec.loader import load_model

        hf = AutoModelForCausalLM.from_pretrained(
            load_model(None).hf_folder, dtype=torch.float32
        ).eval()
        with torch.inference_mode():
            hf_top = []
            for f in full:
                lp = hf(torch.tensor([f])).logits[0, -N_NEW - 1 : -1].double().log_softmax(-1)
                v, i = lp.topk(TOP, -1)
                hf_top += [dict(zip(ii.tolist(), vv.tolist())) for vv, ii in zip(v, i)]
        del hf
        run_llama(
            a.llama_server,
            a.llama_gguf,
            a.llama_kv.split(","),
            full,
            n,
            out["reference"]["replies"],
            hf_top,
            out,
            a.llama_threads,
        )
    out["load_end"] = [round(x, 2) for x in os.getloadavg()]
    md = report(out)
    print(md)
    path = a.json or os.path.join(
        os.path.dirname(os.path.abspath(__file__)),
        "results",
        f"kv-heldout-{time.strftime('%Y%m%d-%H%M%S')}.json",
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    with open(path[:-5] + ".md", "w") as f:
        f.write(md)
    print(f"wrote {path}", file=sys.stderr)
    return 0
