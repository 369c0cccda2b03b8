"""Export a conversation to JSON / Markdown and import JSON back as a new conversation.

The JSON holds every message (all branches, in creation order, with parent ids), so an
import rebuilds the same tree, plus the branch on screen (`active_branch`: its message ids, root
first, and `active_message_id`, the version the user selected), so the import shows the branch
that was exported, not merely the newest leaf. The Markdown export is the branch on screen.
Import validates the whole document before writing anything and then writes in one transaction.

`TransferMixin` is the Storage's own export / import part (as MessagesMixin is its message part):
it reads and writes through the same private helpers as the rest of the class, under the
Storage lock (its public methods are @locked), so no other module calls into the Storage's
internals.
"""

import json

from . import schema
from .base import locked
from .md_fences import close_open_fence

FORMAT = "llm-chat-conversation"
VERSION = 1
_MESSAGE_FIELDS = (
    "id",
    "parent_id",
    "role",
    "content",
    "token_ids",
    "status",
    "created_at",
    "stats",
)


def _stats_line(stats):
    parts = []
    if stats.get("output_tokens") is not None:
        parts.append(f"{stats['output_tokens']} tokens")
    if stats.get("tokens_per_s") is not None:
        parts.append(f"{stats['tokens_per_s']:.1f} tok/s")
    if stats.get("ttft_s") is not None:
        parts.append(f"TTFT {stats['ttft_s']:.2f} s")
    if stats.get("prompt_tokens") is not None:
        cached = stats.get("cached_tokens")
        cached = f" ({cached} cached)" if cached is not None else ""
        parts.append(f"prompt {stats['prompt_tokens']}{cached}")
    if stats.get("served_by"):
        parts.append(f"served by {stats['served_by']}")
    if stats.get("finish_reason"):
        parts.append(f"finish: {stats['finish_reason']}")
    return "_" + " · ".join(parts) + "_" if parts else ""


def _parse_message(raw, seen):
    if not isinstance(raw, dict):
        raise ValueError("must be an object")
    msg_id = raw.get("id")
    if not isinstance(msg_id, (int, str)) or isinstance(msg_id, bool):
        raise ValueError("id must be an integer or string")
    if msg_id in seen:
        raise ValueError(f"duplicate id {msg_id!r}")
    parent = raw.get("parent_id")
    if parent is not None and (
        not isinstance(parent, (int, str)) or isinstance(parent, bool) or parent not in seen
    ):
        raise ValueError(f"parent_id {parent!r} does not name an earlier message")
    created = raw.get("created_at")
    if created is not None and not isinstance(created, str):
        raise ValueError("created_at must be a string")
    stats = raw.get("stats")
    return {
        "id": msg_id,
        "parent_id": parent,
        "role": schema.check_choice("role", raw.get("role"), schema.ROLES),
        "content": schema.check_text("content", raw.get("content")),
        "token_ids": schema.check_token_ids(raw.get("token_ids")),
        "status": schema.check_choice("status", raw.get("status", "complete"), schema.STATUSES),
        "created_at": created,
        "stats": schema.check_stats(stats) if stats is not None else None,
    }


def parse_export(data):
    """Validate an export (dict or JSON text); returns (title, system_prompt, messages, the id of
    the selected message or None). Exports older than `active_message_id` have none."""
    if isinstance(data, (str, bytes, bytearray)):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("export must be a JSON object")
    if data.get("format") != FORMAT:
        raise ValueError(f"not a conversation export (format must be {FORMAT!r})")
    if data.get("version") != VERSION:
        raise ValueError(f"unsupported export version {data.get('version')!r} (expected {VERSION})")
    conv = data.get("conversation")
    if not isinstance(conv, dict):
        raise ValueError("conversation must be an object")
    title = conv.get("title")
    if not isinstance(title, str) or not title.strip():
        raise ValueError("conversation.title must be a non-empty string")
    prompt = data.get("system_prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError("system_prompt must be a string or null")
    raw_messages = data.get("messages")
    if not isinstance(raw_messages, list):
        raise ValueError("messages must be a list")
    messages, seen = [], set()
    for i, raw in enumerate(raw_messages):
        try:
            msg = _parse_message(raw, seen)
        except ValueError as exc:
            raise ValueError(f"messages[{i}]: {exc}") from None
        seen.add(msg["id"])
        messages.append(msg)
    active = data.get("active_message_id")
    if active is not None and (isinstance(active, bool) or active not in seen):
        raise ValueError(f"active_message_id {active!r} does not name a message")
    return title.strip(), prompt, messages, active


class TransferMixin:
    """Export / import methods of Storage (see the module docstring)."""

    @locked
    def export_json(self, conv_id, owner=None):
        conv = self._conversation(conv_id, owner)
        messages = self._conversation_messages(conv_id)
        return {
            "format": FORMAT,
            "version": VERSION,
            "conversation": {k: conv[k] for k in ("id", "title", "created_at", "updated_at")},
            "system_prompt": self._effective_prompt(conv),
            "messages": [{k: m[k] for k in _MESSAGE_FIELDS} for m in messages],
            "active_message_id": self._selected(conv_id),
            "active_branch": [m["id"] for m in self._branch(conv_id)],
        }

    @locked
    def export_markdown(self, conv_id, owner=None):
        """The active branch as readable Markdown (other branches are in the JSON export)."""
        conv = self._conversation(conv_id, owner)
        dates = f"_Created {conv['created_at']}, last updated {conv['updated_at']}_"
        lines = [f"# {conv['title']}", "", dates, ""]
        prompt = self._effective_prompt(conv)
        if prompt.strip():
            lines += (
                ["**System prompt:**", ""] + [f"> {line}" for line in prompt.splitlines()] + [""]
            )
        for msg in self._branch(
            conv_id
        ):  # the branch on screen (active_branch), not the newest leaf
            # each text exactly as written, with a closing fence after it if it ends inside a code
            # block (a reply cut by max tokens): else the rest of the document would read as code
            lines += [f"## {msg['role'].capitalize()}", "", close_open_fence(msg["content"]), ""]
            if msg["status"] != "complete":
                lines += [f"_({msg['status']})_", ""]
            if msg["stats"] and _stats_line(msg["stats"]):
                lines += [_stats_line(msg["stats"]), ""]
        return "\n".join(lines).rstrip() + "\n"

    @locked
    def import_json(self, data, owner=""):
        """Create a new conversation from an export. A prompt text matching a stored shared
        prompt binds to it; any other text becomes this conversation's override."""
        schema.check_text("owner", owner)
        title, prompt, messages, active = parse_export(data)
        current = self._current_prompt()
        prompt_id, override = current["id"], None
        if prompt is not None and prompt != current["text"]:
            match = self._rows(
                "SELECT id FROM system_prompts WHERE text = ? ORDER BY id DESC LIMIT 1", [prompt]
            )
            if match:
                prompt_id = match[0]["id"]
            else:
                override = prompt
        with self.db.atomic():
            conv = self._insert_conversation(owner, title, prompt_id, override)
            new_ids = {}
            for msg in messages:
                new_ids[msg["id"]] = self._insert_message(
                    conv["id"],
                    new_ids.get(msg["parent_id"]),
                    msg["role"],
                    msg["content"],
                    msg["token_ids"],
                    msg["status"],
                    msg["created_at"],
                )
                if msg["stats"] is not None:
                    self._write_stats(new_ids[msg["id"]], msg["stats"])
            if active is not None:  # the branch that was on screen, not the newest leaf
                self.db.execute(
                    "INSERT INTO active_branch (conversation_id, message_id) VALUES (?, ?)",
                    [conv["id"], new_ids[active]],
                )
        return self._conversation(conv["id"], None)
