"""StructuredSpec: the constraint a request asks for, as plain data (no grammar library needed).

Kinds: "json_schema" (value: a JSON-schema dict), "json_object" (any JSON object), "regex" (value:
a pattern the whole output must match), "choice" (value: a list of strings, the output is exactly
one of them), "grammar" (value: a Lark grammar in llguidance's dialect; `%json {...}` embeds a
schema).

`trigger` makes it lazy (as llama.cpp's tool-call grammars): the output is free text until it
contains the trigger string, and only what follows the trigger is constrained. That is how a tool
call may follow free text without the text itself being constrained.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
MAX_SPEC_CHARS = 200_000  # a schema / grammar larger than this is refused before compiling


class StructuredUnavailable(ValueError):
    """The grammar library is not installed: structured requests are refused, nothing else is."""


@dataclass(frozen=True)
class StructuredSpec:
    kind: str
    value: object = None
    trigger: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(
                f"structured: kind must be one of {', '.join(KINDS)} (got {self.kind!r})"
            )
        v = self.value
        if self.kind == "json_schema" and not isinstance(v, (dict, bool)):
            raise ValueError("structured: a json_schema must be a JSON object")
        if self.kind in ("regex", "grammar") and (not isinstance(v, str) or not v):
            raise ValueError(f"structured: a {self.kind} must be a non-empty string")
        if self.kind == "choice" and (
            not isinstance(v, (list, tuple))
            or not v
            or not all(isinstance(c, str) and c for c in v)
        ):
            raise ValueError("structured: choice must be a non-empty list of non-empty strings")
        if self.trigger is not None and (not isinstance(self.trigger, str) or not self.trigger):
            raise ValueError("structured: trigger must be a non-empty string")
        if len(self.key()) > MAX_SPEC_CHARS:
            raise ValueError(
                f"structured: the constraint is larger than {MAX_SPEC_CHARS} characters"
            )

    def key(self) -> str:
        """A canonical string naming the constraint: the compile cache's key."""
        return json.dumps([self.kind, self.value, self.trigger], sort_keys=True, default=list)
