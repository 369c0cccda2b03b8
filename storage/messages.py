"""Messages, reply stats and branches.

Messages form a tree through parent_id. The active branch is the ancestry of the most
recently created message of the conversation (highest id). A message's children are always
created after it, so that message is a leaf: the active path is "the newest leaf and its
ancestors". Editing a past message or regenerating a reply adds a sibling (``add_sibling``);
the new branch becomes active and the old one stays in the database. Continuing an older
branch (``add_message`` with its leaf as ``parent_id``) makes that branch active again.

Browsing versions (``< 2/3 >``) without writing a message: ``select_branch(message_id)`` records
that message in ``active_branch``; the active path is then the ancestry of the newest leaf under
it. Any new message clears that choice (the new message is the newest leaf, hence active).
The n alternatives of one reply are stored as siblings, so picking one is a ``select_branch``.
The conversation title follows the first user message of the active branch while the user has
not renamed the chat (the title still equals the one derived from the old first message).
"""

import json
import re

from . import schema
from .base import locked
from .errors import write_to_existing
from .schema import NEW_CHAT_TITLE, ROLES, STAT_FIELDS, STATUSES

_UNSET = object()
_TITLE_CHARS = 40
# added later (m004: cached_blocks; m006: the speculative decoding pair): left out when unset, so
# an older reply's stats read as they always did
_OPTIONAL_STATS = (
    "cached_blocks",
    "spec_accepted_tokens",
    "decode_steps",
    "served_by",
    "reasoning_tokens",
)
_STATS_SELECT = ", ".join(f"s.{f} AS stat_{f}" for f in STAT_FIELDS)


# Documents attached to a message are stored before its text, each in this wrapper
# (ui/chat/documents.py writes them; this is the one pattern that reads them back).
DOCUMENT_BLOCK = re.compile(r'<document name="([^"\n]{1,200})">\n(.*?)\n</document>\n\n', re.S)


def typed_text(content):
    """(names of the documents a message starts with, the text the user typed after them)."""
    names, pos = [], 0
    while (m := DOCUMENT_BLOCK.match(content, pos)) is not None:
        names.append(m.group(1))
        pos = m.end()
    return names, content[pos:]


def title_from(content):
    """First ~40 characters of what the user typed, cut at a word boundary, for the sidebar; a
    message that is only attached documents is titled by their names (issue 47: the title was the
    `<document name=...>` wrapper)."""
    names, typed = typed_text(content)
    text = " ".join(typed.split()) or ", ".join(names)
    if len(text) <= _TITLE_CHARS:
        return text
    cut = text[:_TITLE_CHARS]
    if " " in cut:
        cut = cut.rsplit(" ", 1)[0]
    return cut + "…"


class MessagesMixin:
    """Message methods of Storage; relies on StoreBase for the lock and conversation checks."""

    def _message(self, message_id, owner):
        rows = self._message_rows("m.id = ?", [message_id])
        if not rows:
            raise KeyError(f"message {message_id!r} not found")
        self._conversation(rows[0]["conversation_id"], owner)
        return rows[0]

    def _message_rows(self, where, params):
        rows = self._rows(
            f"SELECT m.*, s.message_id AS has_stats, {_STATS_SELECT} FROM messages m "
            f"LEFT JOIN reply_stats s ON s.message_id = m.id WHERE {where} ORDER BY m.id",
            params,
        )
        for row in rows:
            stats = {f: row.pop(f"stat_{f}") for f in STAT_FIELDS}
            for f in _OPTIONAL_STATS:  # absent on replies that never had them
                if stats.get(f) is None:
                    stats.pop(f, None)
            row["stats"] = stats if row.pop("has_stats") is not None else None
            row["token_ids"] = json.loads(row["token_ids"]) if row["token_ids"] else None
        return rows

    def _conversation_messages(self, conv_id):
        return self._message_rows("m.conversation_id = ?", [conv_id])

    def _selected(self, conv_id):
        rows = self._rows(
            "SELECT message_id FROM active_branch WHERE conversation_id = ?", [conv_id]
        )
        return rows[0]["message_id"] if rows else None

    def _branch(self, conv_id, through=None):
        messages = self._conversation_messages(conv_id)
        if through is None:
            through = self._selected(conv_id)
        return self._active_path(messages, through)

    def _follow_title(self, conv_id, old_path, new_path):
        """Auto titles follow the first user message of the active branch; a renamed one stays."""

        def first(path):
            return next(
                (m["content"] for m in path if m["role"] == "user" and m["content"].strip()), None
            )

        old, new = first(old_path), first(new_path)
        if old is None or new is None or old == new:
            return None
        conv = self._rows("SELECT title FROM conversations WHERE id = ?", [conv_id])[0]
        return title_from(new) if conv["title"] == title_from(old) else None

    @staticmethod
    def _active_path(messages, through=None):
        """Ancestry of the newest leaf (of ``through``'s subtree when given)."""
        if not messages:
            return []
        by_id = {m["id"]: m for m in messages}
        leaf = messages[-1]
        if through is not None:
            if through not in by_id:
                raise KeyError(f"message {through!r} is not in this conversation")
            subtree = {through}
            for m in messages:  # id order: a parent is always seen before its children
                if m["parent_id"] in subtree:
                    subtree.add(m["id"])
            leaf = by_id[max(subtree)]
        path = []
        while leaf is not None:
            path.append(leaf)
            leaf = by_id.get(leaf["parent_id"])
        return path[::-1]

    def _insert_message(
        self, conv_id, parent_id, role, content, token_ids, status, created_at=None
    ):
        tokens = json.dumps(token_ids) if token_ids is not None else None
        self.db.execute("DELETE FROM active_branch WHERE conversation_id = ?", [conv_id])
        cur = self.db.execute(
            "INSERT INTO messages (conversation_id, parent_id, role, content, token_ids, status,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [conv_id, parent_id, role, content, tokens, status, created_at or self._now()],
        )
        return cur.lastrowid

    def _write_stats(self, message_id, stats):
        self.db.execute(
            f"INSERT OR REPLACE INTO reply_stats (message_id, {', '.join(STAT_FIELDS)}) "
            f"VALUES (?, {', '.join('?' * len(STAT_FIELDS))})",
            [message_id] + [stats.get(f) for f in STAT_FIELDS],
        )

    # -- public -------------------------------------------------------------------------
    @write_to_existing
    @locked
    def add_message(
        self, conv_id, role, content, parent_id=None, token_ids=None, status="complete", owner=None
    ):
        """Store a message, committed at once. ``parent_id=None`` appends to the active branch.

        For a streamed reply, insert it with status "stopped" and set "complete" at the end,
        so a crash mid-stream leaves it honestly marked as cut short.
        """
        conv = self._conversation(conv_id, owner)
        schema.check_choice("role", role, ROLES)
        schema.check_text("content", content)
        schema.check_choice("status", status, STATUSES)
        token_ids = schema.check_token_ids(token_ids)
        if parent_id is None:
            branch = self._branch(conv_id)
            parent_id = branch[-1]["id"] if branch else None
        elif not self._rows(
            "SELECT id FROM messages WHERE id = ? AND conversation_id = ?", [parent_id, conv_id]
        ):
            raise ValueError(f"parent message {parent_id!r} is not in conversation {conv_id!r}")
        new_title = None
        if role == "user" and conv["title"] == NEW_CHAT_TITLE and content.strip():
            new_title = title_from(content)
        with self.db.atomic():
            message_id = self._insert_message(conv_id, parent_id, role, content, token_ids, status)
            self._touch(conv_id, new_title)
        return self._message(message_id, None)

    @write_to_existing
    @locked
    def add_sibling(self, message_id, content, token_ids=None, status="complete", owner=None):
        """New branch beside ``message_id`` (same parent and role); it becomes the active one.

        Edit-and-resend: ``add_sibling(user_msg_id, new_text)``, then
        ``add_message(conv_id, "assistant", ...)`` appends the new reply under it.
        Regenerate: ``add_sibling(old_reply_id, "", status="stopped")`` then stream into it.
        """
        old = self._message(message_id, owner)
        schema.check_text("content", content)
        schema.check_choice("status", status, STATUSES)
        token_ids = schema.check_token_ids(token_ids)
        conv_id = old["conversation_id"]
        before = self._branch(conv_id)
        with self.db.atomic():
            new_id = self._insert_message(
                conv_id, old["parent_id"], old["role"], content, token_ids, status
            )
            self._touch(conv_id, self._follow_title(conv_id, before, self._branch(conv_id)))
        return self._message(new_id, None)

    @write_to_existing
    @locked
    def select_branch(self, message_id, owner=None):
        """Show the branch through ``message_id`` (a version picked with ``< 2/3 >``, or the
        alternative the user continues with); returns the new active path."""
        msg = self._message(message_id, owner)
        conv_id = msg["conversation_id"]
        before = self._branch(conv_id)
        with self.db.atomic():
            self.db.execute(
                "INSERT OR REPLACE INTO active_branch (conversation_id, message_id) VALUES (?, ?)",
                [conv_id, message_id],
            )
            after = self._branch(conv_id)
            self._touch(conv_id, self._follow_title(conv_id, before, after))
        return after

    @write_to_existing
    @locked
    def update_message(
        self, message_id, content=_UNSET, token_ids=_UNSET, status=_UNSET, owner=None
    ):
        """Change content / token_ids / status (e.g. while streaming); committed at once."""
        msg = self._message(message_id, owner)
        changes = {}
        if content is not _UNSET:
            changes["content"] = schema.check_text("content", content)
        if token_ids is not _UNSET:
            ids = schema.check_token_ids(token_ids)
            changes["token_ids"] = json.dumps(ids) if ids is not None else None
        if status is not _UNSET:
            changes["status"] = schema.check_choice("status", status, STATUSES)
        if changes:
            sets = ", ".join(f"{col} = :{col}" for col in changes)
            with self.db.atomic():
                self.db.execute(
                    f"UPDATE messages SET {sets} WHERE id = :id", {**changes, "id": message_id}
                )
                self._touch(msg["conversation_id"])
        return self._message(message_id, None)

    @write_to_existing
    @locked
    def add_reply_stats(self, message_id, owner=None, **stats):
        """Record generation stats for a reply; a second call merges into the first."""
        msg = self._message(message_id, owner)
        merged = {**(msg["stats"] or {}), **schema.check_stats(stats)}
        self._write_stats(message_id, merged)
        return self._message(message_id, None)["stats"]

    @locked
    def get_message(self, message_id, owner=None):
        return self._message(message_id, owner)

    @locked
    def get_messages(self, conv_id, owner=None, through=None):
        """The active branch, root first. ``through``: show the branch containing that message
        (its newest descendant's ancestry), e.g. when the user flips to an older sibling."""
        self._conversation(conv_id, owner)
        return self._branch(conv_id, through)

    @locked
    def get_siblings(self, message_id, owner=None):
        """All versions of a message (same parent), oldest first, for "< 2/3 >" navigation."""
        msg = self._message(message_id, owner)
        return self._message_rows(
            "m.conversation_id = ? AND m.parent_id IS ?", [msg["conversation_id"], msg["parent_id"]]
        )

    @locked
    def branch_versions(self, conv_id, owner=None):
        """For every message with versions (same parent and role): message id -> the ids of all
        its versions, oldest first. One query, for drawing ``< 2/3 >`` on the active branch."""
        self._conversation(conv_id, owner)
        groups = {}
        for row in self._rows(
            "SELECT id, parent_id, role FROM messages WHERE conversation_id = ? ORDER BY id",
            [conv_id],
        ):
            groups.setdefault((row["parent_id"], row["role"]), []).append(row["id"])
        return {i: ids for ids in groups.values() if len(ids) > 1 for i in ids}

    @locked
    def count_messages(self, conv_id, owner=None):
        """Every stored message of the conversation, all branches (what a delete removes)."""
        self._conversation(conv_id, owner)
        return self._rows(
            "SELECT count(*) AS n FROM messages WHERE conversation_id = ?", [conv_id]
        )[0]["n"]
