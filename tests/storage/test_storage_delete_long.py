"""Issue #12 item 6: a conversation of any length can be deleted.

Messages chain through parent_id with ON DELETE CASCADE; deleting the root used to cascade one
trigger level per message and hit SQLite's trigger-depth limit (1,000) at ~1,000 messages, so
nothing was deleted. 5,000 messages, one branch point, stats and search rows must all go.
"""

from storage import Storage

N = 5000


def _long_chat(store, owner=""):
    conv = store.create_conversation(owner=owner)
    cid = conv["id"]
    now = "2026-01-01T00:00:00+00:00"
    with store._lock, store.db.atomic():  # fast bulk fill of real rows (same schema)
        parent = None
        for i in range(N):
            role = "user" if i % 2 == 0 else "assistant"
            parent = store._insert_message(
                cid, parent, role, f"needle{i % 7} message {i}", None, "complete", now
            )
    last = store.get_messages(cid)[-1]
    store.add_reply_stats(last["id"], prompt_tokens=3, output_tokens=2)
    store.add_sibling(store.get_messages(cid)[N // 2]["id"], "a branch in the middle")
    return cid


def test_delete_5000_message_conversation(store, db_path):
    keep = store.create_conversation()
    store.add_message(keep["id"], "user", "needle0 keep me")
    cid = _long_chat(store)
    assert len(store.get_messages(cid)) == N // 2 + 1
    store.delete_conversation(cid)
    count = lambda sql, p=(): store.db.execute(sql, p).fetchone()[0]
    assert count("SELECT count(*) FROM messages WHERE conversation_id = ?", [cid]) == 0
    assert count("SELECT count(*) FROM messages") == 1
    assert count("SELECT count(*) FROM reply_stats") == 0
    assert [c["id"] for c in store.list_conversations(query="needle0")] == [keep["id"]]
    assert count("SELECT count(*) FROM messages_fts") == 1
    store.close()
    with Storage(db_path) as again:  # and it stays deleted after reopening
        assert [c["id"] for c in again.list_conversations()] == [keep["id"]]
