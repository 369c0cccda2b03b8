"""With the real model: under FCFS a heavy tenant that filled every slot first starves an
interactive tenant for whole generations; under fair scheduling the interactive request is served
at once (by preempting the heavy tenant's newest sequence), and every request's greedy tokens equal
HF's whatever order the scheduler chose."""

import threading
import time

import pytest

from engine import SamplingParams

pytestmark = pytest.mark.slow

HEAVY = [
    f"Write a long essay about topic number {k}: the history of bridges and rivers."
    for k in range(6)
]
CHAT = "Say hello in one short sentence."


def _flood_then_chat(llm):
    """6 heavy requests (3 run, 3 wait), then one interactive one; returns the event log and ids."""
    heavy_p = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    chat_p = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    log, lock, outs = [], threading.Lock(), {}

    def consume(stream, who):
        toks = []
        for d in stream:
            toks.extend(d.token_ids)
            with lock:
                if d.token_ids and len(toks) == len(d.token_ids):
                    log.append((who, "first"))
                if d.finished:
                    log.append((who, "done"))
        outs[who] = (stream.prompt_ids, toks)

    threads = []
    for k, p in enumerate(HEAVY):
        s = llm.submit(p, heavy_p, tenant="heavy")
        threads.append(threading.Thread(target=consume, args=(s, f"h{k}")))
        threads[-1].start()
    deadline = time.time() + 120
    while llm.load() != (3, 3):  # heavy holds every slot and has more waiting
        assert time.time() < deadline, llm.load()
        time.sleep(0.005)
    s = llm.submit(CHAT, chat_p, tenant="chat")
    threads.append(threading.Thread(target=consume, args=(s, "chat")))
    threads[-1].start()
    for t in threads:
        t.join(timeout=600)
    return log, outs


@pytest.mark.parametrize("policy", ["fcfs", "fair"])
def test_fcfs_starves_the_interactive_tenant_fair_does_not(make_llm, hf_greedy, policy):
    llm = make_llm(num_blocks=256, max_model_len=256, max_num_seqs=3, scheduling_policy=policy)
    log, outs = _flood_then_chat(llm)
    first = log.index(("chat", "first"))
    heavy_done_before = sum(1 for who, ev in log[:first] if ev == "done" and who != "chat")
    if policy == "fcfs":
        assert heavy_done_before >= 3, log  # waited for whole heavy generations
    else:
        done = log.index(("chat", "done"))
        assert not any(ev == "done" and who != "chat" for who, ev in log[:done]), log
        rows = {t.tenant: t for t in llm.tenant_stats(fresh=True)}
        assert rows["heavy"].preemptions >= 1 and rows["chat"].preemptions == 0
        assert any(
            e.kind == "fair_preempt" and e.tenant == "heavy"
            for e in llm.fairness_events(fresh=True)
        )
    for who, (prompt_ids, toks) in outs.items():  # order and preemption change no token
        want = hf_greedy(prompt_ids, 8 if who == "chat" else 40, stop_at_eos=False, draft=toks)
        assert toks == want, who
