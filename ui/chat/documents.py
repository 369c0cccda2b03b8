"""Documents in the conversation (issue 26.4): text, Markdown and code files attached to a message.

Why placed before the message text, in a fixed wrapper: the engine shares blocks by prefix, so a
document that two chats attach to their first message right after the same system prompt is the
same token prefix in both, and its full blocks are prefilled once and shared (refcount 2 on the
Memory tab), like the system prompt. The wrapper is plain text the model reads
(`<document name="...">...</document>`); the page shows each one as a chip with its token count.

Refusals come before anything is sent: an unsupported or binary file, a file over MAX_BYTES, or a
document that would not fit the context beside what the chat already holds (with the numbers).
PDF: the text layer is extracted with pypdf (pure Python, maintained; requirements.txt), page by
page, up to MAX_PDF_PAGES and MAX_PDF_BYTES; a scanned PDF without a text layer is refused (no OCR).
Without pypdf installed, a PDF is refused with a sentence saying so.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from html import escape

from storage.messages import DOCUMENT_BLOCK

MAX_BYTES = 256 * 1024
MAX_PDF_BYTES = 16 * 1024 * 1024      # a PDF's file; its extracted text is held to MAX_BYTES like any text
MAX_PDF_PAGES = 300
TEXT_EXTENSIONS = frozenset(
    ".txt .md .markdown .rst .py .js .ts .tsx .jsx .json .csv .tsv .yaml .yml .toml .ini .cfg .html .css .xml "
    ".c .h .cc .cpp .hpp .rs .go .java .kt .rb .php .sh .sql .log .tex".split())
_BLOCK = DOCUMENT_BLOCK      # the wrapper's one pattern (storage/messages.py: titles read it too)


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


class _Refused(ValueError):
    """A refusal of ours, raised inside the pypdf block and passed through as it is."""


def _pdf_text(path: str, name: str) -> str:
    """The PDF's text layer, pages joined by blank lines. Any parse failure is the file's fault and
    is reported as such (pypdf raises its own errors on malformed or encrypted files)."""
    size = os.path.getsize(path)
    if size > MAX_PDF_BYTES:
        raise ValueError(f"{name} is {size:,} bytes; a PDF may have at most {MAX_PDF_BYTES:,}")
    try:
        import pypdf
    except ImportError:
        raise ValueError(f"{name}: PDF needs the pypdf package, which is not installed here "
                         "(attach the text instead)") from None
    try:
        reader = pypdf.PdfReader(path)
        if reader.is_encrypted:
            raise _Refused(f"{name} is an encrypted PDF")
        if len(reader.pages) > MAX_PDF_PAGES:
            raise _Refused(f"{name} has {len(reader.pages):,} pages; a PDF may have at most {MAX_PDF_PAGES}")
        parts, total = [], 0
        for page in reader.pages:
            t = (page.extract_text() or "").strip()
            total += len(t.encode("utf-8"))
            if total > MAX_BYTES:
                raise _Refused(f"{name}'s text is over {MAX_BYTES:,} bytes, the most a document may have")
            parts.append(t)
    except _Refused:
        raise
    except Exception as e:                # malformed, truncated, unsupported: this file only
        raise _Refused(f"{name} could not be read as a PDF ({type(e).__name__})") from None
    text = "\n\n".join(p for p in parts if p)
    if not text.strip():
        raise ValueError(f"{name} has no text layer (a scanned PDF?); only PDFs with text can be attached")
    return text


def check_fits(doc: Document, used_tokens: int, max_model_len: int, attached=()) -> None:
    """Refuse a document that cannot fit the context beside the chat and the other attachments."""
    total = used_tokens + sum(d.tokens for d in attached) + doc.tokens
    if total >= max_model_len:
        raise ValueError(f"{doc.name} has {doc.tokens:,} tokens; with this chat's {used_tokens:,} and "
                         f"{sum(d.tokens for d in attached):,} already attached that is {total:,}, and the "
                         f"context holds {max_model_len:,}")


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
    return (f'<div class="doc-chips" data-k="doc_tokens" data-v="{total}">'
            + "".join(chip(d.name, d.tokens) for d in docs)
            + ' <span class="doc-note">sent with your next message</span></div>')


def display(content: str, render) -> str:
    """A stored user message for the chat: its documents as chips (name, lines), then the text
    rendered by `render` (ui/chat/view.rendered: the safe Markdown path)."""
    docs, rest = split(content)
    if not docs:
        return render(content)
    chips = " ".join(f'<span class="doc-chip" title="attached document">{ICON}{escape(n)} · '
                     f'{t.count(chr(10)) + 1:,} lines</span>' for n, t in docs)
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
