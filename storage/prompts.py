"""A user's own named system prompts, offered next to the built-in presets (storage/presets.py).

Why a separate table from system_prompts: those rows are the prompts conversations were created
with (kept forever, referenced by id); these are a user's library of reusable texts, which they
may overwrite by name. Owner '' is the local single user (no --auth).
"""

from __future__ import annotations

from . import schema
from .base import locked

MAX_PROMPT_NAME = 80


class PromptsMixin:
    @locked
    def save_named_prompt(self, owner, name, text):
        """Save (or overwrite) `owner`'s prompt called `name`."""
        schema.check_text("owner", owner)
        name = schema.check_text("name", name).strip()
        if not name or len(name) > MAX_PROMPT_NAME:
            raise ValueError(f"a prompt name must be 1-{MAX_PROMPT_NAME} characters")
        if not schema.check_text("text", text).strip():
            raise ValueError("the prompt text is empty")
        self.db.execute(
            "INSERT INTO saved_prompts (owner, name, text, created_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (owner, name) DO UPDATE SET text = excluded.text",
            [owner, name, text, self._now()],
        )
        return {"name": name, "text": text}

    @locked
    def named_prompts(self, owner):
        """`owner`'s saved prompts, oldest first: [{"name", "text"}]."""
        return self._rows(
            "SELECT name, text FROM saved_prompts WHERE owner = ? ORDER BY id", [owner]
        )

    @locked
    def delete_named_prompt(self, owner, name):
        cur = self.db.execute(
            "DELETE FROM saved_prompts WHERE owner = ? AND name = ?", [owner, name]
        )
        return cur.rowcount > 0
