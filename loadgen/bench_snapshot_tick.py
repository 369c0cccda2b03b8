"""Per-tick cost of the Memory tab at GPU pool size, manager only (no model): the engine-thread
part (kv_snapshot), the caller's part (to_json), the dashboard render of one tick, the grid
model + payload alone, and the bytes a tick sends, for a 350k-block pool (an H200's worth of
SmolLM2 KV) and for a 3,000-block one.

--ticks N also replays N one-second ticks of a chat load (--users conversations sharing a pinned
34-block prompt, each decoding a few tokens per second, one finishing and a new one starting now
and then) through the real tick function of build_dashboard, and reports what each tick sends:
the JSON of every output that changed (Gradio's postprocess of that component), unchanged ones
being skipped. The browser-side total (SSE bytes per tick) is measured by
loadgen/bench_dashboard_browser.py.

    .venv/bin/python -m loadgen.bench_snapshot_tick [--blocks 350000 3000] [--seqs 256] [--repeat 3]
    .venv/bin/python -m loadgen.bench_snapshot_tick --blocks 3000 --ticks 60 --users 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


class _SnapLLM:
    """Just what the dashboard reads from an engine: a snapshot and the model's shape."""

    kind = "local"  # engine.protocol.ChatEngine.kind: not a remote backend

    def __init__(self, snap):
        self.snap = snap

    def latest_snapshot(self):
        return self.snap

    def model_info(self):
        from types import SimpleNamespace

        return SimpleNamespace(
            name="SmolLM2-135M",
            num_layers=30,
            num_attention_heads=9,
            num_kv_heads=3,
            head_dim=64,
            dtype="float32",
            max_model_len=32768,
            max_num_seqs=256,
        )


def _fill(m, blocks: int, seqs: int):
    per_seq = min(32768, blocks * 16 * 3 // 4 // seqs)
    shared = list(range(1, 1 + 512))  # a shared 32-block system prompt
    for i in range(seqs):
        ids = shared + [100_000 + i * per_seq + j for j in range(per_seq - len(shared))]
        m.add_sequence(i, ids, num_new_tokens=len(ids), session_id=f"s{i}")


def measure(blocks: int, seqs: int, repeat: int) -> dict:
    from engine.kv.kv_cache_manager import KVCacheManager
    from engine.observe.kv_snapshot import take_snapshot
    from ui.dashboard import page as D

    m = KVCacheManager(blocks, 16, max_model_len=32768, kv_bytes_per_token=46080)
    _fill(m, blocks, seqs)
    from ui.dashboard.grid_payload import grid_payload

    snap_t, json_t, render_t, grid_t, sizes = [], [], [], [], []
    for k in range(repeat):
        t0 = time.perf_counter()
        snap = take_snapshot(m)
        t1 = time.perf_counter()
        d = snap.to_json()
        d["time"] = 1000.0 + k
        t2 = time.perf_counter()
        st = d["stats"]
        st["max_model_len"] = 32768
        state = D.DashboardState(_SnapLLM(d))
        t3 = time.perf_counter()
        v = state.view(d, None, None)
        t4 = time.perf_counter()
        snap_t.append(t1 - t0)
        json_t.append(t2 - t1)
        render_t.append(t4 - t3)
        t5 = time.perf_counter()
        grid_payload(d)
        t6 = time.perf_counter()
        grid_t.append(t6 - t5)
        sizes.append({k2: len(v[k2]) for k2 in ("story", "headline", "grid", "tables")})
    med = lambda xs: round(1000 * statistics.median(xs), 1)  # noqa: E731
    return {
        "blocks": blocks,
        "sequences": seqs,
        "used_blocks": m.num_used_blocks,
        "engine_thread_kv_snapshot_ms": med(snap_t),
        "to_json_ms": med(json_t),
        "dashboard_render_ms": med(render_t),
        "grid_model_and_payload_ms": med(grid_t),
        "bytes": sizes[-1],
    }


def _tick_fns(llm):
    """The dashboard's own fast (1 s, one bus output) and slow (2 s: plots, picker, demo status)
    tick functions, and the slow tick's output components, from a built Blocks."""
    import gradio as gr
    from ui.dashboard import page as D
    from ui.dashboard import ticks as T

    with gr.Blocks() as demo:
        timer = D.build_dashboard(llm)
    D.state_for(llm).sampler.stop()  # the replay feeds history itself, one tick per step
    cfg = demo.get_config_file()
    slow_dep = next(
        d
        for d in cfg["dependencies"]
        if any(t[1] == "tick" for t in d["targets"]) and len(d["outputs"]) == len(T.SLOW)
    )
    return (
        timer.tick_fns["fast"],
        timer.tick_fns["slow"],
        [demo.blocks[i] for i in slow_dep["outputs"]],
    )


def _wire_bytes(value, comp) -> int:
    """Bytes of one output in Gradio's message: gr.skip() is a tiny update, the rest is postprocessed."""
    from gradio.components import Component
    from pydantic import BaseModel

    if isinstance(value, dict) and value.get("__type__") == "update":
        rest = {k: v for k, v in value.items() if k != "__type__"}
        if not rest:
            return len(json.dumps(value))
        value = rest.get("value", rest)
        if not isinstance(comp, Component) or "choices" in rest:
            return len(json.dumps(rest, default=str))
    if not isinstance(comp, Component):
        return len(json.dumps(value, default=str))
    out = comp.postprocess(value)
    if isinstance(out, BaseModel):  # Gradio's data models
        out = out.model_dump()
    return len(json.dumps(out, default=str))


def measure_ticks(blocks: int, users: int, ticks: int, seed: int = 0) -> dict:
    """Replay `ticks` one-second ticks of a chat load; bytes sent per tick (see module doc)."""
    import random
    from engine.observe.kv_snapshot import take_snapshot
    from engine.kv.kv_cache_manager import KVCacheManager
    from ui.dashboard import page as D
    from ui.dashboard import ticks as T

    rng = random.Random(seed)
    m = KVCacheManager(blocks, 16, max_model_len=4096, kv_bytes_per_token=46080)
    prompt = list(range(1, 34 * 16 + 1))  # the pinned ~550-token policy: 34 blocks
    m.add_sequence("pin#0", prompt, num_new_tokens=len(prompt))
    live, k = {}, 0

    def start():
        nonlocal k
        k += 1
        ids = prompt + [1_000_000 + 10_000 * k + j for j in range(rng.randint(20, 60))]
        m.add_sequence(f"demo-{k}#0", ids, num_new_tokens=len(ids), session_id=f"demo-1-{k}")
        live[f"demo-{k}#0"] = len(ids)

    for _ in range(users):
        start()
    llm = _SnapLLM(None)
    fast, slow, slow_comps = _tick_fns(llm)
    per_tick, by_output = [], {}
    for t in range(ticks):
        for sid in list(live):
            n = rng.randint(1, 4)  # ~40 tok/s over 16 users on this CPU
            if live[sid] + n > 700 or rng.random() < 0.01:
                m.free(sid)
                del live[sid]
                start()
                continue
            m.allocate_slots(sid, n)
            live[sid] += n
        d = take_snapshot(m).to_json()
        d["time"] = 10_000.0 + t
        d["stats"]["max_model_len"] = 4096
        d["pins"] = [{"name": "shared", "num_tokens": len(prompt), "block_table": list(range(34))}]
        llm.snap = d
        bus = fast(None, D.LIVE, ())  # accordions closed, as the page opens
        sizes = {"bus": len(json.dumps(bus)) if isinstance(bus, str) else _wire_bytes(bus, None)}
        for name, panel in json.loads(bus).items() if isinstance(bus, str) else ():
            sizes[name] = len(json.dumps(panel))
        if t % 2 == 0:  # the slow timer: every 2 s
            for name, v, c in zip(T.SLOW, slow(None, D.LIVE), slow_comps):
                sizes[name] = _wire_bytes(v, c)
        per_tick.append(sizes["bus"] + sum(v for k, v in sizes.items() if k in T.SLOW))
        for name, b in sizes.items():
            by_output.setdefault(name, []).append(b)
    steady = per_tick[1:]  # the first tick sends everything
    return {
        "blocks": blocks,
        "users": users,
        "ticks": ticks,
        "first_tick_bytes": per_tick[0],
        "tick_bytes_median": int(statistics.median(steady)),
        "tick_bytes_max": max(steady),
        "by_output_median": {k2: int(statistics.median(v[1:] or v)) for k2, v in by_output.items()},
        "by_output_max": {k2: max(v[1:] or v) for k2, v in by_output.items()},
    }


def measure_grid_synthetic(blocks: int, seqs: int, repeat: int) -> dict:
    """Grid model + payload + JSON alone, on a synthetic snapshot (no manager, no to_json): what the
    dashboard itself adds per snapshot, whatever the engine's snapshot costs. 256 sequences of
    equal length sharing a 32-block prompt fill ~73% of the pool, 6% cached-free, the rest free."""
    import random
    from ui.dashboard.grid_payload import grid_payload, with_highlight

    used = blocks * 73 // 100
    per = max(1, (used - 32) // seqs)
    states = ["pinned"] * 32 + ["used"] * (used - 32) + ["cached"] * (blocks * 6 // 100)
    states += ["free"] * (blocks - len(states))
    refs = [seqs + 1] * 32 + [1] * (used - 32) + [0] * (blocks - used)
    filled = [16] * (used + blocks * 6 // 100) + [0] * (blocks - used - blocks * 6 // 100)
    order = list(range(32, used))
    random.Random(0).shuffle(order)  # tables scattered block by block: the worst case for runs
    seq = [
        {
            "seq_id": f"r{i}#0",
            "session_id": f"s{i}",
            "title": f"chat {i}",
            "state": "running",
            "block_table": list(range(32)) + order[i * per : (i + 1) * per],
        }
        for i in range(seqs)
    ]
    snap = {
        "block_size": 16,
        "blocks": {"state": states, "ref_count": refs, "filled": filled},
        "sequences": seq,
        "pins": [{"name": "shared", "num_tokens": 512, "block_table": list(range(32))}],
    }
    times, size = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        size = len(with_highlight(grid_payload(snap), seq[0]["block_table"]))
        times.append(time.perf_counter() - t0)
    return {
        "synthetic_blocks": blocks,
        "sequences": seqs,
        "grid_model_payload_json_ms": round(1000 * statistics.median(times), 1),
        "grid_bytes": size,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, nargs="+", default=[350_000, 3_000])
    p.add_argument("--seqs", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--ticks", type=int, default=0, help="also replay this many ticks of chat load")
    p.add_argument("--users", type=int, default=16)
    a = p.parse_args(argv)
    for b in a.blocks:
        print(json.dumps(measure_grid_synthetic(b, min(a.seqs, max(1, b // 64)), a.repeat)))
        print(json.dumps(measure(b, min(a.seqs, max(1, b // 64)), a.repeat)))
        if a.ticks:
            print(json.dumps(measure_ticks(b, a.users, a.ticks)))


if __name__ == "__main__":
    main()
