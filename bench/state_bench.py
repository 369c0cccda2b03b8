"""python -m bench --state [--pool-gib 16] [--contexts 8192,32768] [--system-tokens 1024]
                          [--rounds 2]

What is not KV (issue 51), side by side in one run:
- capacity: conversations of C tokens that fit at once in the same pool bytes, Qwen3.5-0.8B's text
  model (6 attention layers keep KV, 18 Gated DeltaNet layers one fixed state per chat) against
  Qwen3-0.6B (28 attention layers) and against Qwen3.5-0.8B's own shape with attention in every
  layer; bf16 KV and states (as on a GPU). Measured with the real manager
  (engine/kv/kv_cache_manager.py) and state pool (engine/kv/state_groups.py): each chat is
  admitted, grown to C tokens in 512-token
  chunks and parked (a chat between two turns holds its blocks and its state slot), until the next
  one does not fit; the state slots are carved from the same bytes (as many as the blocks leave
  room for, found by bisection), so the hybrid pays for its states;
- time to first token of a new chat on a shared system prompt, Qwen3.5-0.8B shapes shrunk to
  --ttft-layers layers (keeping one attention layer in four) and a 8,192-token vocabulary, random
  weights, fp32 on CPU: the system prompt is pinned as the app pins one (its prefill keeps a state
  checkpoint at its end), the chat's prompt = the system prompt + its own question; with that
  checkpoint (a prefix hit restores the state with the KV) against the same engine with its
  checkpoints dropped (the KV alone cannot be used: the prompt is computed from zero). Rounds
  alternate between the two engines;
- decode tokens/s of a mixture of experts against its dense equivalent in active parameters:
  Qwen3-30B-A3B's widths (hidden 2048, 8 of --experts experts of 768) against a dense Qwen3 of
  the same hidden size whose MLP is 8 x 768 = 6,144 wide (the same weights read per token), both
  --decode-layers layers, a 8,192-token vocabulary, fp32, the per-layer loop for both (lean step
  off: the MoE has no lean step), batch 1 and --batch; greedy, the prompts prefilled once (prefix
  cache),
  then t(1 + N new tokens) - t(1 new token).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

MIB, GIB = 2**20, 2**30
CHUNK = 512
BF16 = 2


def _cfg(name: str, **over):
    from engine.exec import dummy_weights as dw

    return dw.load_config(name, over)


def shapes() -> dict:
    """name -> (attention layers, linear layers, KV bytes per token per attention layer, state
    bytes per linear layer) at bf16."""
    from engine.exec.models.decoder_spec import describe

    q35, q3 = _cfg("qwen3.5-0.8b"), _cfg("qwen3-0.6b")
    s35 = describe(q35)
    kv35 = 2 * q35.num_key_value_heads * q35.head_dim * BF16
    return {
        "Qwen3.5-0.8B": (
            len(s35.kv_layers),
            len(s35.linear_layers),
            kv35,
            s35.linear.state_bytes(BF16),
        ),
        "Qwen3.5-0.8B, attention in every layer": (q35.num_hidden_layers, 0, kv35, 0),
        "Qwen3-0.6B": (q3.num_hidden_layers, 0, 2 * q3.num_key_value_heads * q3.head_dim * BF16, 0),
    }


def _fits(
    n_chats: int, pool_bytes: int, att: int, lin: int, kv: int, state: int, context: int, bs: int
) -> bool:
    """Do n chats of `context` tokens fit, the real manager and state pool deciding (blocks: what
    the n state slots leave)."""
    from engine.kv.cache_spec import KVCacheLayout
    from engine.kv.kv_cache_manager import KVCacheManager
    from engine.kv.state_groups import StateGroups

    block_bytes, slot_bytes = att * kv * bs, lin * state
    n_blocks = (pool_bytes - n_chats * slot_bytes) // block_bytes
    if n_blocks < 1:
        return False
    states = StateGroups(n_chats + 1, bs, bytes_per_slot=slot_bytes) if lin else None
    m = KVCacheManager(
        int(n_blocks),
        bs,
        max_model_len=context + 1,
        layout=KVCacheLayout.single(att),
        enable_prefix_caching=True,
        states=states,
    )
    for c in range(n_chats):
        sid, toks = f"c{c}", [c % 50000 + 1] * context
        if m.try_add_sequence(sid, toks, num_new_tokens=CHUNK, session_id=None) is None:
            return False
        while m.num_computed(sid) < context:
            if not m.try_allocate_slots(sid, min(CHUNK, context - m.num_computed(sid))):
                return False
        m.park(sid, f"chat{c}")
        if len(m.parked.owners()) != c + 1:  # parking released an earlier chat: it did not fit
            return False
    return True


def capacity(pool_gib: float, contexts: list[int], bs: int = 16) -> list[dict]:
    from engine.observe.state_memory import state_arithmetic

    pool = int(pool_gib * GIB)
    rows = []
    for name, (att, lin, kv, state) in shapes().items():
        for ctx in contexts:
            per_chat = state_arithmetic(
                attention_layers=att,
                linear_layers=lin,
                kv_bytes_per_token_layer=kv,
                state_bytes_per_layer=state,
                context_tokens=ctx,
            )["bytes"]
            hi = pool // per_chat + 1  # the arithmetic's bound; the manager decides below it
            lo = 0
            t0 = time.perf_counter()
            while lo < hi:  # the largest n that fits
                mid = (lo + hi + 1) // 2
                if _fits(mid, pool, att, lin, kv, state, ctx, bs):
                    lo = mid
                else:
                    hi = mid - 1
            rows.append(
                {
                    "model": name,
                    "context": ctx,
                    "chats": lo,
                    "bytes_per_chat": per_chat,
                    "seconds": round(time.perf_counter() - t0, 2),
                }
            )
    return rows


def checkpoints(
    users: int = 8,
    turns: int = 6,
    system: int = 600,
    bs: int = 16,
    slots: int = 64,
    regenerate_every: int = 3,
) -> list[dict]:
    """Which boundaries to keep, memory vs hits: the real manager and state pool (no model) serve
    `users` chats of `turns` turns on one shared `system`-token prompt (each turn: the previous
    turn's tokens + a 60-token reply + a 40-token question; every `regenerate_every`-th turn is
    asked again, the reply dropped: its common prefix with the parked turn ends before the parked
    state).
    Policies: a checkpoint at each prompt's last block boundary (the engine's) vs none (only the
    parked state's exact end serves a hit). Returns prompt tokens served from the cache and the
    checkpoint slots held at the end (bytes: x the state bytes per slot)."""
    import random
    from engine.kv.cache_spec import KVCacheLayout
    from engine.kv.kv_cache_manager import KVCacheManager
    from engine.kv.state_groups import StateGroups

    out = []
    for policy in ("prompt end", "none"):
        rng = random.Random(2)
        st = StateGroups(slots, bs)
        st.take_checkpoints = policy != "none"
        m = KVCacheManager(4096, bs, max_model_len=8192, layout=KVCacheLayout.single(6), states=st)
        sys_ids = [rng.randrange(3, 50000) for _ in range(system)]
        hist = {u: list(sys_ids) for u in range(users)}
        n = queries = 0
        for turn in range(turns):
            for u in range(users):
                again = turn and turn % regenerate_every == 0
                prompt = (
                    hist[u] if again else hist[u] + [rng.randrange(3, 50000) for _ in range(40)]
                )
                sid = f"r{n}"
                n += 1
                m.add_sequence(sid, prompt, num_new_tokens=CHUNK, session_id=f"u{u}")
                while m.num_computed(sid) < len(prompt):  # chunks as the scheduler cuts them
                    nc = m.num_computed(sid)
                    m.allocate_slots(sid, m.chunk_end(sid, nc, min(CHUNK, len(prompt) - nc)))
                    m.take_state_copies()  # the step's copies (a checkpoint after it)
                reply = [rng.randrange(3, 50000) for _ in range(60)]
                toks = prompt + reply
                m._get(sid).tokens = toks  # the reply's tokens, one step each
                for _ in reply[:-1]:
                    m.allocate_slots(sid, 1)
                    m.take_state_copies()
                m.park(sid, f"u{u}")
                queries += len(prompt)
                hist[u] = toks[:-1] if not again else hist[u]
        out.append(
            {
                "policy": policy,
                "prompt_tokens": queries,
                "served_from_cache": m.prefix_cache_hits,
                "checkpoint_slots": len(st.checkpoints),
                "checkpoint_hits": st.checkpoint_hits,
            }
        )
    return out


def _llm(model: str, over: dict, serving: bool = False, **kw):
    from engine import LLM
    from engine.front.serving import ServingLLM

    return (ServingLLM if serving else LLM)(
        model=model,
        load_format="dummy",
        hf_overrides=over,
        seed=0,
        device="cpu",
        dtype="float32",
        **kw,
    )


def _ttft(llm, prompt: list[int]) -> float:
    from engine import SamplingParams

    t0 = time.perf_counter()
    llm.generate(
        [{"prompt_token_ids": prompt}],
        SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True),
    )
    return time.perf_counter() - t0


def ttft(system_tokens: int, layers: int, rounds: int) -> dict:
    """A new chat's TTFT on a shared, pinned system prompt (as the app pins them: the pin's prefill
    keeps a state checkpoint at its end): with that checkpoint vs the same engine with its
    checkpoints dropped (module docstring)."""
    import random

    rng = random.Random(0)
    over = dict(
        num_hidden_layers=layers,
        vocab_size=8192,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
    )
    system = [rng.randrange(3, 8192) for _ in range(system_tokens // 16 * 16)]
    out = {"hit": [], "none": [], "system_tokens": len(system), "layers": layers}
    engines = {
        k: _llm(
            "qwen3.5-0.8b",
            over,
            serving=True,
            num_blocks=-(-(system_tokens + 256) // 16) * 8,
            max_model_len=4096,
            max_pin_fraction=0.5,
        )
        for k in ("hit", "none")
    }
    drop = lambda eng: [eng.kv.states.drop(k) for k in list(eng.kv.states.checkpoints)]  # noqa: E731
    try:
        for r in range(rounds):
            for kind in ("hit", "none") if r % 2 == 0 else ("none", "hit"):
                llm = engines[kind]
                if kind == "hit" or r == 0:
                    llm.pin_prefix("system", system)  # prefilled once, its checkpoint kept
                if kind == "none":
                    llm.run_on_engine(drop)
                chat = system + [rng.randrange(3, 8192) for _ in range(40)]
                before = llm.stats()["prompt_tokens_computed_total"]
                t = _ttft(llm, chat)
                out[kind].append(
                    {
                        "ttft_s": round(t, 3),
                        "tokens_computed": llm.stats()["prompt_tokens_computed_total"] - before,
                    }
                )
        out["checkpoint_hits"] = engines["hit"].stats()["state_groups"]["state_checkpoint_hits"]
    finally:
        for e in engines.values():
            e.shutdown()
    return out


def decode(batch: int, layers: int, experts: int, new_tokens: int, rounds: int) -> dict:
    """MoE vs its dense equivalent in active parameters (module docstring)."""
    import random

    from engine import SamplingParams

    rng = random.Random(1)
    moe_over = dict(num_hidden_layers=layers, vocab_size=8192, num_experts=experts)
    dense_over = dict(
        num_hidden_layers=layers,
        vocab_size=8192,
        hidden_size=2048,
        intermediate_size=8 * 768,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
    )
    specs = {"moe": ("qwen3-30b-a3b", moe_over), "dense": ("qwen3-0.6b", dense_over)}
    res: dict = {k: {} for k in specs}
    for kind, (name, over) in specs.items():  # one engine alive at a time (memory)
        llm = _llm(
            name,
            over,
            num_blocks=256,
            max_model_len=1024,
            lean_step="off",
            max_num_seqs=max(8, batch),
        )
        try:
            info = llm.model_info()
            res[kind]["weights_read_per_token_mib"] = round(
                info.weights_read_per_token_bytes / MIB, 1
            )
            res[kind]["weights_mib"] = round(info.weights_bytes / MIB, 1)
            for b in (1, batch):
                prompts = [
                    {"prompt_token_ids": [rng.randrange(3, 8192) for _ in range(64)]}
                    for _ in range(b)
                ]
                llm.generate(
                    prompts, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
                )  # cached
                runs = []
                for _ in range(rounds):
                    t1 = time.perf_counter()
                    llm.generate(
                        prompts, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
                    )
                    t1 = time.perf_counter() - t1
                    tn = time.perf_counter()
                    llm.generate(
                        prompts,
                        SamplingParams(temperature=0.0, max_tokens=1 + new_tokens, ignore_eos=True),
                    )
                    tn = time.perf_counter() - tn
                    runs.append(b * new_tokens / max(1e-9, tn - t1))
                res[kind][f"batch{b}_tok_s"] = round(statistics.median(runs), 1)
        finally:
            llm.shutdown()
    return res


def render(cap, tt, dec, pool_gib) -> str:
    lines = [
        f"### Memory that is not KV (python -m bench --state), pool {pool_gib:g} GiB, bf16",
        "",
        "| model | context | chats that fit | bytes per chat |",
        "|---|---:|---:|---:|",
    ]
    for r in cap:
        lines.append(
            f"| {r['model']} | {r['context']:,} | {r['chats']:,} | "
            f"{r['bytes_per_chat'] / MIB:,.0f} MiB |"
        )
    if tt:
        h = statistics.median(x["ttft_s"] for x in tt["hit"])
        n = statistics.median(x["ttft_s"] for x in tt["none"])
        lines += [
            "",
            f"A new chat on a shared, pinned {tt['system_tokens']:,}-token system prompt "
            f"(Qwen3.5-0.8B shapes, "
            f"{tt['layers']} layers, fp32 CPU): TTFT {h:.2f} s with the state checkpoint "
            f"({tt['hit'][0]['tokens_computed']} tokens computed) vs {n:.2f} s without "
            f"({tt['none'][0]['tokens_computed']} computed): {n / h:.1f}x",
        ]
    if dec:
        m, d = dec["moe"], dec["dense"]
        lines += [
            "",
            "| decode, fp32 CPU, per-layer loop | weights read per token | batch 1 tok/s | "
            f"batch {next(k for k in m if k.startswith('batch') and k != 'batch1_tok_s')[5:-6]} "
            "tok/s |",
            "|---|---:|---:|---:|",
        ]
        for name, r in (("MoE (Qwen3-30B-A3B widths)", m), ("dense, same active parameters", d)):
            vals = [v for k, v in r.items() if k.endswith("tok_s")]
            lines.append(
                f"| {name} | {r['weights_read_per_token_mib']:,} MiB of {r['weights_mib']:,} MiB | "
                f"{vals[0]} | {vals[-1]} |"
            )
    return "\n".join(lines)


def render_checkpoints(rows) -> str:
    lines = [
        "| checkpoints kept | prompt tokens | served from the cache | checkpoint slots held "
        "| checkpoint hits |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['policy']} | {r['prompt_tokens']:,} | {r['served_from_cache']:,} "
            f"({r['served_from_cache'] / r['prompt_tokens']:.0%}) | {r['checkpoint_slots']} | "
            f"{r['checkpoint_hits']} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench --state")
    p.add_argument("--pool-gib", type=float, default=16.0)
    p.add_argument("--contexts", default="8192,32768")
    p.add_argument("--system-tokens", type=int, default=1024)
    p.add_argument("--ttft-layers", type=int, default=8)
    p.add_argument("--decode-layers", type=int, default=2)
    p.add_argument(
        "--experts",
        type=int,
        default=64,
        help="Qwen3-30B-A3B has 128; fewer keep fp32 weights small",
    )
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--no-models", action="store_true", help="capacity only")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    load0, t0 = os.getloadavg(), time.time()
    cap = capacity(a.pool_gib, [int(x) for x in a.contexts.split(",")])
    tt = None if a.no_models else ttft(a.system_tokens, a.ttft_layers, a.rounds)
    dec = (
        None if a.no_models else decode(a.batch, a.decode_layers, a.experts, a.new_tokens, a.rounds)
    )
    ck = checkpoints()
    md = render(cap, tt, dec, a.pool_gib) + "\n\n" + render_checkpoints(ck)
    md += f"\n\nload average start {load0}, end {os.getloadavg()}; {time.time() - t0:.0f} s"
    print(md)
    path = a.json or os.path.join(
        os.path.dirname(__file__), "results", time.strftime("state-%Y%m%d-%H%M%S.json")
    )
    with open(path, "w") as f:
        json.dump(
            {
                "capacity": cap,
                "ttft": tt,
                "decode": dec,
                "checkpoints": ck,
                "loadavg": [load0, os.getloadavg()],
                "markdown": md,
            },
            f,
            indent=1,
        )
    with open(path[:-5] + ".md", "w") as f:
        f.write(md + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
