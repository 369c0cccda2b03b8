"""Connection, locking and shared helpers behind Storage.

One connection (check_same_thread=False) wrapped in sqlite_utils.Database; one RLock
serializes every public call, because a sqlite3 connection must never be used by two threads
at once. WAL mode, foreign keys on, and every write is committed before the call returns, so
a process killed mid-stream loses nothing it had already stored.
"""

import functools
import os
import sqlite3
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlite_utils import Database

from . import schema


def locked(method):
    """Run a public method under the instance lock (helpers assume it is held)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


def _make_private(path: Path) -> None:
    """The history is private: a folder we create is 0700 and the DB file is 0600 (created so, or
    tightened if it exists). SQLite gives its -wal / -shm files the DB file's mode. An existing
    parent folder is left alone: it may be the user's own directory."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if p.exists() and (p.stat().st_mode & 0o077):
            os.chmod(p, 0o600)


class StoreBase:
    """Opens (creating or migrating) the database; Storage adds the public API on top."""

    def __init__(self, path="data/chat.db"):
        self.path = Path(path)
        _make_private(self.path)
        self._lock = threading.RLock()
        self._closed = False
        self._last_ts = datetime.min.replace(tzinfo=timezone.utc)
        conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=10)
        self.db = Database(conn)
        try:
            self.db.execute("PRAGMA foreign_keys = ON")
            self.db.enable_wal()
            # In WAL mode NORMAL survives any process crash; only an OS crash or power
            # loss can drop the last commits. It avoids an fsync per streamed update.
            self.db.execute("PRAGMA synchronous = NORMAL")
            schema.MIGRATIONS.apply(self.db)
            if not self._rows("SELECT id FROM system_prompts LIMIT 1"):
                self._insert_prompt(schema.DEFAULT_SYSTEM_PROMPT)
        except BaseException:
            conn.close()
            raise

    # -- lifecycle -------------------------------------------------------------------
    @locked
    def close(self):
        """Close the connection (idempotent); the last close checkpoints the WAL."""
        if not self._closed:
            self._closed = True
            self.db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- helpers (callers hold the lock) -----------------------------------------------
    def _rows(self, sql, params=None):
        return list(self.db.query(sql, params))

    def _now(self):
        """Strictly increasing UTC timestamps, so 'newest first' never ties in this process."""
        now = datetime.now(timezone.utc)
        if now <= self._last_ts:
            now = self._last_ts + timedelta(microseconds=1)
        self._last_ts = now
        return now.isoformat(timespec="microseconds")

    def _insert_prompt(self, text, owner=None):
        """owner None (or ''): the app's shared prompt; else that user's own (--auth)."""
        cur = self.db.execute(
            "INSERT INTO system_prompts (text, created_at, owner) VALUES (?, ?, ?)",
            [text, self._now(), owner or None],
        )
        return {"id": cur.lastrowid, "text": text}

    def _current_prompt(self, owner=None):
        """The user's newest own prompt, else the app's newest (a new user starts from it)."""
        if owner:
            rows = self._rows(
                "SELECT id, text FROM system_prompts WHERE owner = ? ORDER BY id DESC LIMIT 1",
                [owner],
            )
            if rows:
                return rows[0]
        return self._rows(
            "SELECT id, text FROM system_prompts WHERE owner IS NULL ORDER BY id DESC LIMIT 1"
        )[0]

    def _conversation(self, conv_id, owner):
        rows = self._rows("SELECT * FROM conversations WHERE id = ?", [conv_id])
        if not rows:
            raise KeyError(f"conversation {conv_id!r} not found")
        if owner is not None and rows[0]["owner"] != owner:
            raise PermissionError(f"conversation {conv_id!r} belongs to another user")
        return rows[0]

    def _effective_prompt(self, conv):
        if conv["system_prompt_override"] is not None:
            return conv["system_prompt_override"]
        if conv["system_prompt_id"] is None:
            return self._current_prompt()["text"]
        rows = self._rows(
            "SELECT text FROM system_prompts WHERE id = ?", [conv["system_prompt_id"]]
        )
        return rows[0]["text"]

    def _touch(self, conv_id, title=None):
        """Mark chat activity (sidebar order); optionally set the title in the same write."""
        self.db.execute(
            "UPDATE conversations SET updated_at = ?, title = coalesce(?, title) WHERE id = ?",
            [self._now(), title, conv_id],
        )
