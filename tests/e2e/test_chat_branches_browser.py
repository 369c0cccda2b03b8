"""The chat people expect, in real headless Chromium against the real model (issue #11 items 1-4):
edit then browse back to the old branch and continue on it; regenerate then `< 1/2 >`; n=2, pick
the second and continue (the next prompt holds its tokens); Enter while busy; copy gives plain
text; delete asks first; Esc stops; the model line; beam search side by side, and a search that
outlives a reload (issue 26.1). One app for the module (small pool)."""

import pytest

from tests.e2e.polling import wait_until as _wait
from tests.e2e.browser import _chromium, browser  # noqa: F401  (the Chromium fixtures)
from tests.e2e.helpers import (
    done as _done,
    open_in_new_context as _open,
    rows as _rows,
    set_sampling as _sampling,
    send_and_wait as _send,
    status as _status,
)

pytestmark = pytest.mark.slow


def _nav(page, text):
    """Click the branch link `text` ("‹" or "›") of the last message that has one."""
    page.locator("#chatbot .branch-nav a", has_text=text).last.click()


def test_edit_browse_back_and_continue_and_regenerate_arrows(module_server, browser):  # noqa: F811
    page = _open(browser, module_server.url)
    assert "context 512 tokens" in page.locator("#model-line").inner_text()
    assert "SmolLM2" in page.locator("#model-line").inner_text()
    _sampling(page, max_tokens=8)
    _send(page, "Name a color.")
    _send(page, "Name a fruit.")
    old_reply = _rows(page, "bot")[1].split("\n")[0]
    # edit the second question: a new branch, `< 2/2 >` on it
    page.locator("#chatbot .message.user").nth(1).hover()
    page.locator("#chatbot button[title='Edit']").nth(1).click()
    box = page.locator("#chatbot textarea").first
    box.fill("Name a vegetable.")
    box.press("Enter")  # Enter sends in the edit box too
    _wait(lambda: "vegetable" in " ".join(_rows(page, "user")), timeout=30)
    _wait(lambda: _done(page) and "2/2" in _rows(page, "user")[1], timeout=120)
    # browse back: the old question and its reply are there again
    _nav(page, "‹")
    _wait(lambda: "fruit" in _rows(page, "user")[1] and "1/2" in _rows(page, "user")[1], timeout=20)
    assert _rows(page, "bot")[1].split("\n")[0] == old_reply
    # and continue on it
    _send(page, "And a number?")
    users = _rows(page, "user")
    assert len(users) == 3 and "fruit" in users[1] and "number" in users[2]
    # the old branch's blocks were still shared/cached: the continued turn prefilled only its tail
    from tests.e2e.conftest import read_db

    stats = read_db(
        module_server.db,
        "SELECT s.prompt_tokens, s.cached_tokens FROM reply_stats s "
        "ORDER BY s.message_id DESC LIMIT 1",
    )[0]
    assert stats["cached_tokens"] >= stats["prompt_tokens"] - 40, stats
    # regenerate the last reply: `< 2/2 >`, then back to `< 1/2 >`
    page.locator("#regenerate").click()
    _wait(lambda: page.locator("#stop").is_visible() or _done(page), timeout=30)
    _wait(lambda: _done(page) and "2/2" in _rows(page, "bot")[-1], timeout=120)
    _nav(page, "‹")
    _wait(lambda: "1/2" in _rows(page, "bot")[-1], timeout=20)
    page.context.close()


def test_two_alternatives_pick_the_second_and_continue(module_server, browser):  # noqa: F811
    page = _open(browser, module_server.url)
    page.locator("#new-chat").click()
    _sampling(page, max_tokens=6, n=2, temperature=1.5)
    _send(page, "Say a random word.")
    _wait(lambda: page.locator("#pick-1").is_visible(), timeout=30)
    second = page.locator("#alt-1").inner_text()
    page.locator("#pick-1").click()
    _wait(lambda: "alternative 2" in _status(page), timeout=20)
    assert "shown in the conversation" in page.locator("#alt-1").inner_text()
    _sampling(page, n=1)
    _send(page, "Again.")
    from tests.e2e.conftest import read_db

    rows = read_db(
        module_server.db, "SELECT id, parent_id, role, token_ids FROM messages ORDER BY id"
    )
    last_user = [r for r in rows if r["role"] == "user"][-1]
    picked = next(r for r in rows if r["id"] == last_user["parent_id"])
    siblings = [
        r for r in rows if r["parent_id"] == picked["parent_id"] and r["role"] == "assistant"
    ]
    assert len(siblings) == 2 and picked["id"] == siblings[1]["id"]  # all n stored, the 2nd chosen
    import json

    prompt, toks = json.loads(last_user["token_ids"]), json.loads(picked["token_ids"])
    n = len(toks)
    assert any(
        prompt[i : i + n] == toks for i in range(len(prompt) - n + 1)
    )  # its tokens are in the prompt
    assert second.split("\n")[0]  # the panel showed text
    page.context.close()


def test_enter_while_busy_esc_copy_and_delete_confirmation(module_server, browser):  # noqa: F811
    page = _open(browser, module_server.url, permissions=["clipboard-read", "clipboard-write"])
    page.locator("#new-chat").click()
    _sampling(page, max_tokens=200)
    page.fill("#msg textarea", "Write a long story about a dragon.")
    page.keyboard.press("Enter")
    _wait(lambda: page.locator("#stop").is_visible(), timeout=30)
    assert not page.locator("#send").is_visible()  # one button: Stop while busy
    page.fill("#msg textarea", "second message")
    page.keyboard.press("Enter")
    _wait(
        lambda: "One reply at a time" in _status(page) or "One reply at a time" in page.content(),
        timeout=10,
    )
    assert page.locator("#msg textarea").input_value() == "second message"  # kept, not lost
    page.keyboard.press("Escape")  # Esc stops
    _wait(lambda: _done(page) and _status(page).strip() == "stopped", timeout=60)
    # copy gives the reply's plain text (no stats line, no HTML)
    page.locator("#chatbot .message.bot").last.hover()
    page.locator(
        "#chatbot button[title='Copy message'], #chatbot button[aria-label*='opy']"
    ).last.click()
    _wait(lambda: page.evaluate("window.__lastCopied || ''") != "", timeout=5)
    copied = page.evaluate("window.__lastCopied")
    assert copied and "<" not in copied and "tok/s" not in copied and "stopped" not in copied
    assert copied.split()[0] in page.locator("#chatbot .message.bot").last.inner_text()
    # delete asks first and names the chat
    page.locator("#sidebar .label-wrap", has_text="Rename").click()
    titles = page.locator("#chat-title textarea, #chat-title input")
    _wait(
        lambda: any(
            "Write a long story" in titles.nth(i).input_value() for i in range(titles.count())
        ),
        timeout=10,
    )  # rename acts on the chat on screen
    page.locator("#delete").click()
    _wait(lambda: page.locator("#delete-confirm:visible").count() >= 1, timeout=10)
    question = page.locator("#delete-confirm:visible").first.inner_text()
    assert "Write a long story" in question and "messages" in question
    page.locator("#delete-no").click()
    _wait(lambda: page.locator("#delete-confirm:visible").count() == 0, timeout=10)
    assert "Write a long story" in page.locator("#conv-list").inner_text()
    page.locator("#delete").click()
    page.locator("#delete-yes").click()
    _wait(lambda: "Write a long story" not in page.locator("#conv-list").inner_text(), timeout=10)
    page.context.close()


def _meter_tokens(page) -> int:
    shown = page.eval_on_selector_all(
        "#ctx-meter [data-k]", "els => Object.fromEntries(els.map(e => [e.dataset.k, e.dataset.v]))"
    )
    return int(shown.get("ctx_tokens", 0))


def _stored_tokens(db, conv: str, reply_id: int) -> int:
    """Prompt + reply tokens of the branch through `reply_id`, from the stored ids."""
    import json
    from tests.e2e.conftest import read_db

    rows = {
        r["id"]: r
        for r in read_db(
            db, "SELECT id, parent_id, token_ids FROM messages WHERE conversation_id = ?", (conv,)
        )
    }
    reply = rows[reply_id]
    return len(json.loads(rows[reply["parent_id"]]["token_ids"])) + len(
        json.loads(reply["token_ids"])
    )


def test_beam_search_option_shows_k_beams_side_by_side_and_one_can_be_picked(
    module_server, browser
):  # noqa: F811
    """Also (issue 47): the context meter follows the version on screen after a beam turn, a picked
    beam and a `‹` switch (the engine's session still holds the ordinary turn before them)."""
    page = _open(browser, module_server.url)
    page.locator("#new-chat").click()
    _sampling(page, max_tokens=8, temperature=0)
    _send(page, "Hello!")  # an ordinary turn first: the chat's session
    before = _meter_tokens(page)
    page.locator("#sampling .label-wrap").first.click()
    page.locator("#decoding input").click()
    page.locator("#decoding input").fill("width 3")
    page.locator("#decoding input").press("Enter")
    page.locator("#sampling .label-wrap").first.click()
    _send(page, "What is the capital of France?")
    _wait(lambda: page.locator("#pick-2").is_visible(), timeout=60)
    beams = [page.locator(f"#alt-{k}").inner_text() for k in range(3)]
    assert all(f"Beam {k + 1}" in beams[k] and "score" in beams[k] for k in range(3))
    assert not page.locator("#alt-3").is_visible()
    from tests.e2e.conftest import read_db

    rows = read_db(
        module_server.db, "SELECT id, parent_id, role, content FROM messages ORDER BY id"
    )
    replies = [r for r in rows if r["role"] == "assistant"][-3:]
    assert len({r["parent_id"] for r in replies}) == 1  # all 3 stored as versions of one reply
    conv = page.url.split("c=")[1].split("&")[0]
    want = _stored_tokens(module_server.db, conv, replies[0]["id"])
    _wait(
        lambda: _meter_tokens(page) == want > before,
        timeout=20,
        what="the meter after the beam turn",
    )
    assert "not in memory now" in page.inner_text("#ctx-meter")
    page.locator("#pick-2").click()
    _wait(lambda: "alternative 3" in _status(page), timeout=20)
    shown = _rows(page, "bot")[-1]
    assert replies[2]["content"].split()[0] in shown and "3/3" in shown
    _wait(
        lambda: _meter_tokens(page) == _stored_tokens(module_server.db, conv, replies[2]["id"]),
        timeout=20,
        what="the meter after picking beam 3",
    )
    _nav(page, "‹")  # beam 3 -> beam 2, by the version arrow
    _wait(lambda: "2/3" in _rows(page, "bot")[-1], timeout=20, what="version 2")
    _wait(
        lambda: _meter_tokens(page) == _stored_tokens(module_server.db, conv, replies[1]["id"]),
        timeout=20,
        what="the meter after the version switch",
    )


def test_a_beam_search_outlives_a_reload_and_the_reloaded_page_shows_its_beams(
    module_server, browser
):  # noqa: F811
    """Issue 26.1: a beam search belongs to the server like a reply (ui/chat/beam.BeamTurn). Reload
    while it searches: the reloaded page says it is searching, then shows the beams, all stored."""
    from tests.e2e.conftest import read_db

    page = _open(browser, module_server.url)
    page.locator("#new-chat").click()
    _sampling(page, max_tokens=400, temperature=0)  # a search long enough to reload during it
    page.locator("#sampling .label-wrap").first.click()
    page.locator("#decoding input").click()
    page.locator("#decoding input").fill("width 2")
    page.locator("#decoding input").press("Enter")
    page.locator("#sampling .label-wrap").first.click()
    page.fill("#msg textarea", "Write a long story about a lighthouse keeper and the sea.")
    page.keyboard.press("Enter")
    _wait(
        lambda: "searching" in _status(page) and "c=" in page.url,
        timeout=30,
        what="the search started",
    )
    conv = page.url.split("c=")[1].split("&")[0]
    page.reload()
    page.wait_for_selector("#msg textarea")
    _wait(
        lambda: "searching" in _status(page) and page.locator("#stop").is_visible(),
        timeout=30,
        what="the reloaded page showing the search still running",
    )
    _wait(lambda: page.locator("#pick-1").is_visible(), timeout=240, what="the beams")
    assert "Beam 2" in page.locator("#alt-1").inner_text() and _status(page).strip() == "finished"
    rows = read_db(
        module_server.db,
        "SELECT parent_id, content FROM messages WHERE conversation_id = ? AND role = 'assistant'",
        (conv,),
    )
    assert (
        len(rows) == 2 and len({r["parent_id"] for r in rows}) == 1
    )  # both beams, versions of one reply
    assert rows[0]["content"].split()[0] in _rows(page, "bot")[-1]
    page.context.close()
