"""Where a Markdown text leaves a fenced code block open, decided by a CommonMark parser.

Why a parser: a reply cut by max tokens or Stop often ends inside a code block, and whatever is put
after it (the chat's stats line, the next message of a Markdown export) then renders as code. The
earlier rule counted lines starting with three backticks: wrong for a longer fence (```` closes
only with four), for a fence line that is content (```python inside a ```markdown block is not a
closer, so an even count can still be open), and for a fence inside a list item, which its list
closes by itself (a closer added there opens a new block instead). markdown-it-py implements
CommonMark; it comes with Gradio (through rich) and is declared in requirements.txt.

Both the chat page (ui/chat/view.py) and the Markdown export (storage/transfer.py) use it, so it
lives on the lower floor (storage), which the page may import.
"""

from __future__ import annotations

from functools import lru_cache

_SENTINEL = "q7ZpagedchatFenceProbe"  # a word no fence info string or closer can look like


@lru_cache(maxsize=1)
def _parser():
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark")


def open_fence(text: str) -> str | None:
    """The opening fence ("```", "~~~~", ...) of a code block `text` leaves open at its end, or
    None. Cheap for text without a fence: no parse."""
    if "```" not in text and "~~~" not in text:
        return None
    probe = text + ("\n" if not text.endswith("\n") else "") + "\n" + _SENTINEL + "\n"
    for tok in _parser().parse(probe):
        if tok.type == "fence" and _SENTINEL in tok.content:
            return tok.markup
    return None


def close_open_fence(text: str) -> str:
    """`text` with a closing fence appended when it ends inside a fenced code block (else as is),
    so what follows it is not code. Its own characters are kept exactly."""
    for _ in range(3):  # one closer is enough; bounded all the same
        fence = open_fence(text)
        if fence is None:
            return text
        text = text + ("\n" if not text.endswith("\n") else "") + fence
    return text
