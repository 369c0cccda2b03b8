"""What the user meant when they edit a message: undo our display changes, keep their edits.

The chat shows each message made safe (ui/safe_markdown: `<` written as `&lt;`, images as links)
and, for a message with other versions, followed by the `‹ k/n ›` links. Gradio's edit box starts
from that displayed string, so saving an edit used to store `&lt;div>` for a typed `<div>` and
could even store the branch links. `typed_text(edited, original)` maps the edit back: the parts the
user left alone become the original text again, the parts they typed stay exactly as typed.

How: the displayed string is split into segments, each tied to the original text it came from
(one character for characters we did not change; a whole `&lt;` for a `<`; the branch links for
nothing). A character-level diff of displayed -> edited then says which segments survived intact:
those give back their original text, everything else is the user's own typing.
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher

from ui.chat import view

_NAV = re.compile(r'\n\n<span class="branch-nav">.*?</span>\s*$', re.DOTALL)


def displayed(original: str) -> str:
    """The message as the chat shows it (without the branch links, which typed_text drops)."""
    return view.rendered(original)


def _segments(original: str, shown: str) -> list[tuple[int, int, str]]:
    """(start, end) spans of `shown`, each with the original text it stands for, covering it."""
    segs: list[tuple[int, int, str]] = []
    pending = ""  # original text that vanished from the display
    for op, i1, i2, j1, j2 in SequenceMatcher(None, original, shown, autojunk=False).get_opcodes():
        if op == "equal":
            for k in range(j2 - j1):
                segs.append((j1 + k, j1 + k + 1, pending + original[i1 + k]))
                pending = ""
        elif op == "delete":
            pending += original[i1:i2]
        else:  # replace / insert: one segment, all or nothing
            segs.append((j1, j2, pending + original[i1:i2]))
            pending = ""
    if pending and segs:
        s, e, text = segs[-1]
        segs[-1] = (s, e, text + pending)
    return segs


def typed_text(edited: str, original: str) -> str:
    """The text to store for an edit of `original` whose edit box ended up as `edited`."""
    edited = _NAV.sub("", edited)
    shown = displayed(original)
    if edited == shown:
        return original
    segs = _segments(original, shown)
    kept = [False] * len(shown)  # shown chars that survive unchanged, in place
    out_of: dict[int, int] = {}  # shown index -> edited index for kept chars
    blocks = SequenceMatcher(None, shown, edited, autojunk=False).get_matching_blocks()
    for a, b, size in blocks:
        for k in range(size):
            kept[a + k] = True
            out_of[a + k] = b + k
    out, e = [], 0  # e: next edited char not yet emitted
    for start, end, orig in segs:
        if all(kept[start:end]) and end > start:
            first = out_of[start]
            if all(out_of[start + k] == first + k for k in range(end - start)):
                out.append(edited[e:first])  # the user's typing before this segment
                out.append(orig)
                e = first + (end - start)
    out.append(edited[e:])
    return "".join(out)
