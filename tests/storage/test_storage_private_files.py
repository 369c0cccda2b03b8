"""Issue #12 item 12 (storage side): the history DB and exports are private to their owner.

The DB and its WAL files were 0644 and exports stayed 0644 in a shared temp folder forever.
"""

import os
import stat
import time

import pytest

from storage import Storage
from storage.exports import PrivateExports


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_database_folder_and_files_are_private(tmp_path):
    db = tmp_path / "new" / "chat.db"
    with Storage(db) as s:
        conv = s.create_conversation()
        s.add_message(conv["id"], "user", "secret")
        assert _mode(db.parent) == 0o700
        for p in (db, f"{db}-wal", f"{db}-shm"):
            assert os.path.exists(p) and _mode(p) == 0o600, p


def test_existing_world_readable_database_is_tightened(tmp_path):
    db = tmp_path / "chat.db"
    Storage(db).close()
    os.chmod(db, 0o644)
    with Storage(db) as s:
        s.create_conversation()
        assert _mode(db) == 0o600
        assert _mode(f"{db}-wal") == 0o600


def test_exports_are_private_separate_and_cleaned_up(tmp_path):
    ex = PrivateExports(tmp_path / "exports", max_age_s=60)
    a = ex.write("My chat.json", '{"x": 1}').path
    b = ex.write("My chat.json", "# second").path
    assert a != b and a.name == b.name == "My chat.json"
    assert a.read_text() == '{"x": 1}' and b.read_text() == "# second"
    assert _mode(ex.root) == 0o700
    for p in (a, b):
        assert _mode(p) == 0o600 and _mode(p.parent) == 0o700
    old = time.time() - 3600
    os.utime(a.parent, (old, old))
    assert ex.cleanup() == 1
    assert not a.exists() and b.exists()
    c = ex.write("later.md", b"bytes").path  # writing also sweeps old ones
    assert c.read_bytes() == b"bytes"
    ex.close()
    assert not ex.root.exists()


def test_default_root_is_a_fresh_private_temp_folder():
    ex = PrivateExports()
    try:
        assert _mode(ex.root) == 0o700
        assert _mode(ex.write("x.json", "{}").path) == 0o600
    finally:
        ex.close()


@pytest.mark.parametrize(
    "name", ["../evil.json", "/etc/passwd", "a/b.md", ".hidden", "..", "", " ", "a\\b.json", None]
)
def test_export_names_cannot_escape_the_folder(tmp_path, name):
    ex = PrivateExports(tmp_path / "exports")
    with pytest.raises(ValueError):
        ex.write(name, "data")
    assert list(ex.root.iterdir()) == []


def test_an_export_opens_only_for_its_owner_and_only_while_it_exists(tmp_path):
    ex = PrivateExports(tmp_path / "exports", max_age_s=60)
    mine = ex.write("alice.json", "{}", owner="alice")
    local = ex.write("local.md", "# hi")  # no --auth: owner None
    assert len(mine.token) >= 20 and mine.token != local.token
    assert ex.open(mine.token, "alice") == mine
    assert ex.open(mine.token, "bob") is None  # another user: same answer as no export
    assert ex.open(mine.token, None) is None
    assert ex.open("not-a-token", "alice") is None
    assert ex.open(local.token, None) == local and ex.open(local.token, "alice") is None
    old = time.time() - 3600
    os.utime(mine.path.parent, (old, old))
    ex.cleanup()
    assert ex.open(mine.token, "alice") is None  # swept: gone for its owner too
