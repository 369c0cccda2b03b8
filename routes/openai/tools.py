"""Tool calling on /v1/chat/completions for a chat template without tool support (the default
model's ChatML has none). The format, documented in docs/DESIGN.md ("Tool calls"):

- The tools are described in a system turn (`tool_system_text`): name, description, JSON schema.
- The model calls a tool by writing `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
  several calls (parallel_tool_calls) follow each other, one per line.
- Constrained to the tools' schemas (engine/sampling/structured): `required` / a named function constrain
  the whole reply to calls; `auto` is lazy: free text is not constrained, and only once the model
  writes `<tool_call>` is what follows held to the schemas (llama.cpp's "lazy grammar" idea).
  `none` describes no tools and parses nothing.
- History: an assistant turn's `tool_calls` are rendered back in the same markers, a `tool` turn
  as a user turn holding `<tool_response>...</tool_response>`.

`ToolCallParser` turns the generated text, as it streams, into content text and OpenAI's
tool-call deltas (index, id, name, argument fragments).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from engine.sampling.structured import StructuredSpec
from engine.sampling.structured.compiler import JSON_OPTIONS, closed_objects
from routes.openai.errors import APIError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_HEAD_RE = re.compile(r'^\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\S)')
MAX_TOOLS = 128


def _bad(msg: str, param: str = "tools"):
    return APIError(400, msg, param=param, code="invalid_value")


@dataclass
class ToolPlan:
    tools: list[dict]  # [{"name", "description", "parameters"}]
    choice: str  # "auto" | "none" | "required" | "function"
    named: str | None = None
    parallel: bool = True

    @property
    def parses(self) -> bool:
        return self.choice != "none"

    def callable(self) -> list[dict]:
        return [t for t in self.tools if self.named is None or t["name"] == self.named]

    def _body_schema(self) -> dict:
        opts = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": t["name"]},
                    "arguments": closed_objects(t["parameters"]),
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in self.callable()
        ]
        schema = opts[0] if len(opts) == 1 else {"anyOf": opts}
        return {**schema, "x-guidance": JSON_OPTIONS}

    def max_calls(self) -> int:
        """Calls per reply: one, or with parallel_tool_calls one per callable tool. A cap, because
        a small model that may always add "one more call" often never stops."""
        return max(1, len(self.callable())) if self.parallel else 1

    def spec(self) -> StructuredSpec | None:
        if self.choice == "none":
            return None
        body = "body: %json " + json.dumps(self._body_schema())
        call = f"{json.dumps(CALL_OPEN)} body {json.dumps(CALL_CLOSE)}"
        more = ""
        for _ in range(self.max_calls() - 1):  # ("\n" call ("\n" call)?)? ...
            more = f' ("\\n" call{more})?'
        if self.choice == "auto":  # lazy: what follows the first marker the model writes
            lark = f"start: body {json.dumps(CALL_CLOSE)}{more}\ncall: {call}\n{body}"
            return StructuredSpec("grammar", lark, trigger=CALL_OPEN)
        return StructuredSpec("grammar", f"start: call{more}\ncall: {call}\n{body}")

    def system_text(self) -> str:
        lines = ["You can call these tools (JSON schema of each one's arguments):"]
        for t in self.callable():
            lines.append(
                json.dumps(
                    {
                        "name": t["name"],
                        "description": t["description"],
                        "parameters": t["parameters"],
                    }
                )
            )
        lines.append(
            f'To call a tool, reply with {CALL_OPEN}{{"name": "<tool name>", "arguments": '
            f'{{...}}}}{CALL_CLOSE}' + (" (one call per line)." if self.parallel else ".")
        )
        if self.choice == "auto":
            lines.append("Call a tool only when it helps; otherwise answer normally.")
        return "\n".join(lines)


def plan(body) -> ToolPlan | None:
    """The request's tools and choice, validated; None without tools."""
    tools, choice = body.tools, body.tool_choice
    if not tools:
        if choice not in (None, "none", "auto"):
            raise _bad("tool_choice: requires tools", "tool_choice")
        return None
    if len(tools) > MAX_TOOLS:
        raise _bad(f"tools: at most {MAX_TOOLS}")
    out = []
    for t in tools:
        f = (
            t.get("function")
            if isinstance(t, dict) and t.get("type", "function") == "function"
            else None
        )
        if (
            not isinstance(f, dict)
            or not isinstance(f.get("name"), str)
            or not _NAME_RE.match(f["name"])
        ):
            raise _bad(
                "tools: each must be {'type': 'function', 'function': {'name': [A-Za-z0-9_.-]{1,64}, ...}}"
            )
        params = f.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise _bad(f"tools: {f['name']}.parameters must be a JSON schema object")
        out.append(
            {
                "name": f["name"],
                "description": str(f.get("description") or ""),
                "parameters": params,
            }
        )
    if len({t["name"] for t in out}) != len(out):
        raise _bad("tools: names must be unique")
    named = None
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        named = (
            (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        )
        if named not in {t["name"] for t in out}:
            raise _bad(
                "tool_choice: must name one of the tools ({'type': 'function', 'function': {'name': ...}})",
                "tool_choice",
            )
        choice = "function"
    elif choice not in ("auto", "none", "required"):
        raise _bad("tool_choice: must be auto, none, required or a named function", "tool_choice")
    return ToolPlan(out, choice, named, bool(body.parallel_tool_calls))


def _call_text(call: dict) -> str:
    f = call.get("function") or {}
    args = f.get("arguments", "{}")
    try:
        args = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        raise _bad(
            "messages: an assistant tool call's arguments must be a JSON string", "messages"
        ) from None
    return CALL_OPEN + json.dumps({"name": f.get("name", ""), "arguments": args}) + CALL_CLOSE


def template_messages(body, tool_plan: ToolPlan | None) -> list[dict]:
    """The conversation as the chat template sees it (role + content strings), in the format above."""
    msgs = []
    for m in body.messages:
        text = m.text()
        if m.role == "tool":
            msgs.append({"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"})
        elif m.role == "assistant" and m.tool_calls:
            calls = "\n".join(_call_text(c) for c in m.tool_calls)
            msgs.append({"role": "assistant", "content": (text + "\n" if text else "") + calls})
        else:
            msgs.append({"role": "system" if m.role == "developer" else m.role, "content": text})
    if tool_plan is not None and tool_plan.choice != "none":
        extra = tool_plan.system_text()
        if msgs and msgs[0]["role"] == "system":
            msgs[0] = {"role": "system", "content": (msgs[0]["content"] + "\n\n" + extra).strip()}
        else:
            msgs.insert(0, {"role": "system", "content": extra})
    return msgs


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""


@dataclass
class ToolCallParser:
    """Streaming: feed() the generated text piece by piece, finish() at the end. Each returns
    events: ("content", text) | ("call", index, id, name) | ("args", index, fragment)."""

    calls: list[ToolCall] = field(default_factory=list)
    content: str = ""
    _buf: str = ""
    _in_call: bool = False
    _named: bool = False
    _after_call: bool = False  # the newline that separates calls is not content

    def _emit_content(self, text, ev):
        if text:
            self.content += text
            ev.append(("content", text))

    def feed(self, text: str) -> list:
        self._buf += text
        ev: list = []
        while True:
            if not self._in_call:
                if self._after_call:
                    self._buf = self._buf.lstrip("\n")
                    if not self._buf:
                        return ev
                    self._after_call = False
                at = self._buf.find(CALL_OPEN)
                if at < 0:
                    keep = next(
                        (
                            k
                            for k in range(min(len(CALL_OPEN) - 1, len(self._buf)), 0, -1)
                            if CALL_OPEN.startswith(self._buf[-k:])
                        ),
                        0,
                    )
                    self._emit_content(self._buf[: len(self._buf) - keep], ev)
                    self._buf = self._buf[len(self._buf) - keep :]
                    return ev
                self._emit_content(self._buf[:at], ev)
                self._buf = self._buf[at + len(CALL_OPEN) :]
                self._in_call, self._named = True, False
            if not self._named:
                m = _HEAD_RE.match(self._buf)
                if m is None:
                    return ev
                call = ToolCall(f"call_{uuid.uuid4().hex[:24]}", json.loads(f'"{m.group(1)}"'))
                self.calls.append(call)
                ev.append(("call", len(self.calls) - 1, call.id, call.name))
                self._buf, self._named = self._buf[m.end() :], True
            end = self._buf.find(CALL_CLOSE)
            if end < 0:  # hold back what may still be the outer "}" + the close marker
                cut = max(0, len(self._buf) - len(CALL_CLOSE) - 1)
                self._args(self._buf[:cut], ev)
                self._buf = self._buf[cut:]
                return ev
            inner = self._buf[:end].rstrip()
            self._args(inner[:-1] if inner.endswith("}") else inner, ev)
            self._buf = self._buf[end + len(CALL_CLOSE) :]
            self._in_call, self._after_call = False, True

    def _args(self, frag: str, ev) -> None:
        if frag:
            self.calls[-1].arguments += frag
            ev.append(("args", len(self.calls) - 1, frag))

    def finish(self) -> list:
        """Flush at the end of the reply (a reply cut by max_tokens keeps what it had)."""
        ev: list = []
        if not self._in_call:
            self._emit_content(self._buf, ev)
        elif self._named:
            self._args(self._buf, ev)
        else:
            self._emit_content(CALL_OPEN + self._buf, ev)
        self._buf = ""
        return ev

    def message_fields(self) -> dict:
        """`content` and `tool_calls` of the final assistant message."""
        out = {"content": self.content.strip() or None}
        if self.calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.calls
            ]
        return out


def stream_delta(event) -> dict:
    """One parser event as a chat.completion.chunk delta."""
    if event[0] == "content":
        return {"content": event[1]}
    if event[0] == "call":
        return {
            "tool_calls": [
                {
                    "index": event[1],
                    "id": event[2],
                    "type": "function",
                    "function": {"name": event[3], "arguments": ""},
                }
            ]
        }
    return {"tool_calls": [{"index": event[1], "function": {"arguments": event[2]}}]}
