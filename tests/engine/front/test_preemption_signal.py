"""A request's own stream says when the engine preempts it and when it runs again, and where it
waits in the queue: what the chat's "paused: memory full, resuming…" and "queued, position k"
lines are built from (engine/outputs.py STATE_*, LLM.queue_position). Real model, real pool."""

import time

from engine import SamplingParams
from engine.outputs import STATE_PREEMPTED, STATE_RESUMED, is_state_only

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
PROMPTS = ["Tell me a story about a dragon.", "Describe the sea at night.", "List some colours."]


def _states(deltas):
    return [d.metrics.get("state") for d in deltas]


def test_preempted_stream_gets_preempted_then_resumed_events(make_llm):
    # 6 blocks of 16 tokens for three requests of ~8 + 40 tokens each (~9 blocks of demand): all
    # three are admitted, then grow until the pool runs out and the newest are preempted.
    llm = make_llm(num_blocks=6, max_model_len=96, max_num_seqs=3)
    streams = [llm.submit(p, GREEDY) for p in PROMPTS]
    deltas = {s.request_id: list(s) for s in streams}
    log = llm.snapshot()["preemption_events"]
    assert log, "the pool was meant to force a preemption"
    for rid, ds in deltas.items():
        st = _states(ds)
        logged = sum(1 for e in log if e["request_id"] == rid)
        assert st.count(STATE_PREEMPTED) == logged, (
            rid,
            st,
        )  # one event per preemption, to its own stream
        assert st.count(STATE_RESUMED) == logged  # and each one resumed (all finished)
        for k, d in enumerate(ds):
            if d.metrics.get("state") in (STATE_PREEMPTED, STATE_RESUMED):
                assert is_state_only(d) and d.index == 0
            if d.metrics.get("state") == STATE_PREEMPTED:  # no token until it runs again
                nxt = next(
                    x for x in ds[k + 1 :] if x.token_ids or x.metrics.get("state") == STATE_RESUMED
                )
                assert nxt.metrics.get("state") == STATE_RESUMED
        assert ds[-1].finished and ds[-1].finish_reason == "length"
        assert sum(len(d.token_ids) for d in ds) == 40  # the reply is whole after resuming
    assert sum(_states(ds).count(STATE_PREEMPTED) for ds in deltas.values()) == len(log)
    assert llm.stats()["used_blocks"] == 0


def test_a_request_never_preempted_gets_no_pause_events(make_llm):
    llm = make_llm(num_blocks=64, max_model_len=128, max_num_seqs=3)
    streams = [
        llm.submit(p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)) for p in PROMPTS
    ]
    for s in streams:
        st = _states(list(s))
        assert STATE_PREEMPTED not in st and STATE_RESUMED not in st
    assert llm.stats()["num_preemptions"] == 0


def _wait_waiting(llm, rid, timeout=120):
    deadline = time.time() + timeout
    while llm.queue_position(rid) is None:
        assert time.time() < deadline, "the request never showed up in the waiting queue"
        time.sleep(0.01)


def test_queue_position_counts_api_requests_waiting_ahead(make_llm):
    # One slot: a long request runs, an API-style request (plain submit) waits, then a chat turn.
    llm = make_llm(num_blocks=64, max_model_len=256, max_num_seqs=1)
    long = llm.submit(
        "Write a long essay about rivers.",
        SamplingParams(temperature=0, max_tokens=120, ignore_eos=True),
    )
    api = llm.submit(
        "An API call.", SamplingParams(temperature=0, max_tokens=2), request_id="api-1"
    )
    chat = llm.submit_chat(
        [{"role": "user", "content": "Hello"}],
        SamplingParams(temperature=0, max_tokens=2),
        session_id="conv-1",
        request_id="chat-1",
    )
    _wait_waiting(llm, "chat-1")
    pos_chat, pos_api = llm.queue_position("chat-1"), llm.queue_position("api-1")
    assert (pos_api, pos_chat) == (1, 2)  # the API request ahead is counted
    assert llm.queue_position(long.request_id) is None  # running, not waiting
    long.abort()
    for s in (long, api, chat):
        list(s)
    assert llm.queue_position("chat-1") is None and llm.queue_position("api-1") is None
    llm.close_session("conv-1")
