"""Documents in the conversation (issue 26.4): text, Markdown and code files attached to a message.

Why placed before the message text, in a fixed wrapper: the engine shares blocks by prefix, so a
document that two chats attach to their first message right after the same system prompt is the
same token prefix in both, and its full blocks are prefilled once and shared (refcount 2 on the
Memory tab), like the system prompt. The wrapper is plain text the model reads
(`<document name="...">...</document>`); the page shows each one as a chip with its token count.

Refusals come before anything is sent: an unsupported or binary file, a file over MAX_BYTES, or a
document that would not fit the context beside what the chat already holds (with the numbers).
PDF: the text layer is extracted with pypdf (pure Python, maintained; requirements.txt), page by
page, up to MAX_PDF_PAGES and MAX_PDF_BYTES, in a worker process with time, memory and
inflated-content limits (ui/chat/pdf_text.py); a scanned PDF without a text layer is refused (no
OCR). Without pypdf installed, a PDF is refused with a sentence saying so. `UploadSlots` bounds
how many documents one user (and everyone) may have being read at once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from html import escape

from storage.messages import DOCUMENT_BLOCK

MAX_BYTES = 256 * 1024
MAX_PDF_BYTES = (
    16 * 1024 * 1024
)  # a PDF's file; its extracted text is held to MAX_BYTES like any text
MAX_PDF_PAGES = 300
TEXT_EXTENSIONS = frozenset(
    ".txt .md .markdown .rst .py .js .ts .tsx .jsx .json .csv .tsv .yaml .yml .toml .ini .cfg .html .css .xml "
    ".c .h .cc .cpp .hpp .rs .go .java .kt .rb .php .sh .sql .log .tex".split()
)
_BLOCK = DOCUMENT_BLOCK  # the wrapper's one pattern (storage/messages.py: titles read it too)


@dataclass(frozen=True)
class Document:
    name: str
    text: str
    tokens: int


def read_document(path: str, name: str | None, count_tokens) -> Document:
    """A file as a Document; ValueError (a plain sentence) when it cannot be one."""
    name = os.path.basename(name or path or "document")[:200].replace('"', "'") or "document"
    ext = os.path.splitext(name)[1].lower()
    if ext == ".pdf":
        text = _pdf_text(path, name)
    else:
        text = _plain_text(path, name, ext)
    text = text.replace("\r\n", "\n").strip("\n")
    if "</document>" in text:
        raise ValueError(f"{name} contains the text </document>, which would end it early")
    return Document(name, text, int(count_tokens(text)))


def _plain_text(path: str, name: str, ext: str) -> str:
    if ext not in TEXT_EXTENSIONS:
        raise ValueError(f"{name}: only text, Markdown and code files can be attached")
    size = os.path.getsize(path)
    if size > MAX_BYTES:
        raise ValueError(f"{name} is {size:,} bytes; a document may have at most {MAX_BYTES:,}")
    with open(path, "rb") as f:
        raw = f.read()
    if b"\x00" in raw:
        raise ValueError(f"{name} looks binary, not text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{name} is not UTF-8 text") from None


def _pdf_text(path: str, name: str) -> str:
    """The PDF's text layer, pages joined by blank lines, read by a bounded worker process
    (ui/chat/pdf_text.py: time, memory and inflated-content limits; issue 48.4). Any failure is
    the file's fault and is reported as such, in a sentence."""
    size = os.path.getsize(path)
    if size > MAX_PDF_BYTES:
        raise ValueError(f"{name} is {size:,} bytes; a PDF may have at most {MAX_PDF_BYTES:,}")
    from ui.chat.pdf_text import read_pdf

    out = read_pdf(path, MAX_PDF_PAGES, MAX_BYTES)
    if "missing" in out:
        raise ValueError(
            f"{name}: PDF needs the pypdf package, which is not installed here "
            "(attach the text instead)"
        )
    if "refused" in out:
        sentence = str(out["refused"])
        raise ValueError(f"{name}{'' if sentence.startswith(chr(39)) else ' '}{sentence}")
    text = str(out.get("text", ""))
    if not text.strip():
        raise ValueError(
            f"{name} has no text layer (a scanned PDF?); only PDFs with text can be attached"
        )
    return text


class UploadSlots:
    """At most `per_user` documents of one user (and `total` of everyone) are read at a time
    (issue 48.4): a user who uploads PDFs in a loop holds one worker, never every core. Past a
    bound the upload is refused at once with a sentence; nothing waits. Thread-safe."""

    def __init__(self, per_user: int = 1, total: int | None = None):
        import threading

        self.per_user = per_user
        self.total = total if total is not None else max(2, os.cpu_count() or 2)
        self._lock = threading.Lock()
        self._busy: dict[str, int] = {}

    def enter(self, user: str) -> str | None:
        """None: go ahead (call leave(user) after); else why not, in plain words."""
        with self._lock:
            mine = self._busy.get(user, 0)
            if mine >= self.per_user:
                return (
                    "another document of yours is still being read; attach this one when it "
                    f"is done (at most {self.per_user} at a time per user)"
                )
            if sum(self._busy.values()) >= self.total:
                return (
                    f"the server is reading {self.total} documents already; try again in a few "
                    f"seconds"
                )
            self._busy[user] = mine + 1
            return None

    def leave(self, user: str) -> None:
        with self._lock:
            left = self._busy.get(user, 0) - 1
            if left > 0:
                self._busy[user] = left
            else:
                self._busy.pop(user, None)


def check_fits(doc: Document, used_tokens: int, max_model_len: int, attached=()) -> None:
    """Refuse a document that cannot fit the context beside the chat and the other attachments."""
    total = used_tokens + sum(d.tokens for d in attached) + doc.tokens
    if total >= max_model_len:
        raise ValueError(
            f"{doc.name} has {doc.tokens:,} tokens; with this chat's {used_tokens:,} and "
            f"{sum(d.tokens for d in attached):,} already attached that is {total:,}, and the "
            f"context holds {max_model_len:,}"
        )


def message_text(docs, text: str) -> str:
    """What is stored and sent: each document in its wrapper, then the user's text."""
    return "".join(f'<document name="{d.name}">\n{d.text}\n</document>\n\n' for d in docs) + text


def split(content: str) -> tuple[list[tuple[str, str]], str]:
    """(name, text) of the documents at the start of a stored message, and the rest."""
    docs, pos = [], 0
    while True:
        m = _BLOCK.match(content, pos)
        if m is None:
            return docs, content[pos:]
        docs.append((m.group(1), m.group(2)))
        pos = m.end()


def chip(name: str, tokens: int | None = None) -> str:
    count = f" · {tokens:,} tokens" if tokens is not None else ""
    return f'<span class="doc-chip" title="attached document">{ICON}{escape(name)}{count}</span>'


def chips_html(docs) -> str:
    if not docs:
        return ""
    total = sum(d.tokens for d in docs)
    return (
        f'<div class="doc-chips" data-k="doc_tokens" data-v="{total}">'
        + "".join(chip(d.name, d.tokens) for d in docs)
        + ' <span class="doc-note">sent with your next message</span></div>'
    )


def display(content: str, render) -> str:
    """A stored user message for the chat: its documents as chips (name, lines), then the text
    rendered by `render` (ui/chat/view.rendered: the safe Markdown path)."""
    docs, rest = split(content)
    if not docs:
        return render(content)
    chips = " ".join(
        f'<span class="doc-chip" title="attached document">{ICON}{escape(n)} · '
        f'{t.count(chr(10)) + 1:,} lines</span>'
        for n, t in docs
    )
    return f"{chips}\n\n{render(rest)}"


# a page drawn in CSS, not an emoji (issue 47: a tofu box where no emoji font is installed)
ICON = '<span class="doc-ico" aria-hidden="true"></span>'

CSS = """
.doc-chip .doc-ico { display: inline-block; width: 0.62em; height: 0.8em; margin-right: 5px;
  vertical-align: -1px; border: 1.5px solid currentColor; border-radius: 1px 4px 1px 1px; opacity: .7; }
.doc-chip { display: inline-block; font-size: 0.85em; border: 1px solid var(--border-color-primary, #d1d5db);
  border-radius: 999px; padding: 1px 9px; margin: 2px 4px 2px 0; background: var(--background-fill-secondary, #f9fafb); }
.doc-chips .doc-note { font-size: 0.8em; opacity: .7; }
"""
