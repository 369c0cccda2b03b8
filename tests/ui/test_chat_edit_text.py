"""An edit of a message shown in its safe form stores what the user meant (ui/chat/edit_text.py)."""

import random

import pytest

from ui.chat import view
from ui.chat.edit_text import displayed, typed_text

ORIGINALS = [
    "What does <div class=\"a\"> do in HTML?",
    "Show ![diagram](http://example.com/d.png) and <b>bold</b> & more",
    "plain text, nothing changed",
    "code `a<b` and a < b outside",
    "x\n\n```\n<raw>\n```\nafter <tag>",
]


@pytest.mark.parametrize("original", ORIGINALS)
def test_an_untouched_edit_box_gives_back_the_original(original):
    assert typed_text(displayed(original), original) == original
    nav = "\n\n" + view.branch_nav(7, [3, 7, 9])  # the version links shown under the message
    assert typed_text(displayed(original) + nav, original) == original


def test_appended_and_inserted_text_is_kept_and_the_rest_is_original():
    original = "What does <div> do?"
    shown = displayed(original)
    assert "&lt;" in shown  # the edit box really starts escaped
    assert typed_text(shown + " And <span>?", original) == "What does <div> do? And <span>?"
    assert typed_text(shown.replace("div", "section"), original) == "What does <section> do?"
    assert typed_text("Totally new <p> question", original) == "Totally new <p> question"


def test_what_the_user_types_is_never_rewritten():
    original = "a <b> c"
    shown = displayed(original)
    assert typed_text(shown + " &lt; literal", original) == "a <b> c &lt; literal"
    assert typed_text("plain &lt;p&gt;", "plain") == "plain &lt;p&gt;"  # no escape shown: all typed


def test_random_edits_keep_every_typed_character_and_untouched_originals():
    rng = random.Random(7)
    for _ in range(300):
        original = "".join(
            rng.choice(["<", ">", "&", "a", "b", " ", "![x](http://h/i.png)", "`", "\n"])
            for _ in range(rng.randint(1, 25))
        )
        shown = displayed(original)
        suffix = "".join(rng.choice("xyz <>") for _ in range(rng.randint(1, 6)))
        assert typed_text(shown, original) == original
        assert typed_text(shown + "\n" + suffix, original) == original + "\n" + suffix
