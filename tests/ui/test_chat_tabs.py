"""TabRegistry: which tab shows which conversation, and when an engine session is released."""

import pytest

from tests.ui.fake_engine import FakeLLM
from ui.chat.tabs import TabRegistry


@pytest.fixture
def reg():
    llm = FakeLLM()
    r = TabRegistry(llm)
    r.llm = llm
    yield r
    r.shutdown()


def settle(reg):
    reg._jobs.submit(lambda: None).result(timeout=5)  # the worker runs jobs in order
    return reg.llm.log


def test_switching_away_releases_only_when_no_other_tab_shows_it(reg):
    t1, t2 = reg.get("s1"), reg.get("s2")
    assert reg.get("s1") is t1
    reg.open(t1, "A")
    reg.open(t2, "A")
    reg.open(t1, "B")
    assert settle(reg) == []  # t2 still shows A
    reg.open(t2, None)
    assert settle(reg) == [("end", "A")]
    assert reg.open_conversations() == {"B": 1}


def test_closing_a_tab_releases_its_conversation(reg):
    reg.open(reg.get("s1"), "A")
    reg.close("s1")
    reg.close("s1")  # twice (unload + API goodbye): harmless
    assert settle(reg) == [("end", "A")]


def test_a_generating_conversation_is_released_by_its_generation_after_the_abort(reg):
    tab = reg.get("s1")
    reg.open(tab, "A")
    assert reg.begin("A") and not reg.begin("A")  # one generation per conversation
    reg.close("s1")  # tab closed mid-reply
    assert settle(reg) == []  # not while it is generating
    reg.end("A", abort_request_id="r1").result(timeout=5)
    assert reg.llm.log == [("abort", "r1"), ("end", "A")]
    assert not reg.is_busy("A")


def test_end_keeps_the_session_while_a_tab_still_shows_it(reg):
    reg.open(reg.get("s1"), "A")
    reg.begin("A")
    reg.end("A").result(timeout=5)
    assert reg.llm.log == []


def test_end_waits_for_the_submit_before_aborting(reg):
    from concurrent.futures import Future

    submitted = Future()
    reg.begin("A")
    done = reg.end("A", abort_request_id="r1", submitted=submitted)
    assert not done.done()
    reg.llm.log.append(("submitted", "r1"))
    submitted.set_result(object())
    done.result(timeout=5)
    assert reg.llm.log == [("submitted", "r1"), ("abort", "r1"), ("end", "A")]


def test_a_failed_submit_is_not_aborted(reg):
    from concurrent.futures import Future

    submitted = Future()
    submitted.set_exception(ValueError("too long"))
    reg.begin("A")
    reg.end("A", abort_request_id="r1", submitted=submitted).result(timeout=5)
    assert reg.llm.log == [("end", "A")]


def test_forget_detaches_every_tab_and_closes_the_session(reg):
    t1, t2 = reg.get("s1"), reg.get("s2")
    reg.open(t1, "A")
    reg.open(t2, "A")
    reg.forget("A")
    assert t1.conv_id is None and t2.conv_id is None
    assert settle(reg) == [("close", "A")]  # a deleted chat: ids and blocks forgotten
    assert reg.open_conversations() == {}


def test_engine_shut_down_is_not_an_error(reg):
    def boom(_):
        raise RuntimeError("the engine has been shut down")

    reg.llm.end_session = boom
    reg.release("A").result(timeout=5)


def test_a_goodbye_needs_the_tabs_own_secret_and_owner(reg):
    tab = reg.get("s1", "ann")
    reg.open(tab, "A")
    assert not reg.goodbye("s1", "not-the-secret", "ann")
    assert not reg.goodbye("s1", tab.goodbye, "bob")  # another login, right secret
    assert not reg.goodbye("s2", tab.goodbye, "ann")  # another tab
    assert settle(reg) == [] and reg.open_conversations() == {"A": 1}
    assert reg.goodbye("s1", tab.goodbye, "ann")
    assert settle(reg) == [("end", "A")] and reg.open_conversations() == {}


def test_a_silent_tab_is_swept_and_continues_its_chat_when_it_speaks_again(reg, monkeypatch):
    import ui.chat.tabs as T

    now = [1000.0]
    monkeypatch.setattr(T.time, "monotonic", lambda: now[0])
    quiet, busy = reg.get("quiet"), reg.get("busy")
    reg.open(quiet, "A")
    reg.open(busy, "B")
    now[0] += 100
    reg.get("busy")  # the other tab keeps speaking
    now[0] += 100
    assert reg.sweep(silent_s=150) == 1  # "quiet": 200 s without a word
    assert settle(reg) == [("end", "A")] and reg.open_conversations() == {"B": 1}
    assert reg.sweep(silent_s=150) == 0  # swept once
    assert reg.get("quiet") is quiet and quiet.conv_id == "A"  # it was only asleep: same chat
    assert reg.open_conversations() == {"A": 1, "B": 1}
    now[0] += 10**6
    reg.sweep(silent_s=150, forget_s=3600)
    reg.sweep(silent_s=150, forget_s=3600)  # dormant for long: forgotten
    assert reg.get("quiet") is not quiet
