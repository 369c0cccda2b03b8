"""The chat page in real headless Chromium (Debian chromium + Playwright; never `playwright install`):
a streamed reply, Stop mid-reply without an error badge, a second tab chatting at the same time (n=2
alternatives side by side), edit-and-resend of a past message,
and a closed tab's KV blocks released. Screenshots go to docs/."""

import shutil
import time
from pathlib import Path

import pytest

from tests.e2e.polling import wait_until as _wait
from tests.e2e.browser import _chromium, browser  # noqa: F401  (the Chromium fixtures)
from tests.e2e.helpers import (
    finished as _finished,
    open_page as _open,
    reply as _reply,
    send as _send,
    set_number as _set_number,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _short_replies(page, max_tokens: int = 8) -> None:
    """Greedy, short replies: these tests are about the page, not the text."""
    page.locator("#sampling .label-wrap").first.click()
    _set_number(page, "temperature", 0)
    _set_number(page, "max-tokens", max_tokens)
    page.locator("#sampling .label-wrap").first.click()


def _body(page) -> str:
    """The reply without its stats line."""
    return _reply(page).split("\n\n")[0] if "tokens" in _reply(page) else _reply(page)


_RECORD_REPLIES = """() => {
  window.__replies = [];
  const note = () => {
    const bots = document.querySelectorAll('#chatbot .message.bot');
    const t = bots.length ? bots[bots.length - 1].innerText.trim() : '';
    if (window.__replies[window.__replies.length - 1] !== t) window.__replies.push(t);
  };
  new MutationObserver(note).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


def _no_error_badge(page) -> None:
    assert page.locator("#chatbot .error, .toast-body.error").count() == 0
    assert "Error" not in page.locator("#chatbot").inner_text()


def _sessions(server) -> set:
    return {s["session_id"] for s in server.kv()["sequences"]}


def test_chat_in_the_browser_stop_second_tab_and_close(
    launch, browser, chat_api, tmp_path, screenshot_dir
):
    api = chat_api
    server = launch()
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = _open(context, server.url)
    page.locator("#sampling .label-wrap").first.click()  # open the sampling settings
    _set_number(page, "temperature", 0)
    _set_number(page, "max-tokens", 80)

    # 1. A streamed reply: several different partial texts, then the final one with its stats.
    # The page records every text its last reply shows (a MutationObserver, so a slow poll from
    # here on a loaded machine cannot miss the partial texts; CI once saw only the final one).
    page.evaluate(_RECORD_REPLIES)
    _send(page, "Write a Python function that adds two numbers.")
    _wait(lambda: _finished(page), every=0.1)
    seen = set(page.evaluate("() => window.__replies"))
    assert len({s for s in seen if s and "queued" not in s}) >= 3, seen  # it streamed
    assert "prompt tokens from cache" in _reply(page)
    _no_error_badge(page)
    conv1 = api.read_db(server.db, "SELECT id FROM conversations")[0]["id"]
    page.locator(
        "#sampling .label-wrap"
    ).first.click()  # fold the settings away for the screenshots
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(tmp_path / "chat.png"))
    dark = _open(context, server.url + "?__theme=dark")  # Gradio's dark mode, same conversation
    dark.locator("#conv-list label").filter(has_text="Python function").click()
    _wait(lambda: "prompt tokens from cache" in _reply(dark))
    dark.screenshot(path=str(tmp_path / "chat-dark.png"))
    dark.close()
    page.locator("#sampling .label-wrap").first.click()

    # 2. Stop mid-reply, twice (the badge showed up only sometimes with naive Blocks chats).
    _set_number(page, "max-tokens", 400)
    for prompt in (
        "Tell me a long story about a dragon who loves bread.",
        "Tell me another long story.",
    ):
        _send(page, prompt)
        _wait(lambda: len(_body(page).split()) >= 5 and "queued" not in _reply(page))
        page.click("#stop")
        _wait(lambda: "stopped" in _reply(page), timeout=15)
        frozen = _reply(page)
        time.sleep(1.0)
        assert _reply(page) == frozen  # nothing streams after Stop
        _no_error_badge(page)
    rows = api.read_db(
        server.db,
        "SELECT role, status FROM messages WHERE conversation_id = ? ORDER BY id",
        (conv1,),
    )
    assert [r["status"] for r in rows if r["role"] == "assistant"][-2:] == ["stopped", "stopped"]
    assert server.wait_kv(lambda s: s["stats"]["running"] == 0)["stats"]["running"] == 0
    page.screenshot(path=str(tmp_path / "chat-stopped.png"))

    # 3. A second tab chats at the same time as the first one.
    page2 = _open(context, server.url)
    page2.locator("#sampling .label-wrap").first.click()
    _set_number(page2, "max-tokens", 40)
    _set_number(page2, "n-alternatives", 2)  # two alternatives side by side
    _set_number(page, "max-tokens", 40)
    _send(page2, "What is a KV cache? Answer in one sentence.")
    _send(page, "Thanks! Now say goodbye.")
    _wait(lambda: _finished(page2))
    _wait(lambda: _finished(page))
    _no_error_badge(page2)
    assert page2.locator("#alt-0").is_visible() and page2.locator("#alt-1").is_visible()
    assert not page2.locator("#alt-2").is_visible()
    assert "Alternative 2" in page2.locator("#alt-1").inner_text()
    page2.screenshot(path=str(tmp_path / "chat-alternatives.png"), full_page=True)
    conv2 = _wait(
        lambda: [
            r["id"]
            for r in api.read_db(server.db, "SELECT id FROM conversations")
            if r["id"] != conv1
        ]
    )[0]
    assert {conv1, conv2} <= _sessions(server)  # both open conversations hold their KV blocks

    # 4. Edit the second tab's question in place and resend: a new branch, the old one kept.
    _set_number(page2, "n-alternatives", 1)
    page2.locator("#chatbot .message.user").first.hover()
    page2.locator("#chatbot button[title='Edit']").first.click()
    page2.locator("#chatbot textarea").first.fill("What is a block table? One sentence.")
    page2.locator("#chatbot button[title='Submit']").first.click()
    _wait(lambda: "block table" in page2.locator("#chatbot .message.user").first.inner_text())
    _wait(lambda: _finished(page2) and "tokens" in _reply(page2))
    _no_error_badge(page2)
    users = api.read_db(
        server.db,
        "SELECT content FROM messages WHERE conversation_id = ? AND role = 'user' ORDER BY id",
        (conv2,),
    )
    assert [u["content"] for u in users] == [
        "What is a KV cache? Answer in one sentence.",
        "What is a block table? One sentence.",
    ]
    assert page2.locator("#chatbot .message.user").count() == 1  # the active branch only
    assert page2.locator("#chatbot .message.bot").count() == 1

    # 5. Close the second tab: its blocks are released, the first tab's stay.
    page2.close()
    _wait(lambda: conv2 not in _sessions(server), timeout=20)
    assert conv1 in _sessions(server)
    page.close()
    snap = server.wait_kv(lambda s: s["stats"]["used_blocks"] == s["stats"]["pinned_blocks"])
    assert snap["stats"]["used_blocks"] == snap["stats"]["pinned_blocks"]

    if screenshot_dir != tmp_path:
        for name in ("chat.png", "chat-dark.png", "chat-stopped.png", "chat-alternatives.png"):
            shutil.copyfile(tmp_path / name, screenshot_dir / name)


def test_export_link_downloads_the_chat_in_the_browser(module_server, browser):
    """The export buttons show a link served by the app (owner-only, #12.12); clicking it in a real
    browser downloads the chat as a file."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = _open(context, module_server.url)
    _short_replies(page)
    _send(page, "Export me: lighthouse keeper notes.")
    _wait(lambda: _finished(page), 120, what="the reply")
    page.locator("#sidebar .label-wrap", has_text="Rename").click()
    page.get_by_role("button", name="Export Markdown").click()
    link = page.locator("#export-link a")
    _wait(lambda: link.count() == 1, 30, what="the download link")
    assert "gradio_api/file" not in link.get_attribute("href")
    with page.expect_download() as info:
        link.click()
    path = info.value.path()
    assert "lighthouse keeper notes" in Path(path).read_text(encoding="utf-8")
    context.close()


def test_editing_a_message_with_markup_stores_what_was_typed(module_server, browser):
    """The edit box starts from the message's safe display form (`&lt;div>`); saving an edit stores
    the user's own characters (`<div>`), not the display form, and not the branch links."""
    from tests.e2e.conftest import read_db

    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = _open(context, module_server.url)
    _short_replies(page)
    page.locator("#new-chat").click()
    _send(page, "What does <div> do?")
    _wait(lambda: _finished(page), 120, what="the reply")
    page.locator("#chatbot .message.user").last.hover()
    page.locator("#chatbot button[title='Edit']").last.click()
    box = page.locator("#chatbot textarea").first
    assert "&lt;div" in box.input_value()  # what Gradio's edit box starts from
    box.fill(box.input_value() + " Briefly.")
    box.press("Enter")
    _wait(
        lambda: "2/2" in page.locator("#chatbot .message.user").last.inner_text(),
        60,
        what="the new version",
    )
    _wait(lambda: _finished(page), 120, what="the reply to the edit")
    rows = read_db(
        module_server.db,
        "SELECT content FROM messages WHERE role = 'user' ORDER BY id DESC LIMIT 1",
    )
    assert rows[0]["content"] == "What does <div> do? Briefly."
    # a second edit of the message now showing `‹ 2/2 ›`: the links are not stored either
    page.locator("#chatbot .message.user").last.hover()
    page.locator("#chatbot button[title='Edit']").last.click()
    box = page.locator("#chatbot textarea").first
    box.fill(box.input_value().replace("Briefly.", "In one line."))
    box.press("Enter")
    _wait(
        lambda: "3/3" in page.locator("#chatbot .message.user").last.inner_text(),
        60,
        what="a third version",
    )
    rows = read_db(
        module_server.db,
        "SELECT content FROM messages WHERE role = 'user' ORDER BY id DESC LIMIT 1",
    )
    assert rows[0]["content"] == "What does <div> do? In one line."
    context.close()


# Counts the animation frames Gradio's status tracker asks the browser for itself. Installed before
# any page script, so the page's own wrapper (ui/page_assets.HEAD) wraps this one: what reaches it
# from the tracker went around that wrapper.
_COUNT_TRACKER_FRAMES = """(() => {
  const raf = window.requestAnimationFrame.bind(window);
  window.__trackerFrames = 0;
  window.requestAnimationFrame = (cb) => {
    if ((new Error().stack || "").includes("/statustracker")) { window.__trackerFrames += 1; }
    return raf(cb);
  };
})()"""


def test_an_idle_tab_asks_for_no_status_tracker_frames(module_server, browser):
    """Gradio's page-wide loading tracker leaves a 60-frames-a-second loop behind it (~14% of a core
    per open tab, measured); the page's first script spaces those frames out as timeouts. The page
    served at / starts its <head> with that script, and an idle tab asks for no such frame."""
    from ui.page_assets import HEAD

    assert module_server.get("/").split("<head>", 1)[1].startswith(HEAD)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_init_script(_COUNT_TRACKER_FRAMES)
    page = _open(context, module_server.url)
    page.wait_for_timeout(1500)  # the chat list's timer ticks in between
    assert page.evaluate("() => window.__trackerFrames") == 0
    # the elapsed-time counter still runs while an event is pending: its frames come as timeouts
    assert "setTimeout" in page.evaluate("() => window.requestAnimationFrame.toString()")
    context.close()
