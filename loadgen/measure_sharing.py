"""Measure what sharing saves with N demo users on the default shared prompt (README figure), and
what a dashboard tick costs on the wire with them running.

    .venv/bin/python -m loadgen.measure_sharing [--users 16] [--seconds 60] [--num-blocks N]

Starts the real engine with the default model, pins the default shared prompt (as the app does at
start-up), starts N demo users (ui/dashboard/demo_users.py) and samples the engine's stats every second:
"saved by sharing" = 1 - used blocks / blocks paging without sharing would hold
(KVStats.savings_vs_unshared). Also renders the Memory tab's tick for each sample and reports the
bytes it would send (only outputs that changed since the previous tick, as the page does).
Prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import pandas as pd


def _tick_bytes(values: list) -> int:
    out = 0
    for v in values:
        if isinstance(v, pd.DataFrame):
            out += len(v.to_json(orient="split"))
        elif isinstance(v, dict) and v.get("__type__") == "update" and len(v) == 1:
            out += 24  # a skipped output
        else:
            out += len(json.dumps(v, default=str))
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--users", type=int, default=16)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--num-blocks", type=int, default=None)
    a = p.parse_args(argv)
    import gradio as gr

    from engine import ServingLLM
    from ui.dashboard.demo_users import DEFAULT_SYSTEM_PROMPT, DemoLoad
    from ui.dashboard import page as D

    llm = ServingLLM(num_blocks=a.num_blocks)
    try:
        pin = llm.pin_system_prompt("shared", DEFAULT_SYSTEM_PROMPT)
        with gr.Blocks() as demo:
            D.build_dashboard(llm, DEFAULT_SYSTEM_PROMPT)
        tick = next(
            demo.fns[d["id"]].fn
            for d in demo.get_config_file()["dependencies"]
            if any(t[1] == "tick" for t in d["targets"])
        )
        load = DemoLoad(llm, DEFAULT_SYSTEM_PROMPT)
        load.start(a.users)
        samples, sizes, last = [], [], {}
        t_end = time.time() + a.seconds
        while time.time() < t_end:
            time.sleep(1.0)
            st = llm.stats()
            if st["num_sequences"] + st["num_idle_sessions"] >= a.users // 2:
                samples.append(st)
            out = tick(None, D.LIVE, last)
            last = out[-1]
            sizes.append(_tick_bytes(list(out[:-1])))
        load.stop()
        saved = [s["savings_vs_unshared"] for s in samples]
        last_st = samples[-1] if samples else llm.stats()
        result = {
            "users": a.users,
            "seconds": a.seconds,
            "pool_blocks": last_st["total_blocks"],
            "pinned_blocks": pin.num_blocks,
            "pinned_tokens": pin.num_tokens,
            "saved_by_sharing_median": statistics.median(saved) if saved else None,
            "saved_by_sharing_min": min(saved) if saved else None,
            "last_used_blocks": last_st["used_blocks"],
            "last_unshared_blocks": last_st["logical_blocks"],
            "last_chats": last_st["num_sequences"] + last_st["num_idle_sessions"],
            "tick_bytes_median": statistics.median(sizes[1:]) if len(sizes) > 1 else None,
            "tick_bytes_max_after_first": max(sizes[1:]) if len(sizes) > 1 else None,
            "tick_bytes_first": sizes[0] if sizes else None,
            "turns": load.turns,
        }
        print(json.dumps(result))
        return result
    finally:
        llm.shutdown()


if __name__ == "__main__":
    main()
