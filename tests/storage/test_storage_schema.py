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
    assert names == [
        "m001_tables",
        "m002_message_search",
        "m003_user_prompts",
        "m004_reply_cached_blocks",
        "m005_active_branch",
        "m006_reply_speculative",
        "m007_reply_served_by",
        "m008_thinking",
    ]


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


def test_a_file_from_before_speculative_stats_keeps_its_replies_and_takes_the_new_ones(db_path):
    """m006: a v5 file's reply stats survive; a reply of a --speculative engine stores its
    accepted-draft count and decode steps (the chat line's "17 accepted from drafts")."""
    old = Database(sqlite3.connect(db_path))
    MIGRATIONS.apply(old, stop_before="m006_reply_speculative")
    old.execute(
        "INSERT INTO conversations (id, owner, title, created_at, updated_at)"
        " VALUES ('c1', '', 'old chat', '2020-01-01', '2020-01-01')"
    )
    old.execute(
        "INSERT INTO messages (conversation_id, role, content, created_at)"
        " VALUES ('c1', 'assistant', 'old reply', '2020-01-01')"
    )
    mid = old.execute("SELECT id FROM messages").fetchone()[0]
    old.execute("INSERT INTO reply_stats (message_id, output_tokens) VALUES (?, 5)", [mid])
    old.conn.commit()
    old.close()
    with Storage(db_path) as s:
        assert s.get_message(mid)["stats"]["output_tokens"] == 5
        assert "decode_steps" not in s.get_message(mid)["stats"]  # as before m006
        stats = s.add_reply_stats(mid, spec_accepted_tokens=17, decode_steps=25)
        assert (
            stats["output_tokens"] == 5
            and stats["spec_accepted_tokens"] == 17
            and stats["decode_steps"] == 25
        )
        assert s.get_message(mid)["stats"]["decode_steps"] == 25
        with pytest.raises(ValueError):
            s.add_reply_stats(mid, decode_steps=-1)
