"""Fixtures: every test gets a fresh real SQLite file in tmp_path (no mocks)."""

import pytest

from storage import Storage


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "chat.db"


@pytest.fixture
def store(db_path):
    with Storage(db_path) as s:
        yield s


@pytest.fixture
def make_chat(store):
    """Create a conversation from alternating user/assistant texts; returns (conv, messages)."""

    def make(*turns, owner=""):
        conv = store.create_conversation(owner=owner)
        msgs = [
            store.add_message(conv["id"], "user" if i % 2 == 0 else "assistant", text)
            for i, text in enumerate(turns)
        ]
        return conv, msgs

    return make
