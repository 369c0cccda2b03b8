"""The chat's "reply format" choice (Sampling settings): free text, any JSON object, or JSON that
matches a pasted schema. It maps to the engine's StructuredSpec, the same constrained decoding
path as /v1's response_format (engine/sampling/structured/), so a chat reply can be held to a schema too."""

from __future__ import annotations

import json

import gradio as gr

from engine.sampling.structured import StructuredSpec

FREE, JSON, SCHEMA = "Free text", "JSON", "JSON matching a schema"
CHOICES = [FREE, JSON, SCHEMA]
MAX_SCHEMA_CHARS = 20_000


def spec(choice: str | None, schema_text: str | None) -> StructuredSpec | None:
    """The constraint for the widgets' values; gr.Error (nothing stored, nothing sent) when the
    pasted schema is not a JSON object."""
    if choice in (None, "", FREE):
        return None
    if choice == JSON:
        return StructuredSpec("json_object")
    if choice != SCHEMA:
        raise gr.Error(f"Unknown reply format {choice!r}", title="Not accepted")
    text = (schema_text or "").strip()
    if not text:
        raise gr.Error(
            "Paste a JSON schema for the reply format (or choose Free text / JSON).",
            title="Not accepted",
        )
    if len(text) > MAX_SCHEMA_CHARS:
        raise gr.Error(
            f"The schema is longer than {MAX_SCHEMA_CHARS} characters.", title="Not accepted"
        )
    try:
        schema = json.loads(text)
        return StructuredSpec("json_schema", schema)
    except ValueError as e:
        raise gr.Error(f"The reply-format schema is not valid: {e}", title="Not accepted") from None
