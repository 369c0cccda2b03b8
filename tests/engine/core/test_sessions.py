"""The engine's session table (engine/core/sessions.py) with the real model: a session keeps the exact
ids of its last turn; a session opened with stored ids (what the app does after a restart)
continues token-exactly like the uninterrupted one; release keeps ids, close forgets them."""

from engine import SamplingParams
from engine.core.sessions import SessionTable

CHAT = [{"role": "user", "content": "Name three colours."}]


def _turn(llm, messages, sid, **kw):
    s = llm.submit_chat(
        messages, SamplingParams(temperature=0, max_tokens=12), session_id=sid, **kw
    )
    deltas = list(s)
    return s.prompt_ids, [t for d in deltas for t in d.token_ids], "".join(d.text for d in deltas)


def test_a_session_opened_with_stored_ids_continues_like_the_uninterrupted_one(make_llm, hf_greedy):
    llm = make_llm(num_blocks=256)
    p1, r1, text1 = _turn(llm, CHAT, "live")
    assert llm.session_token_ids("live") == p1 + r1
    chat2 = CHAT + [
        {"role": "assistant", "content": text1},
        {"role": "user", "content": "And one more?"},
    ]
    p2, r2, _ = _turn(llm, chat2, "live")
    assert p2[: len(p1 + r1)] == p1 + r1

    # "restart": a fresh session knows nothing but the stored ids of turn 1
    llm.open_session("restored", p1 + r1)
    q2, s2, _ = _turn(llm, chat2, "restored")
    assert q2 == p2 and s2 == r2 == hf_greedy(p2, 12, draft=s2)
    llm.end_session("live")
    assert llm.session_token_ids("live") == p2 + r2  # released: ids kept, blocks gone
    assert llm.close_session("restored") and llm.session_token_ids("restored") is None


def test_table_states_and_fork():
    t = SessionTable()
    t.open("a", [1, 2, 3])
    assert t.begin_turn("a", "r1") is None  # nothing parked yet
    assert t.running("a") == "r1"
    assert t.finish_turn("a", "r1", [1, 2, 3, 4, 5]) == "a"  # park under handle "a"
    assert t.token_ids("a") == [1, 2, 3, 4, 5]
    t.fork("a", "b")
    assert t.token_ids("b") == [1, 2, 3, 4, 5]
    assert t.begin_turn("a", "r2") == "a"  # the turn adopts what "a" parked
    assert t.release("a") is None  # released during the turn: free, keep ids
    assert t.finish_turn("a", "r2", [1, 2, 3, 4, 5, 6]) is None
    assert t.token_ids("a") == [1, 2, 3, 4, 5, 6]
    t.begin_turn("b", "r3")
    t.close("b")  # deleted during the turn: free, forget
    assert t.finish_turn("b", "r3", [9]) is None and t.token_ids("b") is None
    assert t.finish_turn("a", "stale", [7]) is None and t.token_ids("a") == [1, 2, 3, 4, 5, 6]
    assert t.begin_turn("a", "r4") is None and t.finish_turn("a", "r4", [1]) == "a"
    assert (
        t.release("a") == "a" and t.release("a") is None
    )  # the caller frees the parked blocks once
