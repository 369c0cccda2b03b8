"""Messages, reply stats, auto titles, branches (edit/resend, regenerate) and cascades."""

import pytest


def contents(store, conv_id, **kw):
    return [m["content"] for m in store.get_messages(conv_id, **kw)]


def test_add_update_and_stats(store):
    conv = store.create_conversation()
    user = store.add_message(conv["id"], "user", "Hi")
    reply = store.add_message(conv["id"], "assistant", "", status="stopped")
    assert (
        reply["parent_id"] == user["id"] and reply["token_ids"] is None and reply["stats"] is None
    )
    done = store.update_message(
        reply["id"], content="Hello!", token_ids=[9, 8, 2], status="complete"
    )
    assert (done["content"], done["token_ids"], done["status"]) == ("Hello!", [9, 8, 2], "complete")
    stats = store.add_reply_stats(reply["id"], prompt_tokens=20, cached_tokens=16, ttft_s=0.25)
    stats = store.add_reply_stats(
        reply["id"], output_tokens=3, tokens_per_s=40.5, finish_reason="stop"
    )
    assert stats == {
        "prompt_tokens": 20, "cached_tokens": 16, "output_tokens": 3,
        "ttft_s": 0.25, "tokens_per_s": 40.5, "finish_reason": "stop",
    }  # fmt: skip
    assert store.get_messages(conv["id"])[1]["stats"] == stats
    assert store.get_conversation(conv["id"])["updated_at"] > conv["updated_at"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"role": "robot"},
        {"status": "streaming"},
        {"content": None},
        {"token_ids": [1, -2]},
        {"token_ids": "1,2"},
        {"token_ids": [True]},
        {"parent_id": 12345},
    ],
)
def test_add_message_rejects_bad_values(store, kwargs):
    conv = store.create_conversation()
    args = {"role": "user", "content": "x", **kwargs}
    with pytest.raises(ValueError):
        store.add_message(conv["id"], **args)
    assert store.get_messages(conv["id"]) == []


def test_bad_stats_and_unknown_ids(store):
    conv = store.create_conversation()
    msg = store.add_message(conv["id"], "assistant", "x")
    for bad in (
        {"bogus": 1},
        {"output_tokens": 1.5},
        {"ttft_s": float("nan")},
        {"finish_reason": 3},
    ):
        with pytest.raises(ValueError):
            store.add_reply_stats(msg["id"], **bad)
    with pytest.raises(KeyError):
        store.add_message("missing", "user", "x")
    with pytest.raises(KeyError):
        store.update_message(999, content="x")
    other = store.create_conversation()
    with pytest.raises(ValueError):  # parent from another conversation
        store.add_message(other["id"], "user", "x", parent_id=msg["id"])


def test_first_user_message_sets_title(store):
    conv = store.create_conversation()
    store.add_message(conv["id"], "system", "setup text")
    assert store.get_conversation(conv["id"])["title"] == "New chat"
    store.add_message(
        conv["id"], "user", "  Please   explain how a transformer model attends to it "
    )
    title = store.get_conversation(conv["id"])["title"]
    assert title == "Please explain how a transformer model…"
    store.add_message(conv["id"], "user", "Second question")
    assert store.get_conversation(conv["id"])["title"] == title
    named = store.create_conversation(title="Mine")
    store.add_message(named["id"], "user", "hello")
    assert store.get_conversation(named["id"])["title"] == "Mine"
    short = store.create_conversation()
    store.add_message(short["id"], "user", "Hi there")
    assert store.get_conversation(short["id"])["title"] == "Hi there"


def test_regenerate_keeps_old_reply_as_branch(store, make_chat):
    conv, (u1, a1, u2, a2) = make_chat("q1", "a1", "q2", "a2")
    new = store.add_sibling(a2["id"], "", status="stopped")
    assert (new["parent_id"], new["role"]) == (u2["id"], "assistant")
    store.update_message(new["id"], content="a2 take two", status="complete")
    assert contents(store, conv["id"]) == ["q1", "a1", "q2", "a2 take two"]
    assert [m["id"] for m in store.get_siblings(a2["id"])] == [a2["id"], new["id"]]
    assert contents(store, conv["id"], through=a2["id"]) == ["q1", "a1", "q2", "a2"]
    assert store.get_message(a2["id"])["content"] == "a2"  # old reply still stored


def test_edit_and_resend_creates_branch(store, make_chat):
    conv, (u1, a1, u2, a2) = make_chat("q1", "a1", "q2", "a2")
    edited = store.add_sibling(u2["id"], "q2 edited")
    store.add_message(conv["id"], "assistant", "answer to edit")  # parent_id=None: active leaf
    assert contents(store, conv["id"]) == ["q1", "a1", "q2 edited", "answer to edit"]
    # Viewing the old branch, then continuing it, makes it active again (newest leaf wins).
    assert contents(store, conv["id"], through=u2["id"]) == ["q1", "a1", "q2", "a2"]
    store.add_message(conv["id"], "user", "q3 on old branch", parent_id=a2["id"])
    assert contents(store, conv["id"]) == ["q1", "a1", "q2", "a2", "q3 on old branch"]
    edited_branch = contents(store, conv["id"], through=edited["id"])
    assert edited_branch == ["q1", "a1", "q2 edited", "answer to edit"]
    with pytest.raises(KeyError):
        store.get_messages(conv["id"], through=10_000)


def test_edit_first_message_makes_new_root(store, make_chat):
    conv, (u1, a1) = make_chat("hello", "hi")
    root2 = store.add_sibling(u1["id"], "hello again")
    assert root2["parent_id"] is None
    assert contents(store, conv["id"]) == ["hello again"]
    assert len(store.get_siblings(u1["id"])) == 2


def test_cascade_delete_removes_messages_and_stats(store, make_chat):
    conv, (u1, a1) = make_chat("q", "a")
    store.add_sibling(a1["id"], "a2")
    store.add_reply_stats(a1["id"], output_tokens=1)
    keep, _ = make_chat("other")
    store.delete_conversation(conv["id"])
    count = lambda table: store.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: E731
    assert (count("messages"), count("reply_stats"), count("conversations")) == (1, 0, 1)
    assert contents(store, keep["id"]) == ["other"]
