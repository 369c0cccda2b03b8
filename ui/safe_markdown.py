"""Make message text safe to hand to a Markdown renderer in the browser.

Model replies and imported chats are untrusted: rendered as-is, a markdown image or an `<img>` made
the browser fetch from a third-party host when a conversation was opened, and a `<form>` posted a
typed password there. `safe_markdown(text)` returns Markdown that renders to the same text but:

- no raw HTML: every `<` outside code is written as `&lt;` (shown as "<", never parsed as a tag),
  which also removes autolinks `<http://...>` (a bare URL still becomes a link);
- no images: `![alt](url)` becomes the link `[image: alt](url)`, fetched only if clicked;
- no script links: a link or reference definition whose URL (after entity decoding) has a scheme
  other than http, https or mailto is broken into plain text.

Code keeps its `<` so code reads right. Which text is code must be decided exactly as the renderer
decides, or a tag we left alone could render. So we only trust what every CommonMark renderer
agrees on and escape when unsure (an escaped `<` inside code shows as "&lt;": ugly, never unsafe):
- fenced blocks whose opening fence starts in column 0 (inside a list or quote the block may end
  earlier than its closing fence); a line the renderer could take as the closing fence closes it;
- inline code spans whose closing backticks are on the same line, as long as no backtick run
  earlier in the same block of non-blank lines was left unpaired (the renderer might pair it
  with a later run and shift every pairing after it), and not containing `|` (in a GFM table the
  pipe splits cells before code spans are found).
"""

from __future__ import annotations

import html
import re

_FENCE_OPEN = re.compile(r"^(`{3,}|~{3,})(.*)$")
_SAFE_SCHEMES = ("http", "https", "mailto")
_LINK_DEST = re.compile(r"\]\(\s*(\S*)")
_REF_DEF = re.compile(r"^( {0,3})\[([^\]]*)\]:\s*(\S*)")
_SCHEME = re.compile(r"^([a-z][a-z0-9+.\-]*):")


def safe_markdown(text: str) -> str:
    if not isinstance(text, str):
        raise ValueError("message text must be a string")
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "\ufffd")
    out: list[str] = []
    lines = text.split("\n")
    i = 0
    trusted = True  # no unpaired backtick run yet in this block of non-blank lines
    while i < len(lines):
        line = lines[i]
        m = _FENCE_OPEN.match(line)
        if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
            fence = m.group(1)
            end = _find_fence_close(lines, i + 1, fence)
            out.extend(lines[i : end + 1])  # the whole block verbatim (to the end if unclosed)
            i = end + 1
            trusted = True
            continue
        if not line.strip():
            trusted = True
            out.append(line)
        else:
            escaped, trusted = _escape_line(line, trusted)
            out.append(_neutralize_ref_def(escaped))
        i += 1
    return "\n".join(out)


def _find_fence_close(lines: list[str], start: int, fence: str) -> int:
    """Index of the closing fence line, generous (any line a renderer could take as closing),
    or the last line when the block runs to the end."""
    closer = re.compile(r"^ {0,3}" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}[ \t]*$")
    for j in range(start, len(lines)):
        if closer.match(lines[j]):
            return j
    return len(lines) - 1


def _escape_line(line: str, trusted: bool) -> tuple[str, bool]:
    """Escape one non-code line, keeping trusted same-line code spans verbatim."""
    parts: list[str] = []
    plain_start = 0
    i = 0
    n = len(line)
    while i < n:
        if line[i] != "`":
            i += 1
            continue
        backslashes = len(line[:i]) - len(line[:i].rstrip("\\"))
        if backslashes % 2 == 1:  # \` is a literal backtick
            i += 1
            continue
        j = i
        while j < n and line[j] == "`":
            j += 1
        run = j - i
        close = _find_run(line, j, run)
        if close < 0:
            trusted = False  # unpaired here: a renderer may pair it later
            i = j
            continue
        if not trusted or "|" in line[j:close]:
            trusted = False
            i = close + run
            continue
        parts.append(_escape_text(line[plain_start:i]))
        parts.append(line[i : close + run])  # the code span, verbatim
        i = plain_start = close + run
    parts.append(_escape_text(line[plain_start:]))
    return "".join(parts), trusted


def _find_run(line: str, start: int, run: int) -> int:
    """Start of the next backtick run of exactly `run` backticks at or after `start`, or -1."""
    i = start
    while i < len(line):
        if line[i] == "`":
            j = i
            while j < len(line) and line[j] == "`":
                j += 1
            if j - i == run:
                return i
            i = j
        else:
            i += 1
    return -1


def _escape_text(text: str) -> str:
    text = text.replace("<", "&lt;")
    # "![" -> "[image: "; in a run like "!![" the "!" left in front must not start an image again
    text = re.sub(r"(!*)!\[", lambda m: m.group(1) + (" " if m.group(1) else "") + "[image: ", text)
    return _LINK_DEST.sub(_check_link, text)


def _check_link(m: re.Match) -> str:
    return m.group(0) if _url_is_safe(m.group(1)) else "]\\(" + m.group(0)[2:]


def _neutralize_ref_def(line: str) -> str:
    m = _REF_DEF.match(line)
    if m and not _url_is_safe(m.group(3)):
        return line[: len(m.group(1))] + "\\" + line[len(m.group(1)) :]
    return line


def _url_is_safe(url: str) -> bool:
    """http(s), mailto, or no scheme at all (a relative link or #anchor), after the decoding a
    renderer applies (entities, backslash escapes) and the characters browsers ignore. An empty
    destination is refused: CommonMark lets the real one follow on the next line."""
    if not url:
        return False  # the destination may follow on the next line: do not make it a link
    decoded = html.unescape(url.replace("&lt;", "<")).lstrip("<")
    decoded = re.sub(r"\\(.)", r"\1", decoded)
    decoded = re.sub(r"[\x00-\x20\x7f]", "", decoded).lower()
    m = _SCHEME.match(decoded)
    return m is None or m.group(1) in _SAFE_SCHEMES
