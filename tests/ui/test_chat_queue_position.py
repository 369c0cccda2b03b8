"""The chat's "queued (position k)" counts every request waiting in the engine, API calls included,
not only other chat replies: the tab registry asks the real engine (LLM.queue_position)."""
import time

import pytest

from engine import SamplingParams
from ui.chat import states
from ui.chat.tabs import TabRegistry
from ui.chat.turn import Turn


@pytest.fixture(scope="module")
def llm():
    from engine import ServingLLM
    m = ServingLLM(num_blocks=64, max_model_len=256, max_num_seqs=1)      # one slot: everything else waits
    yield m
    m.shutdown()


def test_queued_position_counts_an_api_request_waiting_ahead(llm):
    tabs = TabRegistry(llm)
    running = llm.submit("Write a long essay about rivers.", SamplingParams(temperature=0, max_tokens=150,
                                                                          ignore_eos=True))
    api = llm.submit("An API call.", SamplingParams(temperature=0, max_tokens=2), request_id="api-req")
    deadline = time.time() + 120
    while llm.queue_position("api-req") is None:
        assert time.time() < deadline
        time.sleep(0.01)
    turn = Turn("conv-q", 1, 1)
    tabs.attach(turn)
    assert tabs.queue_position(turn) == 2        # not in the engine yet: it joins behind the API call
    chat = llm.submit_chat([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0, max_tokens=2),
                           request_id=turn.rid)
    while llm.queue_position(turn.rid) is None:
        assert time.time() < deadline
        time.sleep(0.01)
    assert tabs.queue_position(turn) == 2        # no other chat turn waits, yet it is second
    assert "queued as number 2" in states.live_status(states.QUEUED, tabs.queue_position(turn))
    running.abort()
    for s in (running, api, chat):
        list(s)
    assert llm.stats()["used_blocks"] == 0
    tabs.shutdown()
