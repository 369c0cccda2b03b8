"""Conversations, system prompts, owner isolation and sidebar search."""

import pytest

from storage.schema import DEFAULT_SYSTEM_PROMPT


def test_system_prompt_seeded_then_versioned(store):
    first = store.get_system_prompt()
    assert first["text"] == DEFAULT_SYSTEM_PROMPT
    old_conv = store.create_conversation()
    new = store.set_system_prompt("Talk like a pirate.")
    assert new["id"] != first["id"] and store.get_system_prompt() == new
    # Older conversations keep the prompt they were created with; new ones get the new one.
    assert store.get_conversation(old_conv["id"])["system_prompt_id"] == first["id"]
    assert store.conversation_system_prompt(old_conv["id"]) == DEFAULT_SYSTEM_PROMPT
    assert (
        store.conversation_system_prompt(store.create_conversation()["id"]) == "Talk like a pirate."
    )
    with pytest.raises(ValueError):
        store.set_system_prompt(None)


def test_per_conversation_override(store):
    conv = store.create_conversation(system_prompt_override="Be terse.")
    assert store.conversation_system_prompt(conv["id"]) == "Be terse."
    store.set_conversation_system_prompt(conv["id"], None)
    assert store.conversation_system_prompt(conv["id"]) == DEFAULT_SYSTEM_PROMPT
    updated = store.set_conversation_system_prompt(conv["id"], "Rhyme.")
    assert updated["system_prompt_override"] == "Rhyme."
    with pytest.raises(KeyError):
        store.create_conversation(system_prompt_id=999)


def test_crud(store):
    conv = store.create_conversation(owner="ann", title="Plans")
    assert len(conv["id"]) == 36 and conv["owner"] == "ann" and conv["title"] == "Plans"
    assert store.get_conversation(conv["id"]) == conv
    renamed = store.rename_conversation(conv["id"], "  Trip  ")
    assert renamed["title"] == "Trip" and renamed["updated_at"] == conv["updated_at"]
    with pytest.raises(ValueError):
        store.rename_conversation(conv["id"], "   ")
    store.delete_conversation(conv["id"])
    with pytest.raises(KeyError):
        store.get_conversation(conv["id"])
    with pytest.raises(KeyError):
        store.delete_conversation(conv["id"])
    assert store.list_conversations() == []


def test_list_newest_updated_first(store, make_chat):
    a, _ = make_chat("first")
    b, _ = make_chat("second")
    c = store.create_conversation()
    assert [x["id"] for x in store.list_conversations()] == [c["id"], b["id"], a["id"]]
    store.add_message(a["id"], "assistant", "reply bumps a")
    assert [x["id"] for x in store.list_conversations()] == [a["id"], c["id"], b["id"]]


def test_owner_isolation(store, make_chat):
    ann, (ann_msg,) = make_chat("ann's secret", owner="ann")
    bob, _ = make_chat("bob's note", owner="bob")
    local = store.create_conversation()
    assert [c["id"] for c in store.list_conversations(owner="ann")] == [ann["id"]]
    assert [c["id"] for c in store.list_conversations(owner="")] == [local["id"]]
    assert len(store.list_conversations()) == 3  # owner None = all
    assert store.get_conversation(ann["id"], owner="ann")["id"] == ann["id"]
    denied = [
        lambda: store.get_conversation(ann["id"], owner="bob"),
        lambda: store.get_conversation(ann["id"], owner=""),
        lambda: store.get_messages(ann["id"], owner="bob"),
        lambda: store.rename_conversation(ann["id"], "mine", owner="bob"),
        lambda: store.delete_conversation(ann["id"], owner="bob"),
        lambda: store.add_message(ann["id"], "user", "hi", owner="bob"),
        lambda: store.update_message(ann_msg["id"], content="x", owner="bob"),
        lambda: store.add_sibling(ann_msg["id"], "x", owner="bob"),
        lambda: store.add_reply_stats(ann_msg["id"], owner="bob", output_tokens=1),
        lambda: store.export_json(ann["id"], owner="bob"),
        lambda: store.export_markdown(ann["id"], owner="bob"),
        lambda: store.set_conversation_system_prompt(ann["id"], "x", owner="bob"),
    ]
    for call in denied:
        with pytest.raises(PermissionError):
            call()
    assert store.get_conversation(ann["id"])["title"] == "ann's secret"  # nothing changed
    assert [m["content"] for m in store.get_messages(ann["id"])] == ["ann's secret"]
    assert [c["id"] for c in store.list_conversations(owner="bob", query="secret")] == []
    with pytest.raises(KeyError):
        store.get_conversation("no-such-id", owner="ann")


def test_search_titles_and_messages(store, make_chat):
    cooking, _ = make_chat("How long do I boil an egg?", "About nine minutes for hard-boiled.")
    travel, _ = make_chat("Trains from Paris to Berlin", "There is a direct night train.")
    store.rename_conversation(travel["id"], "Europe 50% off_trip")

    def hits(q, **kw):
        return {c["id"] for c in store.list_conversations(query=q, **kw)}

    assert hits("egg") == {cooking["id"]}
    assert hits("MINUTES") == {cooking["id"]}  # case-insensitive
    assert hits("nin") == {cooking["id"]}  # word prefix
    assert hits("night train") == {travel["id"]}  # all words, any order in the message
    assert hits("train egg") == set()
    assert hits("Europe") == {travel["id"]}  # title substring
    assert hits("50%") == {travel["id"]} and hits("0% o") == {travel["id"]}  # LIKE escaped
    assert hits('"; DROP TABLE x --') == set()  # quotes and FTS syntax are neutralised
    assert hits("egg OR train") == set()  # OR is a word here, not an operator
    assert len(store.list_conversations(query="   ")) == 2


def test_search_follows_edits_and_deletes(store, make_chat):
    conv, (msg,) = make_chat("draft about zebras")
    store.rename_conversation(conv["id"], "Animals")  # the title was set from the message
    store.update_message(msg["id"], content="final about giraffes")
    assert store.list_conversations(query="zebras") == []
    assert [c["id"] for c in store.list_conversations(query="giraffes")] == [conv["id"]]
    store.delete_conversation(conv["id"])
    assert store.list_conversations(query="giraffes") == []
    fts_rows = store.db.execute(
        "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'giraffes'"
    )
    assert fts_rows.fetchone()[0] == 0


def test_think_switch_and_reasoning_tokens_are_kept(store):
    """A chat's "Think" switch (None: the template's default) and a thinking reply's reasoning
    tokens (issue 45) survive a read back; the switch is owner-checked like any change."""
    conv = store.create_conversation(owner="ann")
    assert store.get_conversation(conv["id"])["thinking"] is None
    assert store.set_conversation_thinking(conv["id"], False, owner="ann")["thinking"] == 0
    with pytest.raises(PermissionError):
        store.set_conversation_thinking(conv["id"], True, owner="bob")
    with pytest.raises(ValueError):
        store.set_conversation_thinking(conv["id"], "yes")
    user = store.add_message(conv["id"], "user", "q")
    reply = store.add_message(conv["id"], "assistant", "<think>hm</think>ok", parent_id=user["id"])
    store.add_reply_stats(reply["id"], output_tokens=5, reasoning_tokens=1)
    assert store.get_message(reply["id"])["stats"]["reasoning_tokens"] == 1
    plain = store.add_message(conv["id"], "assistant", "ok", parent_id=user["id"])
    store.add_reply_stats(plain["id"], output_tokens=1)
    assert "reasoning_tokens" not in store.get_message(plain["id"])["stats"]
