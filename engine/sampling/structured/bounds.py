"""A bound on counted repetition in a constraint, checked before it is compiled (issue 48.5).

Why: llguidance builds its lexer lazily, so a regex like `a{1000}{1000}` or `(a{1000}){1000}`
compiles and passes validation, then fails in the middle of a generation ("lexer error: too many
expressions constructed", depending on what the model writes: a 500 after tokens were streamed),
and before failing each of its steps costs tens of milliseconds of the engine's loop (a gap in
every other stream). Measured here: masks of `a{300}{300}` and `a{100000}` cost ~50 ms a step,
`x{100}{40}` ~3 ms. What blows up is the product of nested counts: the automaton unrolls
`{m,n}` up to n copies of what it repeats. So the product of the counts enclosing any piece of a
regex (and of a Lark grammar, through its rules) must stay within MAX_REPEAT_PRODUCT; `*` and `+`
cost nothing here (a loop is one state). Past it the request is refused at validation: a 400.

The scan is deliberately simple and conservative: alternatives count as their largest branch,
an unbounded `{m,}` as m, and a rule referenced from a repeated place multiplies its own count.
"""

from __future__ import annotations

import json
import re

MAX_REPEAT_PRODUCT = 10_000

_COUNT = re.compile(r"\{\s*(\d{1,9})\s*(?:,\s*(\d{0,9})\s*)?\}")
_LARK_RANGE = re.compile(r"~\s*(\d{1,9})(?:\s*\.\.\s*(\d{1,9}))?")
_LARK_RULE = re.compile(r"^\s*[?!]?([A-Za-z_][A-Za-z0-9_]*)(?:\.-?\d+)?\s*:", re.M)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Frames:
    """Open groups: per group [largest product inside, product of the last piece]."""

    def __init__(self):
        self.stack = [[1, 1]]

    def atom(self, p: int) -> None:
        top = self.stack[-1]
        top[1] = p
        top[0] = max(top[0], p)

    def repeat(self, k: int) -> None:
        top = self.stack[-1]
        top[1] *= max(1, k)
        top[0] = max(top[0], top[1])

    def open(self) -> None:
        self.stack.append([1, 1])

    def close(self) -> None:
        if len(self.stack) > 1:
            inner = self.stack.pop()[0]
            self.atom(inner)

    def result(self) -> int:
        while len(self.stack) > 1:
            self.close()
        return self.stack[0][0]


def _count(m: re.Match) -> int:
    low, high = int(m.group(1)), m.group(2)
    return max(low, int(high)) if high else low


def regex_repeat_product(rx: str) -> int:
    """The largest product of counted repetitions enclosing any piece of `rx` (1: none)."""
    f, i, n = _Frames(), 0, len(rx)
    while i < n:
        c = rx[i]
        if c == "\\":
            j = i + 2
            if i + 1 < n and rx[i + 1] in "pPxu" and j < n and rx[j] == "{":  # \p{L}, \x{41}
                j = rx.find("}", j) + 1 or n
            f.atom(1)
            i = j
        elif c == "[":
            j = i + 1
            if j < n and rx[j] == "^":
                j += 1
            if j < n and rx[j] == "]":
                j += 1
            depth = 1
            while j < n and depth:
                if rx[j] == "\\":
                    j += 1
                elif rx[j] == "[":
                    depth += 1
                elif rx[j] == "]":
                    depth -= 1
                j += 1
            f.atom(1)
            i = j
        elif c == "(":
            f.open()
            i += 1
            if i < n and rx[i] == "?":  # (?:...), (?P<name>...), (?i): no quantifier
                while i < n and rx[i] not in ":)>=!":
                    i += 1
                if i < n and rx[i] != ")":
                    i += 1
        elif c == ")":
            f.close()
            i += 1
        elif c == "{" and (m := _COUNT.match(rx, i)):
            f.repeat(_count(m))
            i = m.end()
        elif c in "*+?|^$":
            i += 1
        else:
            f.atom(1)
            i += 1
    return f.result()


def _skip_braces(text: str, i: int) -> int:
    """Index after the balanced {...} starting at text[i] (a %json schema)."""
    depth = 0
    while i < len(text):
        if text[i] == '"':
            i = _skip_string(text, i)
            continue
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            return i
    return i


def _skip_string(text: str, i: int) -> int:
    quote, i = text[i], i + 1
    while i < len(text) and text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _lark_body(body: str, cost_of) -> int:
    f, i, n = _Frames(), 0, len(body)
    while i < n:
        c = body[i]
        if c == "/" and body.startswith("//", i):  # a comment
            i = body.find("\n", i) + 1 or n
        elif c == '"' or c == "'":
            i = _skip_string(body, i)
            f.atom(1)
        elif c == "/":
            j = i + 1
            while j < n and body[j] != "/":
                j += 2 if body[j] == "\\" else 1
            f.atom(regex_repeat_product(body[i + 1 : j]))
            i = j + 1
        elif body.startswith("%json", i):
            j = body.find("{", i)
            i = _skip_braces(body, j) if j >= 0 else n
            try:
                f.atom(schema_repeat_product(json.loads(body[j:i])) if j >= 0 else 1)
            except ValueError:  # not JSON: llguidance will say so itself
                f.atom(1)
        elif c in "([":
            f.open()
            i += 1
        elif c in ")]":
            f.close()
            i += 1
        elif c == "{" and (m := _COUNT.match(body, i)):
            f.repeat(_count(m))
            i = m.end()
        elif c == "~" and (m := _LARK_RANGE.match(body, i)):
            f.repeat(max(int(m.group(1)), int(m.group(2) or 0)))
            i = m.end()
        elif m := _NAME.match(body, i):
            f.atom(cost_of(m.group(0)))
            i = m.end()
        else:
            i += 1
    return f.result()


def lark_repeat_product(grammar: str) -> int:
    """The same bound over a Lark grammar: a rule's cost multiplies where it is referenced;
    recursion (a loop, like `*`) counts once."""
    heads = list(_LARK_RULE.finditer(grammar))
    bodies: dict[str, str] = {}
    for k, m in enumerate(heads):
        end = heads[k + 1].start() if k + 1 < len(heads) else len(grammar)
        first, *rest = grammar[m.end() : end].split("\n")  # directives (%ignore ...) end a rule
        bodies[m.group(1)] = "\n".join(
            [first] + [line for line in rest if not line.lstrip().startswith("%")]
        )
    memo: dict[str, int] = {}

    def cost_of(name: str) -> int:
        if name in memo:
            return memo[name]
        if name not in bodies:
            return 1
        memo[name] = 1  # a cycle counts once
        memo[name] = _lark_body(bodies[name], cost_of)
        return memo[name]

    return max((cost_of(name) for name in bodies), default=1)


def schema_repeat_product(schema) -> int:
    """The largest regex product among a JSON schema's `pattern`s and `patternProperties`."""
    best = 1
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "pattern" and isinstance(v, str):
                    best = max(best, regex_repeat_product(v))
                elif k == "patternProperties" and isinstance(v, dict):
                    best = max([best] + [regex_repeat_product(p) for p in v if isinstance(p, str)])
                if isinstance(v, (dict, list)):
                    stack.append(v)
        elif isinstance(node, list):
            stack.extend(node)
    return best


def check_repetition(kind: str, value, limit: int = MAX_REPEAT_PRODUCT) -> None:
    """ValueError (a 400 on /v1) when the constraint's nested counts multiply past `limit`."""
    if kind == "regex" and isinstance(value, str):
        product = regex_repeat_product(value)
    elif kind == "grammar" and isinstance(value, str):
        product = lark_repeat_product(value)
    elif kind == "json_schema":
        product = schema_repeat_product(value)
    else:
        return
    if product > limit:
        raise ValueError(
            f"structured: the {kind} repeats a piece {product:,} times once its nested "
            f"counts like {{1000}} are multiplied; at most {limit:,} are accepted (such "
            f"a pattern fails or stalls mid-generation); use * or + for long runs"
        )
