"""Per-user shared system prompts (--auth) and saved named prompts, on a real SQLite file."""

import pytest

from storage import Storage
from storage.presets import PRESETS, preset_text
from storage.schema import DEFAULT_SYSTEM_PROMPT


def test_each_user_has_own_prompt_and_new_users_start_from_default(store):
    assert store.get_system_prompt("alice")["text"] == DEFAULT_SYSTEM_PROMPT
    store.set_system_prompt("Alice's prompt.", owner="alice")
    assert store.get_system_prompt("alice")["text"] == "Alice's prompt."
    assert store.get_system_prompt("bob")["text"] == DEFAULT_SYSTEM_PROMPT  # unchanged
    assert store.get_system_prompt()["text"] == DEFAULT_SYSTEM_PROMPT  # the app's too
    bob = store.create_conversation(owner="bob")
    alice = store.create_conversation(owner="alice")
    assert store.conversation_system_prompt(bob["id"]) == DEFAULT_SYSTEM_PROMPT
    assert store.conversation_system_prompt(alice["id"]) == "Alice's prompt."


def test_local_user_prompt_is_the_app_prompt(store):
    store.set_system_prompt("Local prompt.", owner="")
    assert store.get_system_prompt()["text"] == "Local prompt."
    assert store.get_system_prompt("carol")["text"] == "Local prompt."  # a new user starts from it


def test_named_prompts_are_per_owner_and_overwrite_by_name(store):
    store.save_named_prompt("alice", "Pirate", "Arr.")
    store.save_named_prompt("alice", "Pirate", "Arr, matey.")
    store.save_named_prompt("bob", "Mine", "Bob's.")
    assert store.named_prompts("alice") == [{"name": "Pirate", "text": "Arr, matey."}]
    assert store.named_prompts("bob") == [{"name": "Mine", "text": "Bob's."}]
    with pytest.raises(ValueError):
        store.save_named_prompt("alice", " ", "x")
    with pytest.raises(ValueError):
        store.save_named_prompt("alice", "Empty", "  ")
    assert store.delete_named_prompt("alice", "Pirate") and not store.named_prompts("alice")


def test_user_prompt_survives_reopen(db_path):
    with Storage(db_path) as s:
        s.set_system_prompt("Kept.", owner="alice")
    with Storage(db_path) as s:
        assert s.get_system_prompt("alice")["text"] == "Kept."


def test_presets_are_real_policies():
    assert len(PRESETS) == 4 and preset_text("Customer-support policy (long)").count("\n") > 20
    assert len(DEFAULT_SYSTEM_PROMPT) > 1500
    with pytest.raises(ValueError):
        preset_text("nope")
