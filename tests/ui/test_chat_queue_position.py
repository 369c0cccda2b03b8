"""The chat's "queued (position k)" counts every request waiting in the engine, API calls included,
not only other chat replies: the tab registry asks the real engine (LLM.queue_position). On the same
engine (one load for both): one Send traced through the real handler, turn and engine (46.5)."""

import time

import pytest

from engine import SamplingParams
from ui.chat import states
from ui.chat.tabs import TabRegistry
from ui.chat.turn import Turn


@pytest.fixture(scope="module")
def llm():
    from engine import ServingLLM

    m = ServingLLM(
        num_blocks=64, max_model_len=256, max_num_seqs=1
    )  # one slot: everything else waits
    yield m
    m.shutdown()


def test_queued_position_counts_an_api_request_waiting_ahead(llm):
    tabs = TabRegistry(llm)
    running = llm.submit(
        "Write a long essay about rivers.",
        SamplingParams(temperature=0, max_tokens=150, ignore_eos=True),
    )
    api = llm.submit(
        "An API call.", SamplingParams(temperature=0, max_tokens=2), request_id="api-req"
    )
    deadline = time.time() + 120
    while llm.queue_position("api-req") is None:
        assert time.time() < deadline
        time.sleep(0.01)
    turn = Turn("conv-q", 1, 1)
    tabs.attach(turn)
    assert tabs.queue_position(turn) == 2  # not in the engine yet: it joins behind the API call
    chat = llm.submit_chat(
        [{"role": "user", "content": "Hi"}],
        SamplingParams(temperature=0, max_tokens=2),
        request_id=turn.rid,
    )
    while llm.queue_position(turn.rid) is None:
        assert time.time() < deadline
        time.sleep(0.01)
    assert tabs.queue_position(turn) == 2  # no other chat turn waits, yet it is second
    assert "queued as number 2" in states.live_status(states.QUEUED, tabs.queue_position(turn))
    running.abort()
    for s in (running, api, chat):
        list(s)
    assert llm.stats()["used_blocks"] == 0
    tabs.shutdown()


# ---- one pass for a chat turn (issue 46.5), on the same engine ---------------------------------


class CountingStorage:
    """The real store; each read of a conversation's branch (get_messages) is logged."""

    def __init__(self, st, log: list):
        self._st, self._log = st, log

    def get_messages(self, *args, **kwargs):
        self._log.append("branch read")
        return self._st.get_messages(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._st, name)


class CountingTokenizer:
    """The engine's tokenizer; each chat-template render and each encode is logged."""

    def __init__(self, tok, log: list):
        self._tok, self._log = tok, log

    def apply_chat_template(self, *args, **kwargs):
        self._log.append("render")
        return self._tok.apply_chat_template(*args, **kwargs)

    def encode(self, *args, **kwargs):
        self._log.append("encode")
        return self._tok.encode(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_one_send_reads_the_branch_once_tokenizes_once_and_the_painter_waits_on_its_event(
    llm, tmp_path, monkeypatch
):
    """Tracing one Send through the real handler, turn and engine: before the engine gets the
    request the branch is read from storage once, and the prompt is rendered and tokenized once
    (exactly what one continue_session_prompt costs; nothing after the submit renders it again).
    While the engine holds the admitted reply, the painter waits on its event (Wakeup.wait with no
    timeout) instead of looking again on a timer: the engine is held until the painter waits, so a
    polling painter never releases it and fails here."""
    import asyncio
    import threading

    from engine.text.session_prompt import continue_session_prompt
    from storage import Storage
    from tests.ui.fake_engine import request
    from ui.chat import handlers, view
    from ui.chat.context import ChatContext
    from ui.chat.wakeup import Wakeup

    log: list = []
    st = Storage(tmp_path / "chat.db")
    st.set_system_prompt("You are a helpful assistant.")
    ctx = ChatContext(llm, CountingStorage(st, log), TabRegistry(llm))
    monkeypatch.setattr(llm, "tokenizer", CountingTokenizer(llm.tokenizer, log))
    real_submit = llm.submit_chat

    def submit_chat(*args, **kwargs):
        log.append("submit")
        return real_submit(*args, **kwargs)

    monkeypatch.setattr(llm, "submit_chat", submit_chat)

    # the painter: every wait, with its timeout and whether the engine had admitted the reply
    waits, armed, held, released = [], threading.Event(), threading.Event(), threading.Event()
    real_wait, real_wake = Wakeup.wait, Wakeup.wake

    conv: list = []  # the chat's id, once the first Send made it

    async def wait(ev, timeout):
        turn = ctx.tabs.turn(conv[0]) if conv else None
        waits.append((timeout, bool(turn and turn.admitted)))
        if turn is not None and turn.admitted and held.is_set():
            released.set()
        await real_wait(ev, timeout)

    def wake(self):
        turn = ctx.tabs.turn(conv[0]) if conv else None
        if armed.is_set() and turn is not None and turn.admitted and not held.is_set():
            held.set()  # hold the engine between two steps until the painter waits
            threading.Thread(
                target=llm.run_on_engine, args=(lambda eng: released.wait(60),), daemon=True
            ).start()
        real_wake(self)

    monkeypatch.setattr(Wakeup, "wait", staticmethod(wait))
    monkeypatch.setattr(Wakeup, "wake", wake)

    kw = {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_tokens": 16,
        "repetition_penalty": 1.0,
        "seed": None,
        "n": 1,
        "ignore_eos": True,
    }

    async def send(text, max_tokens):
        agen = handlers.send(ctx, text, dict(kw, max_tokens=max_tokens), request("s1"))
        return [out async for out in agen]

    try:
        asyncio.run(send("Hi", 4))  # the first turn: the second reuses its ids
        conv.append(st.list_conversations()[0]["id"])
        log.clear()
        waits.clear()
        armed.set()
        asyncio.run(send("Say that again, please.", 16))
        branch = st.get_messages(conv[0])
        assert [m["role"] for m in branch] == ["user", "assistant", "user", "assistant"]
        assert branch[-1]["status"] == "complete" and len(branch[-1]["token_ids"]) == 16

        before = log[: log.index("submit")]
        assert before.count("branch read") == 1, log
        after = log[log.index("submit") + 1 :]
        assert "render" not in after and "encode" not in after, log  # the ids were handed over

        ref: list = []  # what rendering and tokenizing this prompt once costs
        messages = view.engine_messages(st.conversation_system_prompt(conv[0]), branch[:3])
        ids = continue_session_prompt(
            CountingTokenizer(llm.tokenizer._tok, ref),
            messages,
            branch[0]["token_ids"] + branch[1]["token_ids"],
        )
        assert ids == branch[2]["token_ids"]  # the prompt the engine ran, as stored
        assert ref.count("render") == 1
        assert before.count("render") == 1 and before.count("encode") == ref.count("encode"), log

        assert held.is_set() and released.is_set(), waits  # the painter waited while held
        assert [t for t, admitted in waits if admitted] and all(
            t is None for t, admitted in waits if admitted
        ), waits
    finally:
        released.set()
        ctx.tabs.shutdown()
        st.close()
