"""Schema, migrations and value checks shared by the store and the import code.

Migrations use sqlite-utils' built-in ``Migrations`` (recorded in ``_sqlite_migrations``),
so reopening a database applies only what is new. Never edit a released migration: add one.
"""

import math

from sqlite_utils import Migrations

from .presets import DEFAULT_SYSTEM_PROMPT  # noqa: E402,F401  (a real ~550-token policy; see presets.py)

NEW_CHAT_TITLE = "New chat"
ROLES = ("system", "user", "assistant")
STATUSES = ("complete", "stopped", "error")
INT_STATS = (
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "cached_blocks",
    "spec_accepted_tokens",
    "decode_steps",
    "reasoning_tokens",
)
FLOAT_STATS = ("ttft_s", "tokens_per_s")
TEXT_STATS = ("finish_reason", "served_by")
STAT_FIELDS = INT_STATS + FLOAT_STATS + TEXT_STATS

MIGRATIONS = Migrations("chat_storage")

# Literal SQL on purpose: a migration must not change when Python constants do.
_TABLES = [
    """CREATE TABLE system_prompts (
        id INTEGER PRIMARY KEY,
        text TEXT NOT NULL,
        created_at TEXT NOT NULL)""",
    """CREATE TABLE conversations (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL DEFAULT '',
        title TEXT NOT NULL,
        system_prompt_id INTEGER REFERENCES system_prompts(id),
        system_prompt_override TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL)""",
    "CREATE INDEX conversations_owner_updated ON conversations(owner, updated_at)",
    """CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content TEXT NOT NULL,
        token_ids TEXT,
        status TEXT NOT NULL DEFAULT 'complete'
            CHECK (status IN ('complete', 'stopped', 'error')),
        created_at TEXT NOT NULL)""",
    "CREATE INDEX messages_conversation ON messages(conversation_id, id)",
    "CREATE INDEX messages_parent ON messages(parent_id)",
    """CREATE TABLE reply_stats (
        message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
        prompt_tokens INTEGER,
        cached_tokens INTEGER,
        output_tokens INTEGER,
        ttft_s REAL,
        tokens_per_s REAL,
        finish_reason TEXT)""",
]


@MIGRATIONS()
def m001_tables(db):
    for sql in _TABLES:
        db.execute(sql)


@MIGRATIONS()
def m002_message_search(db):
    # External-content FTS5 keyed on messages.id (an INTEGER PRIMARY KEY, so rowids are
    # stable across VACUUM); sqlite-utils' triggers keep it in step, cascades included.
    db.table("messages").enable_fts(["content"], create_triggers=True)


@MIGRATIONS()
def m003_user_prompts(db):
    # per-user shared prompts (--auth): a row with an owner is that user's; owner NULL = the app's.
    # saved_prompts: a user's own named prompts, offered next to the built-in presets.
    db.execute("ALTER TABLE system_prompts ADD COLUMN owner TEXT")
    db.execute("""CREATE TABLE saved_prompts (
        id INTEGER PRIMARY KEY, owner TEXT NOT NULL, name TEXT NOT NULL, text TEXT NOT NULL,
        created_at TEXT NOT NULL, UNIQUE (owner, name))""")


@MIGRATIONS()
def m004_reply_cached_blocks(db):
    # shared prompt blocks a reply reused ("reused 312 cached tokens (19 shared blocks)")
    db.execute("ALTER TABLE reply_stats ADD COLUMN cached_blocks INTEGER")


@MIGRATIONS()
def m005_active_branch(db):
    # Which branch a conversation shows: the ancestry of the newest leaf under `message_id`.
    # No row means "the newest leaf of the conversation" (the state right after any new message).
    db.execute(
        """CREATE TABLE active_branch (
            conversation_id TEXT PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
            message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE)"""
    )


@MIGRATIONS()
def m006_reply_speculative(db):
    # speculative decoding (--speculative): "17 accepted from drafts (1.7 tokens/step)"
    db.execute("ALTER TABLE reply_stats ADD COLUMN spec_accepted_tokens INTEGER")
    db.execute("ALTER TABLE reply_stats ADD COLUMN decode_steps INTEGER")


@MIGRATIONS()
def m007_reply_served_by(db):
    # which replica served a reply when the app spreads over several (--backend ... --backend ...)
    db.execute("ALTER TABLE reply_stats ADD COLUMN served_by TEXT")


@MIGRATIONS()
def m008_thinking(db):
    # a thinking model's reply (issue 45): its reasoning tokens (NULL: the reply has no reasoning
    # block); a conversation's "Think" switch (NULL: the chat template's default)
    db.execute("ALTER TABLE reply_stats ADD COLUMN reasoning_tokens INTEGER")
    db.execute("ALTER TABLE conversations ADD COLUMN thinking INTEGER")


def check_choice(name, value, choices):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


def check_text(name, value, allow_none=False):
    if value is None and allow_none:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string; got {type(value).__name__}")
    return value


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def check_token_ids(value):
    """None, or a list of non-negative ints (the ids the model generated, reused next turn)."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(_is_int(t) and t >= 0 for t in value):
        raise ValueError("token_ids must be a list of non-negative integers or None")
    return list(value)


def check_stats(stats):
    """Validate reply statistics; unknown names are errors so typos don't vanish silently."""
    if not isinstance(stats, dict):
        raise ValueError("stats must be an object")
    unknown = set(stats) - set(STAT_FIELDS)
    if unknown:
        raise ValueError(
            f"unknown stats {sorted(map(str, unknown))}; known: {', '.join(STAT_FIELDS)}"
        )
    for name, value in stats.items():
        if value is None:
            continue
        if name in INT_STATS and not (_is_int(value) and value >= 0):
            raise ValueError(f"{name} must be a non-negative integer; got {value!r}")
        if name in FLOAT_STATS and not (
            (_is_int(value) or isinstance(value, float)) and math.isfinite(value) and value >= 0
        ):
            raise ValueError(f"{name} must be a non-negative number; got {value!r}")
        if name in TEXT_STATS and not (isinstance(value, str) and len(value) <= 200):
            raise ValueError(f"{name} must be a string of at most 200 characters; got {value!r}")
    return dict(stats)
