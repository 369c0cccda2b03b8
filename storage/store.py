"""Storage: the whole persistence API the UI codes against (see base.py for threading and
durability, messages.py for the branch rule)."""

import re
import uuid

from . import schema
from .base import StoreBase, locked
from .messages import MessagesMixin
from .prompts import PromptsMixin
from .transfer import TransferMixin
from .schema import NEW_CHAT_TITLE


def _fts_query(text):
    """Every word of the query must start a word in the message (quoted: no FTS syntax)."""
    return " ".join(f'"{word}"*' for word in re.findall(r"\w+", text))


class Storage(MessagesMixin, PromptsMixin, TransferMixin, StoreBase):
    """All chat persistence. Methods taking ``owner`` raise PermissionError when it is given
    and differs from the conversation's owner (None = no check); unknown ids raise KeyError."""

    def _insert_conversation(self, owner, title, prompt_id, override):
        now = self._now()
        row = {
            "id": str(uuid.uuid4()),
            "owner": owner,
            "title": title,
            "system_prompt_id": prompt_id,
            "system_prompt_override": override,
            "thinking": None,
            "created_at": now,
            "updated_at": now,
        }
        self.db.execute(
            "INSERT INTO conversations (id, owner, title, system_prompt_id, system_prompt_override,"
            " created_at, updated_at) VALUES (:id, :owner, :title, :system_prompt_id,"
            " :system_prompt_override, :created_at, :updated_at)",
            row,
        )
        return row

    # -- system prompt -------------------------------------------------------------------
    @locked
    def get_system_prompt(self, owner=None):
        """The current shared prompt for `owner` (their own under --auth, else the app's newest;
        a default is seeded on first start)."""
        return self._current_prompt(owner)

    @locked
    def set_system_prompt(self, text, owner=None):
        """Add a new shared prompt (owner: that user's only); existing conversations keep the id
        they were created with, and other users' new chats are unaffected."""
        return self._insert_prompt(schema.check_text("text", text), owner)

    @locked
    def users_with_own_prompt(self):
        """[(owner, text of their current own prompt)], most recently saved first (start-up
        re-pins them, newest first, while the pin cap allows)."""
        rows = self._rows(
            "SELECT p.owner, p.text FROM system_prompts p JOIN "
            "(SELECT owner, MAX(id) AS id FROM system_prompts WHERE owner IS NOT NULL "
            "GROUP BY owner) last ON last.id = p.id ORDER BY p.id DESC"
        )
        return [(r["owner"], r["text"]) for r in rows]

    # -- conversations -------------------------------------------------------------------
    @locked
    def create_conversation(
        self, owner="", title=NEW_CHAT_TITLE, system_prompt_id=None, system_prompt_override=None
    ):
        """New conversation bound to ``system_prompt_id`` (default: the current shared prompt)."""
        schema.check_text("owner", owner)
        if not schema.check_text("title", title).strip():
            raise ValueError("title must not be empty")
        schema.check_text("system_prompt_override", system_prompt_override, allow_none=True)
        if system_prompt_id is None:
            system_prompt_id = self._current_prompt(owner)["id"]
        elif not self._rows("SELECT id FROM system_prompts WHERE id = ?", [system_prompt_id]):
            raise KeyError(f"system prompt {system_prompt_id!r} not found")
        return self._insert_conversation(
            owner, title.strip(), system_prompt_id, system_prompt_override
        )

    @locked
    def get_conversation(self, conv_id, owner=None):
        return self._conversation(conv_id, owner)

    @locked
    def list_conversations(self, owner=None, query=None):
        """Newest-updated first. ``query`` matches a substring of the title, or messages (any
        branch) containing words that start with every word of the query."""
        where, params = ["(:owner IS NULL OR owner = :owner)"], {"owner": owner}
        if query and query.strip():
            match = ["title LIKE :like ESCAPE '\\'"]
            escaped = re.sub(r"([\\%_])", r"\\\1", query.strip())
            params["like"] = f"%{escaped}%"
            fts = _fts_query(query)
            if fts:
                match.append(
                    "id IN (SELECT m.conversation_id FROM messages_fts"
                    " JOIN messages m ON m.id = messages_fts.rowid WHERE messages_fts MATCH :fts)"
                )
                params["fts"] = fts
            where.append("(" + " OR ".join(match) + ")")
        sql = f"SELECT * FROM conversations WHERE {' AND '.join(where)}"
        return self._rows(sql + " ORDER BY updated_at DESC, rowid DESC", params)

    @locked
    def rename_conversation(self, conv_id, title, owner=None):
        """Rename without bumping updated_at (renaming is not chat activity)."""
        self._conversation(conv_id, owner)
        if not schema.check_text("title", title).strip():
            raise ValueError("title must not be empty")
        self.db.execute("UPDATE conversations SET title = ? WHERE id = ?", [title.strip(), conv_id])
        return self._conversation(conv_id, None)

    @locked
    def delete_conversation(self, conv_id, owner=None):
        """Delete a conversation; its messages and stats go with it (ON DELETE CASCADE).

        The parent links are cut first, in the same transaction: otherwise the parent_id cascade
        recurses one trigger level per message and SQLite stops at depth 1,000, keeping them all.
        """
        self._conversation(conv_id, owner)
        with self.db.atomic():
            self.db.execute(
                "UPDATE messages SET parent_id = NULL WHERE conversation_id = ? AND parent_id IS NOT NULL",
                [conv_id],
            )
            self.db.execute("DELETE FROM conversations WHERE id = ?", [conv_id])

    @locked
    def set_conversation_system_prompt(self, conv_id, override, owner=None):
        """Give one conversation its own prompt text; ``None`` returns it to its shared prompt."""
        self._conversation(conv_id, owner)
        schema.check_text("override", override, allow_none=True)
        self.db.execute(
            "UPDATE conversations SET system_prompt_override = ? WHERE id = ?", [override, conv_id]
        )
        return self._conversation(conv_id, None)

    @locked
    def set_conversation_thinking(self, conv_id, thinking, owner=None):
        """A conversation's "Think" switch (a thinking model's chat template's enable_thinking):
        True / False, or None for the template's default."""
        self._conversation(conv_id, owner)
        if thinking is not None and not isinstance(thinking, bool):
            raise ValueError(f"thinking must be true, false or null; got {thinking!r}")
        value = None if thinking is None else int(thinking)
        self.db.execute("UPDATE conversations SET thinking = ? WHERE id = ?", [value, conv_id])
        return self._conversation(conv_id, None)

    @locked
    def conversation_system_prompt(self, conv_id, owner=None):
        """The prompt text to send to the model: the override, else the bound shared prompt."""
        return self._effective_prompt(self._conversation(conv_id, owner))
