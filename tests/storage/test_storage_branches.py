"""Browsing branches: select_branch, branch_versions, appending to the shown branch, titles."""

import pytest


def contents(store, conv_id):
    return [m["content"] for m in store.get_messages(conv_id)]


def test_edit_then_browse_back_and_continue_on_old_branch(store, make_chat):
    conv, (u1, a1, u2, a2) = make_chat("first question", "A1", "second", "A2")
    edited = store.add_sibling(u2["id"], "second, edited")
    store.add_message(conv["id"], "assistant", "A2 edited")
    assert contents(store, conv["id"]) == ["first question", "A1", "second, edited", "A2 edited"]
    versions = store.branch_versions(conv["id"])
    assert versions[u2["id"]] == versions[edited["id"]] == [u2["id"], edited["id"]]
    assert u1["id"] not in versions
    # back to version 1/2: the later turns of the old branch are there again
    path = store.select_branch(u2["id"])
    assert [m["content"] for m in path] == ["first question", "A1", "second", "A2"]
    assert contents(store, conv["id"]) == ["first question", "A1", "second", "A2"]
    # continuing appends to the shown (old) branch, not to the newest leaf
    u3 = store.add_message(conv["id"], "user", "third, on the old branch")
    assert u3["parent_id"] == a2["id"]
    assert contents(store, conv["id"])[-2:] == ["A2", "third, on the old branch"]


def test_alternatives_are_siblings_and_a_pick_is_kept(store, make_chat):
    conv, (u1, a1) = make_chat("q", "alt 1")
    a2 = store.add_sibling(a1["id"], "alt 2")
    store.select_branch(a1["id"])  # shown: the first alternative
    assert contents(store, conv["id"]) == ["q", "alt 1"]
    store.select_branch(a2["id"])  # the user picks the second one
    assert contents(store, conv["id"]) == ["q", "alt 2"]
    store.add_message(conv["id"], "user", "next")
    assert store.get_messages(conv["id"])[-1]["parent_id"] == a2["id"]


def test_title_follows_first_message_of_active_branch_unless_renamed(store, make_chat):
    conv, (u1, a1) = make_chat("hello there", "hi")
    store.add_sibling(u1["id"], "a different opening")
    assert store.get_conversation(conv["id"])["title"] == "a different opening"
    store.select_branch(u1["id"])
    assert store.get_conversation(conv["id"])["title"] == "hello there"
    store.rename_conversation(conv["id"], "My title")
    store.select_branch(store.branch_versions(conv["id"])[u1["id"]][1])
    assert store.get_conversation(conv["id"])["title"] == "My title"


def test_select_branch_checks_owner_and_existence(store):
    conv = store.create_conversation(owner="alice")
    m = store.add_message(conv["id"], "user", "x", owner="alice")
    with pytest.raises(PermissionError):
        store.select_branch(m["id"], owner="bob")
    with pytest.raises(KeyError):
        store.select_branch(10_000)
    store.delete_conversation(conv["id"], owner="alice")  # cascades the selection row
    assert not list(store.db.query("SELECT * FROM active_branch"))
