"""python -m bench --kv-groups [--pool-gib 4] [--contexts 2048,8192,32768] [--batch 2]
                              [--decode-context 768] [--decode-layers N] [--decode-vocab V]

What KV cache groups buy (issue 45 item 3), Gemma-3-1B shapes (engine/exec/configs/gemma-3-1b.json:
26 layers, 22 local with a 512-token window, 4 global; one KV head of 256, bf16 KV), side by side in
one run:
- capacity: how many conversations of C tokens fit at once in the same pool bytes, measured with
  the real KV manager (engine/kv/kv_cache_manager.py): each conversation is admitted and grown to
  C tokens as the scheduler grows one (its prompt in 512-token chunks, its last 16 tokens one per
  step, like a reply; a sliding group gives its blocks back at each step's start), then kept;
  conversations are added until the next one does not fit. With groups (7 groups of P = 4 layer
  slots, 64 KiB blocks) against full-attention paging (one table for all 26 layers, P = 26,
  416 KiB blocks: the layout before groups) and against contiguous caches (every layer reserves
  max_model_len = 32,768 tokens: arithmetic);
- speed: decode tokens/s of the real engine with random weights (load_format=dummy) at batch B and
  a context past the window, groups on vs off (kv_cache_groups=False), the prompts prefilled once
  (prefix cache), then B x N / t(N new tokens each) (the first of the N steps computes each
  prompt's last token again: one decode-sized step); rounds alternate between the two engines;
  and the greedy ids of both, which must be equal (the window is applied in attention either
  way; only which blocks are kept differs).
Everything runs on CPU unless --device cuda; CPU prefill of a 1B model is slow, hence the short
decode context by default (the capacity part covers 2k / 8k / 32k).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

MIB = 2**20
CHUNK = 512  # the CPU engine's max_num_batched_tokens: a prompt grows by this much per step
DECODE = 16  # the last tokens of each conversation come one per step, as a reply does


def gemma_windows() -> tuple[list, object]:
    from pathlib import Path
    from transformers import Gemma3TextConfig
    from engine.exec.models.decoder_spec import describe

    raw = json.loads(
        (Path(__file__).parents[1] / "engine/exec/configs/gemma-3-1b.json").read_text()
    )
    cfg = Gemma3TextConfig(**{k: v for k, v in raw.items() if not k.startswith("_")})
    return [s.window for s in describe(cfg).layers], cfg


def fit(layout, pool_bytes: int, per_token_layer: int, context: int, block_size: int = 16) -> dict:
    """Conversations of `context` tokens the real manager holds at once in `pool_bytes`."""
    from engine.kv.kv_cache_manager import KVCacheManager
    from engine.observe.kv_snapshot import kv_stats

    block_bytes = layout.pool_layers * block_size * per_token_layer
    n_blocks = pool_bytes // block_bytes
    m = KVCacheManager(
        n_blocks, block_size, max_model_len=context + 1, layout=layout, enable_prefix_caching=False
    )
    convs = 0
    t0 = time.perf_counter()
    while True:
        sid = f"c{convs}"
        toks = [convs] * context
        if m.try_add_sequence(sid, toks, num_new_tokens=CHUNK) is None:
            break
        ok = True
        while m.num_computed(sid) < context:  # the prompt in chunks, then the reply token by token
            left = context - m.num_computed(sid)
            if not m.try_allocate_slots(sid, min(CHUNK, left - DECODE) if left > DECODE else 1):
                ok = False
                break
        if not ok:
            m.free(sid)
            break
        convs += 1
    st = kv_stats(m)
    return {
        "conversations": convs,
        "num_blocks": n_blocks,
        "block_bytes": block_bytes,
        "used_blocks": st.used_blocks,
        "blocks_per_conversation": st.used_blocks / max(1, convs),
        "window_released_blocks": st.window_released_blocks,
        "manager_s": time.perf_counter() - t0,
    }


def capacity(pool_gib: float, contexts: list[int]) -> list[dict]:
    from engine.kv.cache_spec import KVCacheLayout
    from engine.observe.kv_groups import kv_arithmetic

    windows, cfg = gemma_windows()
    per_token_layer = 2 * cfg.num_key_value_heads * cfg.head_dim * 2  # K and V, bf16
    pool = int(pool_gib * 2**30)
    grouped, paged = KVCacheLayout.from_layer_windows(windows), KVCacheLayout.single(len(windows))
    rows = []
    for c in contexts:
        g, f = fit(grouped, pool, per_token_layer, c), fit(paged, pool, per_token_layer, c)
        contiguous = pool // (len(windows) * cfg.max_position_embeddings * per_token_layer)
        a = kv_arithmetic(
            windows,
            kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            dtype_bytes=2,
            context_tokens=c,
            max_model_len=cfg.max_position_embeddings,
            name="Gemma-3-1B",
        )
        rows.append(
            {
                "context": c,
                "groups": g,
                "full_attention_paging": f,
                "contiguous": contiguous,
                "x_vs_paging": g["conversations"] / max(1, f["conversations"]),
                "x_vs_contiguous": g["conversations"] / max(1, contiguous),
                "sentence": a["sentence"],
            }
        )
    return rows


def decode_speed(
    batch: int,
    context: int,
    new_tokens: int,
    rounds: int,
    device: str | None,
    dtype: str,
    overrides: dict | None = None,
) -> dict:
    """Groups on and off side by side (both engines alive, rounds alternating: the machine's load
    moves under a long run), the same seeded weights and prompts; the lean C++ step off in both
    (it serves one-group layouts only, so it would time different code, not the layouts)."""
    from engine import LLM
    from engine.sampling.sampling_params import SamplingParams

    rng = random.Random(0)
    out = {
        "batch": batch,
        "context": context,
        "new_tokens": new_tokens,
        "dtype": dtype,
        "overrides": overrides or {},
    }
    p = lambda n: SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    engines: dict = {}
    try:
        for groups in (True, False):
            engines[groups] = LLM(
                model="gemma-3-1b",
                load_format="dummy",
                dtype=dtype,
                device=device,
                kv_cache_groups=groups,
                kv_cache_gib=1.0,
                max_num_seqs=batch,
                max_model_len=context + new_tokens + 64,
                lean_step="off",
                hf_overrides=overrides or None,
                progress=lambda f, m: None,
            )
        vocab = engines[True].model_info().vocab_size
        prompts = [
            {"prompt_token_ids": [rng.randrange(1000, vocab) for _ in range(context)]}
            for _ in range(batch)
        ]
        ids = {}
        for groups, llm in engines.items():
            llm.generate(prompts, p(1))  # prefill once: every later run hits the prefix cache
            ids[groups] = [o.outputs[0].token_ids for o in llm.generate(prompts, p(new_tokens))]
        samples: dict = {True: [], False: []}
        for r in range(rounds):
            for groups in (True, False) if r % 2 == 0 else (False, True):
                t0 = time.perf_counter()
                engines[groups].generate(prompts, p(new_tokens))
                samples[groups].append(batch * new_tokens / (time.perf_counter() - t0))
        out.update(
            groups_tok_s=statistics.median(samples[True]),
            paging_tok_s=statistics.median(samples[False]),
            samples={"groups": samples[True], "paging": samples[False]},
            same_ids=ids[True] == ids[False],
            window_released_blocks=engines[True].stats()["window_released_blocks"],
            device=engines[True].model_info().device,
        )
        return out
    finally:
        for llm in engines.values():
            llm.shutdown()


def render(cap: list[dict], speed: dict | None, pool_gib: float) -> str:
    lines = [
        f"| context | conversations in {pool_gib:g} GiB: groups | full-attention paging "
        "| contiguous (32k reserved) | x vs paging | x vs contiguous "
        "| blocks per conversation (groups / paging) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in cap:
        g, f = r["groups"], r["full_attention_paging"]
        lines.append(
            f"| {r['context']:,} | {g['conversations']} | {f['conversations']} | "
            f"{r['contiguous']} | "
            f"{r['x_vs_paging']:.1f}x | {r['x_vs_contiguous']:.1f}x | "
            f"{g['blocks_per_conversation']:.0f} x {g['block_bytes'] // 1024} KiB / "
            f"{f['blocks_per_conversation']:.0f} x {f['block_bytes'] // 1024} KiB |"
        )
    lines += [""] + [f"- {r['sentence']}" for r in cap]
    if speed:
        ratio = speed["groups_tok_s"] / speed["paging_tok_s"]
        shape = ", ".join(f"{k}={v}" for k, v in speed.get("overrides", {}).items())
        lines += [
            "",
            f"| decode, B={speed['batch']} x {speed['context']:,} ctx, {speed['dtype']} on "
            f"{speed['device']}{', ' + shape if shape else ''} | tok/s (median) | samples |",
            "|---|---|---|",
            f"| groups | {speed['groups_tok_s']:.2f} | "
            f"{', '.join(f'{x:.2f}' for x in speed['samples']['groups'])} |",
            f"| full-attention paging | {speed['paging_tok_s']:.2f} | "
            f"{', '.join(f'{x:.2f}' for x in speed['samples']['paging'])} |",
            "",
            f"groups / paging decode: {ratio:.2f}x; greedy ids equal: {speed['same_ids']}",
        ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench --kv-groups")
    p.add_argument("--pool-gib", type=float, default=4.0)
    p.add_argument("--contexts", default="2048,8192,32768")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--decode-context", type=int, default=768, help="past the 512-token window")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument(
        "--decode-layers",
        type=int,
        default=None,
        help="decode run only: the first N layers of the config (6 = one local/global cycle)",
    )
    p.add_argument(
        "--decode-vocab", type=int, default=None, help="decode run only: a smaller vocabulary"
    )
    p.add_argument("--no-speed", action="store_true", help="capacity only (no model runs)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    load0, t0 = os.getloadavg(), time.time()
    cap = capacity(a.pool_gib, [int(x) for x in a.contexts.split(",")])
    over = {
        k: v
        for k, v in (("num_hidden_layers", a.decode_layers), ("vocab_size", a.decode_vocab))
        if v
    }
    speed = (
        None
        if a.no_speed
        else decode_speed(
            a.batch,
            a.decode_context,
            a.new_tokens,
            a.rounds,
            a.device,
            a.dtype or ("bfloat16" if (a.device or "").startswith("cuda") else "float32"),
            over,
        )
    )
    md = render(cap, speed, a.pool_gib)
    md += f"\n\nload average start {load0}, end {os.getloadavg()}; {time.time() - t0:.0f} s"
    print(md)
    path = a.json or os.path.join(
        os.path.dirname(__file__), "results", time.strftime("kv-groups-%Y%m%d-%H%M%S.json")
    )
    with open(path, "w") as f:
        json.dump(
            {"capacity": cap, "speed": speed, "loadavg": [load0, os.getloadavg()], "markdown": md},
            f,
            indent=1,
        )
    with open(path[:-5] + ".md", "w") as f:
        f.write(md + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
