"""Gradio glue and demo load without a model: one render per snapshot for N viewers, tick
settings, every block of a 3,000-block pool in the payload, and the simulated users' start/stop
lifecycle. (The render's time is a benchmark: `python -m loadgen.bench_snapshot_tick --blocks 3000`.)"""

import dataclasses
import json
import threading
import time
from types import SimpleNamespace

import gradio as gr

from tests.ui.fake_engine import INFO, FakeLLM
from ui.dashboard import page as D
from ui.dashboard import ticks as T
from tests.ui.snapshots import busy_snapshot
from ui.dashboard.grid_payload import decode_runs, highlight_ranges
from ui.dashboard.demo_users import DEFAULT_SYSTEM_PROMPT, DemoLoad

SMOL_CFG = SimpleNamespace(
    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576, head_dim=64
)


def SnapLLM(snap):
    """The one fake engine, serving a fixed snapshot, with the live model's 8k context."""
    return FakeLLM(snapshot=snap, info=dataclasses.replace(INFO, max_model_len=8192))


def test_n_viewers_share_one_render_per_snapshot(monkeypatch):
    snap = busy_snapshot(t=1000.0)
    state = D.DashboardState(SnapLLM(snap))
    calls = []
    real = D.render_base
    monkeypatch.setattr(D, "render_base", lambda *a: calls.append(1) or real(*a))
    views = []
    threads = [
        threading.Thread(target=lambda: views.append(state.view(snap, None, None)))
        for _ in range(16)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and all(v is views[0] for v in views)
    assert len(state.history.snapshot()) == 1
    sel = state.view(snap, "user-1", None)
    assert sel is state.view(snap, "user-1", None) and len(calls) == 1
    table = next(x["block_table"] for x in snap["sequences"] if x["session_id"] == "user-1")
    assert json.loads(views[0]["grid"])["hl"] == []
    assert json.loads(sel["grid"])["hl"] == highlight_ranges(table) != []
    assert "Block table of user-1" in sel["tables"]
    assert "Llama-3-70B at" in state.view(snap, None, "Llama-3-70B")["arith"]
    newer = dict(snap, time=1001.0)
    state.view(newer, None, None)
    assert len(calls) == 2 and len(state.history.snapshot()) == 2


def test_tick_renders_3000_blocks_every_block_in_the_payload():
    """Each new snapshot of a 3,000-block pool is rendered once: every block reaches the payload in
    order, the selected chat's table is highlighted, the chart history gains one point."""
    state = D.DashboardState(SnapLLM(None))
    for i in range(3):
        snap = busy_snapshot(num_blocks=3000, users=32, t=2000.0 + i, seed=i)
        v = state.view(snap, "user-3", None)
        grid = json.loads(v["grid"])
        cells = decode_runs(grid)
        assert len(cells["ref"]) == 3000
        assert cells["ref"].tolist() == snap["blocks"]["ref_count"]  # every block, in order
        table = next(x["block_table"] for x in snap["sequences"] if x["session_id"] == "user-3")
        assert grid["hl"] == highlight_ranges(table) != []
        assert "Block table of user-3" in v["tables"]
        assert len(state.history.snapshot()) == i + 1


def test_build_dashboard_wires_a_non_queuing_timer():
    llm = SnapLLM(busy_snapshot(t=3000.0))
    with gr.Blocks() as demo:
        with gr.Tab("Memory"):
            timer = D.build_dashboard(llm, lambda: "You are a test.")
    assert D.state_for(llm).demo._prompt() == "You are a test."
    cfg = demo.get_config_file()
    timers = [c for c in cfg["components"] if c["type"] == "timer"]
    assert sorted(t["props"]["value"] for t in timers) == [D.TICK_S, D.SLOW_TICK_S]
    assert len(timer.timers) == 2 and all(not t["props"]["active"] for t in timers)
    assert timer.refresh["fn"] and timer.refresh_slow["fn"] and timer.select_own["outputs"]
    ticks = [d for d in cfg["dependencies"] if any(t[1] == "tick" for t in d["targets"])]
    assert len(ticks) == 2
    by_id = {c["id"]: c for c in cfg["components"]}
    fast_dep = next(
        d for d in ticks if [by_id[o]["props"].get("elem_id") for o in d["outputs"]] == ["kv-bus"]
    )
    for d in ticks:
        fn = demo.fns[d["id"]]
        assert fn.concurrency_limit is None and fn.show_progress == "hidden"
    # the fast tick has ONE output (the bus): a message with the changed panels and, always, the
    # time of the snapshot they show (the page's "as of ... ago"): only that when nothing changed
    fast = demo.fns[fast_dep["id"]].fn
    first = json.loads(fast(None, D.LIVE, None))
    assert set(first) == {
        "kv-story",
        "kv-headline",
        "kv-grid",
        "kv-tables",
        "kv-feed",
        "kv-arith",
        "kv-whatif",
        "kv-who",
        "kv-tier",
        "kv-demo-status",
        "kv-asof",
    }
    assert first["kv-asof"]["snap"] == 3000.0 and first["kv-asof"]["at"] >= first["kv-asof"]["snap"]
    assert '"runs":' in first["kv-grid"] and "All live block tables" in first["kv-tables"]
    again = json.loads(fast(None, D.LIVE, None))
    assert set(again) == {"kv-asof"} and again["kv-asof"]["snap"] == 3000.0
    fresh = json.loads(
        timer.tick_fns["fast"](None, D.LIVE, None, fresh=True)
    )  # tab shown again: all
    assert {k: v for k, v in fresh.items() if k != "kv-asof"} == {
        k: v for k, v in first.items() if k != "kv-asof"
    }
    slow = timer.tick_fns["slow"](None, D.LIVE)
    assert len(slow) == len(T.SLOW) and "choices" in slow[T.SLOW.index("selector")]

    def down():
        raise RuntimeError("the engine has been shut down")

    llm.latest_snapshot = down  # a tick after shutdown: no error toast
    assert json.loads(fast(None, D.LIVE, None)) == {
        "kv-demo-status": "Engine unavailable: the engine has been shut down"
    }


def FakeChatLLM(tokens=5):
    """The one fake engine: replies of `tokens` words "w0 w1 ...", a word every 10 ms."""
    return FakeLLM(words=[f"w{i} " for i in range(tokens)], pause_s=0.01)


def _submits(llm):
    """(session, messages, params) of every submit, in order."""
    return [(sid, msgs, p) for msgs, p, sid in llm.submitted]


def test_demo_users_chat_multi_turn_then_stop_ends_every_session():
    llm = FakeChatLLM()
    prompt = {"text": "Shared prompt v1"}
    demo = DemoLoad(llm, lambda: prompt["text"], think_s=(0.0, 0.01), max_tokens=48)
    assert demo.start(3) == 3
    deadline = time.time() + 10
    while time.time() < deadline and demo.turns < 9:
        time.sleep(0.02)
    assert demo.running_users() == 3 and "3 simulated users chatting" in demo.status()
    sids = {s for s, _, _ in _submits(llm)}
    assert len(sids) == 3 and all(s.startswith("demo-1-") for s in sids)
    for sid in sids:
        turns = [m for s, m, _ in _submits(llm) if s == sid]
        assert turns[0][0] == {"role": "system", "content": "Shared prompt v1"}
        assert len(turns[1]) == len(turns[0]) + 2 and turns[1][-2]["role"] == "assistant"
        assert turns[1][-2]["content"].startswith("w0 w1")
    assert all(p.max_tokens == 48 and p.seed is not None for _, _, p in _submits(llm))
    assert demo.stop() == 3
    assert demo.running_users() == 0 and sorted(set(llm.ended)) == sorted(sids)
    assert "stopped" in demo.status()
    n = len(_submits(llm))
    time.sleep(0.1)
    assert len(_submits(llm)) == n  # nobody submits after stop
    demo.start(2)  # a new run, new sessions
    demo.stop()
    assert {s for s, _, _ in _submits(llm)[n:]} <= {"demo-2-3", "demo-2-4"}


def test_stop_aborts_in_flight_replies():
    llm = FakeChatLLM(tokens=10_000)  # replies that never end alone
    demo = DemoLoad(llm, None)
    demo.start(2)
    deadline = time.time() + 5
    while time.time() < deadline and len(_submits(llm)) < 2:
        time.sleep(0.01)
    t0 = time.time()
    assert demo.stop(timeout=10) == 2
    assert time.time() - t0 < 5 and demo.running_users() == 0
    assert len(llm.aborted) == 2 and len(set(llm.ended)) == 2
    assert _submits(llm)[0][1][0]["content"] == DEFAULT_SYSTEM_PROMPT


def test_closed_panels_send_nothing_until_opened():
    llm = SnapLLM(busy_snapshot(t=3100.0))
    with gr.Blocks():
        timer = D.build_dashboard(llm)
    D.state_for(llm).sampler.stop()
    fast = timer.tick_fns["fast"]
    closed = json.loads(fast(None, D.LIVE, ()))
    assert "kv-arith" not in closed and "kv-whatif" not in closed and "kv-grid" in closed
    opened = json.loads(fast(None, D.LIVE, ("arith",)))  # opening sends it, once
    assert set(opened) == {"kv-arith", "kv-asof"} and "KV bytes per token" in opened["kv-arith"]
    again = json.loads(fast(None, D.LIVE, ("arith",)))
    assert set(again) == {"kv-asof"}


def test_bus_message_names_the_panels_by_element_id():
    from ui.dashboard import bus

    msg = json.loads(bus.message({"story": "<b>s</b>", "grid": '{"n":1}'}))
    assert msg == {"kv-story": "<b>s</b>", "kv-grid": '{"n":1}'}
    stamped = json.loads(bus.message({}, snap_time=5.0, now=5.5, slow_time=4.0))
    assert stamped == {"kv-asof": {"snap": 5.0, "at": 5.5, "slow": 4.0}}
    assert set(bus.PANELS) == set(T.FAST) and set(T.FAST) | set(T.SLOW) == set(T.OUTPUT_NAMES)


def test_block_plots_get_a_y_axis_above_their_highest_point():
    # Gradio's LinePlot ends its y axis at the data's maximum: that line would lie on the plot's
    # edge, half clipped. The slow tick sends each block plot with a y_lim above its highest point.
    from ui.dashboard.history import Sample

    state = D.DashboardState(SnapLLM(busy_snapshot(t=5000.0)))
    for k in range(8):  # samples over 80 s: several complete 10 s buckets
        state.history.add_sample(Sample(4920.0 + 10 * k, 0, 0, 0, 100 + k, 200 + k, 1000 + k, 1024))
    slow = T.Ticks(state).slow(None, D.LIVE, fresh=True)
    for name in T.BLOCK_PLOTS:
        update = slow[T.SLOW.index(name)]
        top = update["value"]["blocks"].max()
        assert top >= 200, (name, top)
        assert update["y_lim"][0] == 0 and update["y_lim"][1] >= top * 1.05, (
            name,
            update["y_lim"],
            top,
        )
