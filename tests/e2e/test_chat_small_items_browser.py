"""Issue 26's small items in real headless Chromium (Debian chromium + Playwright), on chats written
into the history before the app starts (the model cannot be asked for exact Markdown): the copy
button gives a reply's stored Markdown source (fences, bold, list markers intact); the branch
arrows are big enough to hit; the edit box of a past message is wide; nothing of the chatbot's
frame covers a scrolled message; after "Save for new chats" the hint stops asking for it; a
deleted chat's download link goes; an imported chat is told apart by its title."""

import json

import pytest

from storage import Storage
from tests.e2e.conftest import SMALL, AppServer
from tests.e2e.polling import wait_until as _wait
from tests.e2e.browser import _chromium, browser  # noqa: F401  (the Chromium fixtures)

pytestmark = pytest.mark.slow

MARKDOWN = """Here is the **plan**:

1. Read the *file*.
2. Count the words:

```python
def count(text: str) -> int:
    return len(text.split())  # <- words, not lines
```

- done with `count()`
- then **print** it"""
LONG_CHAT = 8  # user/reply pairs: enough for the chatbot to scroll
# a reply cut by max tokens inside a code block the model never closed (issue 47), after a table and
# a ```markdown block holding a ```python line (content, not a closer): an even number of fence
# lines, so counting them said "closed"
OPEN_FENCE = """| planet | moons |
|---|---|
| Mars | 2 |

```markdown
Say hello:
```python
print("hello, world")
```

Then run it:

```bash
python hello.py
echo and then the essay"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("small-items")
    db = tmp / "chat.db"
    st = Storage(str(db))
    try:
        md = st.create_conversation(title="Markdown reply")
        st.add_message(md["id"], "user", "Show me a plan with code.")
        reply = st.add_message(md["id"], "assistant", MARKDOWN)
        st.add_reply_stats(
            reply["id"],
            output_tokens=60,
            ttft_s=0.1,
            tokens_per_s=20.0,
            prompt_tokens=30,
            cached_tokens=0,
        )
        long = st.create_conversation(title="A long chat")
        for i in range(LONG_CHAT):
            st.add_message(long["id"], "user", f"Question {i}: what comes after {i}?")
            last = st.add_message(
                long["id"], "assistant", f"After {i} comes {i + 1}.\n\n" + "More words. " * 30
            )
        st.add_sibling(last["id"], "Another version of the last reply.")  # ‹ 2/2 › under it
        cut = st.create_conversation(title="Planets")
        st.add_message(
            cut["id"],
            "user",
            "A table of 3 planets, hello world in Python, then a long essay.",
            token_ids=list(range(30)),
        )
        reply = st.add_message(
            cut["id"], "assistant", OPEN_FENCE, status="stopped", token_ids=list(range(100, 700))
        )
        st.add_reply_stats(
            reply["id"],
            output_tokens=600,
            ttft_s=0.1,
            tokens_per_s=20.0,
            prompt_tokens=30,
            cached_tokens=16,
            finish_reason="length",
        )
    finally:
        st.close()
    app = AppServer(db, SMALL, tmp / "app.log")
    try:
        yield app.wait_ready(), {"markdown": md["id"], "long": long["id"], "cut": cut["id"]}
    finally:
        app.kill()


def _open(browser, url, **kw):  # noqa: F811
    context = browser.new_context(viewport={"width": 1280, "height": 900}, **kw)
    context.set_default_timeout(90_000)
    page = context.new_page()
    page.goto(url)
    page.wait_for_selector("#msg textarea")
    return page


def _bot_rows(page) -> int:
    return page.locator("#chatbot .message.bot").count()


def test_copy_gives_the_replys_markdown_source(server, browser):  # noqa: F811
    app, convs = server
    page = _open(
        browser,
        app.url + f"?c={convs['markdown']}",
        permissions=["clipboard-read", "clipboard-write"],
    )
    _wait(
        lambda: "tok/s" in page.locator("#chatbot .message.bot").last.inner_text(),
        60,
        what="the reply",
    )
    page.locator("#chatbot .message.bot").last.hover()
    page.locator(
        "#chatbot button[title='Copy message'], #chatbot button[aria-label*='opy']"
    ).last.click()
    _wait(lambda: page.evaluate("window.__lastCopied || ''") != "", 5, what="the copy")
    assert page.evaluate("window.__lastCopied") == MARKDOWN
    assert page.evaluate("navigator.clipboard.readText()") == MARKDOWN
    page.evaluate("window.__lastCopied = ''")
    page.locator("#chatbot").click()  # not typing in a box
    page.keyboard.press("Control+Shift+C")  # the shortcut copies the same source
    _wait(lambda: page.evaluate("window.__lastCopied || ''") != "", 5, what="the shortcut's copy")
    assert page.evaluate("window.__lastCopied") == MARKDOWN
    page.context.close()


# Where the reply's footer landed: inside a code block (the defect) or not, and the text shown as code
_FOOTER = """() => {
  const bot = [...document.querySelectorAll('#chatbot .message.bot')].pop();
  const stats = bot.querySelector('.reply-stats');
  return {stats_in_code: !!(stats && stats.closest('pre, code')), src_in_code: !!bot.querySelector('pre .md-src, code .md-src'),
          code: [...bot.querySelectorAll('pre')].map((p) => p.innerText), text: bot.innerText};
}"""


def test_a_reply_left_inside_a_code_block_renders_and_copies_safely(server, browser):  # noqa: F811
    """Issue 47: a reply whose code fence was never closed swallowed the stats line and the hidden
    source span (raw HTML in the code block), and Copy copied that HTML. Now the footer is its own
    part of the message, the fence is closed for display, and Copy gives exactly the stored Markdown."""
    app, convs = server
    page = _open(
        browser, app.url + f"?c={convs['cut']}", permissions=["clipboard-read", "clipboard-write"]
    )
    _wait(
        lambda: "tok/s" in page.locator("#chatbot .message.bot").last.inner_text(),
        60,
        what="the reply",
    )
    shown = page.evaluate(_FOOTER)
    assert not shown["stats_in_code"] and not shown["src_in_code"], shown
    assert all(
        "reply-stats" not in c and "md-src" not in c and "tok/s" not in c for c in shown["code"]
    ), shown
    assert "600 tokens" in shown["text"] and "<span" not in shown["text"]
    page.locator("#chatbot .message.bot").last.hover()
    page.locator(
        "#chatbot button[title='Copy message'], #chatbot button[aria-label*='opy']"
    ).last.click()
    _wait(lambda: page.evaluate("window.__lastCopied || ''") != "", 5, what="the copy")
    assert (
        page.evaluate("window.__lastCopied")
        == OPEN_FENCE
        == page.evaluate("navigator.clipboard.readText()")
    )
    assert page.locator("#continue-reply").is_visible()  # cut by max tokens: something to continue
    # Export Markdown: the reply exactly, then a closing fence so the rest is not code (one click: a download)
    page.locator("#sidebar .label-wrap", has_text="Rename").click()
    with page.expect_download() as dl:
        page.get_by_role("button", name="Export Markdown").click()
    md = open(dl.value.path(), encoding="utf-8").read()
    assert f"## Assistant\n\n{OPEN_FENCE}\n```\n\n_(stopped)_" in md
    # New chat: the address forgets the old chat at once, and nothing to continue any more
    page.click("#new-chat")
    _wait(lambda: "c=" not in page.url, 10, what="the address without ?c=")
    _wait(
        lambda: _bot_rows(page) == 0 and not page.locator("#continue-reply").is_visible(),
        20,
        what="an empty chat, nothing to continue",
    )
    # a search that matches nothing says so
    page.get_by_placeholder("Search chats…").fill("zebra crossing")
    _wait(lambda: "No chats match" in page.inner_text("#conv-list"), 20, what="'No chats match'")
    page.context.close()


# Labels of the chatbot's frame ("Chat") that lie over its scrolling area: messages scroll under
# them (Gradio's floating block label covered the first line of whatever was scrolled to the top).
# The whole area, not the messages there now: what lies under the label depends on the scroll.
_LABEL_OVER_SCROLL_AREA = """() => {
  const chat = document.querySelector('#chatbot');
  const box = (e) => e.getBoundingClientRect();
  const meets = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const scroller = [...chat.querySelectorAll('*')].find((e) => e.scrollHeight > e.clientHeight + 50
    && getComputedStyle(e).overflowY !== 'visible');
  const labels = [...chat.querySelectorAll('*')].filter((e) => !e.closest('.message-row, .message')
    && (e.innerText || '').trim() === 'Chat' && box(e).width > 0);
  return labels.filter((l) => meets(box(l), box(scroller))).map((l) => l.outerHTML.slice(0, 80));
}"""


def test_arrows_edit_box_and_no_label_over_a_scrolled_message(server, browser):  # noqa: F811
    app, convs = server
    page = _open(browser, app.url + f"?c={convs['long']}")
    _wait(lambda: _bot_rows(page) == LONG_CHAT, 60, what="the long chat")
    arrow = page.locator("#chatbot .branch-nav a").first  # ‹ of ‹ 2/2 ›
    _wait(lambda: arrow.is_visible(), 20, what="the version arrows")
    assert "2/2" in page.locator("#chatbot .branch-nav").first.inner_text()
    hit = arrow.bounding_box()
    assert hit["width"] >= 24 and hit["height"] >= 24, hit  # a finger's (and a mouse's) target
    # no "Chat" label of the chatbot lies over the area its messages scroll through
    assert page.evaluate(_LABEL_OVER_SCROLL_AREA) == []
    # the edit box of a past message takes most of the chat's width
    user = page.locator("#chatbot .message.user").nth(2)
    edit = page.locator("#chatbot textarea").first
    for attempt in range(
        3
    ):  # under load a click can land while the chatbot re-renders: click again
        user.scroll_into_view_if_needed()
        user.hover()
        page.locator("#chatbot button[title='Edit'], #chatbot button[aria-label='Edit']").nth(
            2
        ).click()
        try:
            _wait(lambda: edit.is_visible(), 10, what="the edit box")
            break
        except TimeoutError:
            if attempt == 2:
                raise
    width, chat = edit.bounding_box()["width"], page.locator("#chatbot").bounding_box()["width"]
    assert width >= 0.6 * chat, (width, chat)
    page.context.close()


def test_save_hint_export_link_import_title(server, browser, tmp_path):  # noqa: F811
    app, convs = server
    page = _open(browser, app.url + f"?c={convs['markdown']}")
    _wait(lambda: _bot_rows(page) == 1, 60, what="the chat")
    # a preset's hint asks for "Save for new chats" until it is pressed
    page.locator("#system-prompt .label-wrap").first.click()
    page.locator("#prompt-presets input").click()
    page.locator("li[role=option]").first.click()
    hint = page.locator("#prompt-preset-info")
    _wait(lambda: "Save for new chats" in hint.inner_text(), 20, what="the hint")
    page.get_by_role("button", name="Save for new chats").click()
    _wait(lambda: "Save for new chats" not in hint.inner_text(), 20, what="the hint cleared")
    # an imported chat is told apart from the one it was exported from
    export = {
        "format": "llm-chat-conversation",
        "version": 1,
        "conversation": {"title": "Markdown reply"},
        "messages": [
            {"id": 1, "parent_id": None, "role": "user", "content": "Show me a plan with code."},
            {"id": 2, "parent_id": 1, "role": "assistant", "content": MARKDOWN},
        ],
    }
    path = tmp_path / "markdown.json"
    path.write_text(json.dumps(export))
    page.locator("#sidebar .label-wrap", has_text="Rename").click()
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Import JSON…").click()
    chooser.value.set_files(str(path))
    titles = page.locator("#conv-list")
    _wait(lambda: "Markdown reply (imported)" in titles.inner_text(), 30, what="the imported chat")
    labels = [t.strip() for t in page.locator("#conv-list label").all_inner_texts()]
    assert "Markdown reply" in labels and "Markdown reply (imported)" in labels, labels
    # the imported chat is on screen: export it, delete it, and its download link goes with it
    link = page.locator("#export-link a")
    with page.expect_download():  # one click: it downloads at once
        page.get_by_role("button", name="Export JSON").click()
    _wait(lambda: link.count() >= 1, 20, what="the download link")
    page.locator("#delete").click()
    page.locator("#delete-yes").click()
    _wait(
        lambda: "Markdown reply (imported)" not in titles.inner_text(), 20, what="the chat deleted"
    )
    _wait(lambda: link.count() == 0, 10, what="the download link gone")
    page.context.close()
