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
from tests.e2e.test_chat_browser import browser  # noqa: F401  (the Chromium fixture)

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
LONG_CHAT = 8                      # user/reply pairs: enough for the chatbot to scroll


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("small-items")
    db = tmp / "chat.db"
    st = Storage(str(db))
    try:
        md = st.create_conversation(title="Markdown reply")
        st.add_message(md["id"], "user", "Show me a plan with code.")
        reply = st.add_message(md["id"], "assistant", MARKDOWN)
        st.add_reply_stats(reply["id"], output_tokens=60, ttft_s=0.1, tokens_per_s=20.0, prompt_tokens=30,
                           cached_tokens=0)
        long = st.create_conversation(title="A long chat")
        for i in range(LONG_CHAT):
            st.add_message(long["id"], "user", f"Question {i}: what comes after {i}?")
            last = st.add_message(long["id"], "assistant", f"After {i} comes {i + 1}.\n\n" + "More words. " * 30)
        st.add_sibling(last["id"], "Another version of the last reply.")   # ‹ 2/2 › under it
    finally:
        st.close()
    app = AppServer(db, SMALL, tmp / "app.log")
    try:
        yield app.wait_ready(), {"markdown": md["id"], "long": long["id"]}
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
    page = _open(browser, app.url + f"?c={convs['markdown']}", permissions=["clipboard-read", "clipboard-write"])
    _wait(lambda: "tok/s" in page.locator("#chatbot .message.bot").last.inner_text(), 60, what="the reply")
    page.locator("#chatbot .message.bot").last.hover()
    page.locator("#chatbot button[title='Copy message'], #chatbot button[aria-label*='opy']").last.click()
    _wait(lambda: page.evaluate("window.__lastCopied || ''") != "", 5, what="the copy")
    assert page.evaluate("window.__lastCopied") == MARKDOWN
    assert page.evaluate("navigator.clipboard.readText()") == MARKDOWN
    page.evaluate("window.__lastCopied = ''")
    page.locator("#chatbot").click()                       # not typing in a box
    page.keyboard.press("Control+Shift+C")                 # the shortcut copies the same source
    _wait(lambda: page.evaluate("window.__lastCopied || ''") != "", 5, what="the shortcut's copy")
    assert page.evaluate("window.__lastCopied") == MARKDOWN
    page.context.close()
