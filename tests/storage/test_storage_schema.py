"""Schema creation, migrations and connection settings, checked against the real file."""

import sqlite3

import pytest
from sqlite_utils import Database

from storage import Storage
from storage.schema import MIGRATIONS

TABLES = {"system_prompts", "conversations", "messages", "reply_stats", "messages_fts"}


def test_creates_schema_and_pragmas(store):
    assert TABLES <= set(store.db.table_names())
    assert next(store.db.query("PRAGMA journal_mode"))["journal_mode"] == "wal"
    assert next(store.db.query("PRAGMA foreign_keys"))["foreign_keys"] == 1
    names = [m.name for m in MIGRATIONS.applied(store.db)]
    assert names == ["m001_tables", "m002_message_search", "m003_user_prompts",
                     "m004_reply_cached_blocks", "m005_active_branch"]


def test_default_path_creates_data_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with Storage() as s:
        s.create_conversation()
    assert (tmp_path / "data" / "chat.db").is_file()


def test_reopen_is_idempotent_and_keeps_data(db_path):
    with Storage(db_path) as s:
        conv = s.create_conversation(title="kept")
        s.add_message(conv["id"], "user", "still here")
        applied = [(m.name, m.applied_at) for m in MIGRATIONS.applied(s.db)]
        prompt = s.get_system_prompt()
    with Storage(db_path) as s:
        assert [(m.name, m.applied_at) for m in MIGRATIONS.applied(s.db)] == applied
        assert s.get_system_prompt() == prompt  # not seeded twice
        assert s.db.execute("SELECT count(*) FROM system_prompts").fetchone()[0] == 1
        assert s.get_conversation(conv["id"])["title"] == "kept"
        assert [m["content"] for m in s.get_messages(conv["id"])] == ["still here"]
    # A fresh connection (foreign_keys is per connection) still sees WAL: it is persistent.
    raw = sqlite3.connect(db_path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.close()


def test_migrates_an_older_database(db_path):
    """A file at schema v1 (no FTS yet) gets the search index built from existing rows."""
    old = Database(sqlite3.connect(db_path))
    MIGRATIONS.apply(old, stop_before="m002_message_search")
    old.execute(
        "INSERT INTO conversations VALUES ('c1', '', 'old chat', NULL, NULL, '2020-01-01', '2020-01-01')"
    )
    old.execute(
        "INSERT INTO messages (conversation_id, role, content, created_at)"
        " VALUES ('c1', 'user', 'ancient wisdom', '2020-01-01')"
    )
    old.close()
    with Storage(db_path) as s:
        assert "messages_fts" in s.db.table_names()
        assert [c["id"] for c in s.list_conversations(query="wisdom")] == ["c1"]
        assert s.get_conversation("c1")["system_prompt_id"] is None
        assert s.conversation_system_prompt("c1") == s.get_system_prompt()["text"]


def test_foreign_keys_are_enforced(store):
    with pytest.raises(sqlite3.IntegrityError):
        store.db.execute(
            "INSERT INTO messages (conversation_id, role, content, created_at)"
            " VALUES ('missing', 'user', 'x', 'now')"
        )


def test_close_is_idempotent_and_context_manager_closes(db_path):
    s = Storage(db_path)
    s.close()
    s.close()
    with Storage(db_path) as s2:
        pass
    with pytest.raises(sqlite3.ProgrammingError):
        s2.list_conversations()
