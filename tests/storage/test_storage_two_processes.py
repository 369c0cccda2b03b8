"""Issue #12 item 14: another process deletes a conversation while this one streams a reply into it.

The delete runs in a real second Python process on the same SQLite file (WAL), as when two servers
share one database. Every later write to that conversation must raise ConversationDeletedError
(a KeyError, with a sentence a user can read) instead of "message 122 not found", store nothing,
and leave this process's store working for other conversations.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from storage import ConversationDeletedError

ROOT = Path(__file__).resolve().parents[2]


def _delete_in_other_process(db_path, conv_id):
    code = (
        "import sys; from storage import Storage\n"
        "with Storage(sys.argv[1]) as s: s.delete_conversation(sys.argv[2])"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(db_path), conv_id], cwd=ROOT, check=True, timeout=120
    )


def test_streaming_into_a_conversation_deleted_by_another_process(store, db_path):
    conv = store.create_conversation()
    other = store.create_conversation()
    user = store.add_message(conv["id"], "user", "Tell me a story.")
    reply = store.add_message(conv["id"], "assistant", "", status="stopped")
    store.update_message(reply["id"], content="Once upon")
    _delete_in_other_process(db_path, conv["id"])

    attempts = [
        lambda: store.update_message(reply["id"], content="Once upon a time"),
        lambda: store.update_message(reply["id"], status="complete"),
        lambda: store.add_reply_stats(reply["id"], output_tokens=4),
        lambda: store.add_message(conv["id"], "assistant", "late reply"),
        lambda: store.add_sibling(user["id"], "edited"),
    ]
    for attempt in attempts:
        with pytest.raises(ConversationDeletedError) as err:
            attempt()
        assert isinstance(err.value, KeyError)
        text = str(err.value)
        assert text.startswith("This conversation was deleted") and "another" in text
        assert not text.startswith("'")

    count = store.db.execute(
        "SELECT count(*) FROM messages WHERE conversation_id = ?", [conv["id"]]
    )
    assert count.fetchone()[0] == 0, "nothing may be written back into the deleted conversation"
    store.add_message(other["id"], "user", "still works")
    assert [m["content"] for m in store.get_messages(other["id"])] == ["still works"]


def test_foreign_key_race_is_reported_the_same_way(store):
    """The delete lands between our existence check and our INSERT (simulated with a trigger that
    deletes the conversation as the INSERT starts): the foreign-key failure is translated too."""
    conv = store.create_conversation()
    store.add_message(conv["id"], "user", "hi")
    store.db.execute(
        "CREATE TEMP TRIGGER vanish BEFORE INSERT ON messages BEGIN "
        "UPDATE messages SET parent_id = NULL WHERE conversation_id = NEW.conversation_id; "
        "DELETE FROM conversations WHERE id = NEW.conversation_id; END"
    )
    with pytest.raises(ConversationDeletedError):
        store.add_message(conv["id"], "assistant", "reply")
