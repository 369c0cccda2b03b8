"""The chat's Continue button and reply format, in real headless Chromium against `python app.py`
and the real model: a reply cut by max tokens, continued, is still one stored message (same id,
same branch) whose ids equal an uninterrupted greedy reply of the same total length (Regenerate
with that many tokens, on the same server), and the continuation reused the reply's blocks; a page
reloaded mid-continue reattaches and the whole continuation is stored (issue 26.1); a
"JSON matching a schema" reply validates against the pasted schema."""

import json
import re

import jsonschema
import pytest

from tests.e2e.polling import wait_until as _wait
from tests.e2e.conftest import read_db
from tests.e2e.browser import _chromium, browser  # noqa: F401  (the Chromium fixtures)
from tests.e2e.helpers import (
    done as _done,
    open_in_new_context as _open,
    set_sampling as _sampling,
    send_and_wait as _send,
)

pytestmark = pytest.mark.slow


# Installed before the reload: every text of the last reply the page paints while Stop is shown.
_RECORD_LIVE = """(() => {
  window.__live = [];
  const note = () => {
    const stop = document.querySelector('#stop');
    if (!stop || stop.offsetParent === null) return;
    const bots = document.querySelectorAll('#chatbot .message.bot');
    const t = bots.length ? bots[bots.length - 1].innerText.trim() : '';
    if (t && window.__live[window.__live.length - 1] !== t) window.__live.push(t);
  };
  const start = () => new MutationObserver(note).observe(document.body,
      {subtree: true, childList: true, characterData: true, attributes: true});
  if (document.body) start(); else document.addEventListener('DOMContentLoaded', start);
})();"""


def _replies(db):
    return read_db(
        db,
        "SELECT m.id, m.parent_id, m.content, m.token_ids, m.status, s.cached_tokens "
        "FROM messages m LEFT JOIN reply_stats s ON s.message_id = m.id "
        "WHERE m.role = 'assistant' ORDER BY m.id",
    )


def _click_and_wait(page, selector):
    page.locator(selector).click()
    _wait(lambda: page.locator("#stop").is_visible() or _done(page), timeout=30)
    _wait(lambda: _done(page), timeout=120)


def test_continue_extends_the_same_reply_like_an_uninterrupted_greedy_one(module_server, browser):  # noqa: F811
    page = _open(browser, module_server.url)
    page.locator("#new-chat").click()
    _sampling(page, max_tokens=10, temperature=0)
    _send(page, "Write a long story about a lighthouse keeper and the sea.")
    first = _replies(module_server.db)
    assert len(first) == 1
    cut = json.loads(first[0]["token_ids"])
    assert len(cut) == 10  # cut by max tokens, not ended by the model
    _wait(lambda: page.locator("#continue-reply").is_visible(), timeout=10)
    _click_and_wait(page, "#continue-reply")
    after = _replies(module_server.db)
    assert [r["id"] for r in after] == [first[0]["id"]]  # the same message, no new branch
    ids = json.loads(after[0]["token_ids"])
    assert ids[:10] == cut and len(ids) == 20
    assert after[0]["content"].startswith(first[0]["content"])
    shown = page.locator("#chatbot .message.bot").last.inner_text()
    assert after[0]["content"][-20:].strip() in shown
    assert "+10 tokens (20 total)" in shown  # the line counts the whole reply (issue 47)
    prompt = read_db(
        module_server.db, "SELECT token_ids FROM messages WHERE id = ?", (after[0]["parent_id"],)
    )
    prompt_len = len(json.loads(prompt[0]["token_ids"]))
    assert (
        after[0]["cached_tokens"] >= (prompt_len + 10) // 16 * 16
    )  # the reply's blocks were reused
    assert _greedy_ids(json.loads(prompt[0]["token_ids"]), 20) == ids  # as if never interrupted
    page.context.close()


def _greedy_ids(prompt_ids: list[int], max_tokens: int) -> list[int]:
    """An uninterrupted greedy reply: the engine as the app builds it (dtype "auto"), the chat's
    settings (greedy, repetition penalty 1.1), the stored prompt ids."""
    from engine import LLM, SamplingParams

    ref = LLM(num_blocks=64, max_model_len=512, dtype="auto")
    try:
        whole = ref.generate(
            [{"prompt_token_ids": prompt_ids}],
            SamplingParams(temperature=0, repetition_penalty=1.1, max_tokens=max_tokens),
        )[0]
    finally:
        ref.shutdown()
    return whole.outputs[0].token_ids


def _reply_of(db, conv):
    rows = read_db(
        db,
        "SELECT id, parent_id, content, token_ids, status FROM messages "
        "WHERE conversation_id = ? AND role = 'assistant' ORDER BY id",
        (conv,),
    )
    return rows


def test_reload_mid_continue_keeps_streaming_and_stores_the_whole_greedy_reply(
    module_server, browser
):  # noqa: F811
    """Issue 26.1: a continued reply belongs to the server like any other. Reload the page while
    Continue is generating: the reloaded page reattaches and keeps painting it, and the stored reply
    is the whole continuation, equal to one uninterrupted greedy reply of the same length."""
    db = module_server.db
    page = _open(browser, module_server.url)
    page.locator("#new-chat").click()
    _sampling(page, max_tokens=10, temperature=0)
    _send(page, "Write a long story about a dragon who learns to bake bread in a small village.")
    conv = re.search(r"[?&]c=([^&]+)", page.url).group(1)
    first = _reply_of(db, conv)
    assert len(first) == 1 and len(json.loads(first[0]["token_ids"])) == 10
    cut = json.loads(first[0]["token_ids"])
    _sampling(page, max_tokens=300)
    _wait(lambda: page.locator("#continue-reply").is_visible(), timeout=10)
    page.locator("#continue-reply").click()
    # mid-continue: the stored reply (flushed every ~2 s while it streams) has grown
    _wait(lambda: len(_reply_of(db, conv)[0]["content"]) > len(first[0]["content"]), timeout=120)
    page.add_init_script(_RECORD_LIVE)  # records in the page: no polling window to miss
    page.reload()
    page.wait_for_selector("#msg textarea")

    def ended():
        """The reply's ids are stored (only at its end: before, the row keeps the first 10) and the
        page shows Send again."""
        return (
            len(json.loads(_reply_of(db, conv)[0]["token_ids"])) > 10
            and page.locator("#send").is_visible()
        )

    _wait(ended, timeout=240, every=0.1, what="the continued reply stored")
    live = set(page.evaluate("() => window.__live || []"))  # painted while Stop was up
    after = _reply_of(db, conv)
    assert [r["id"] for r in after] == [first[0]["id"]]  # still the one reply, continued in place
    assert after[0]["status"] == "complete"  # not "stopped" by the reload
    assert len(live) >= 2, live  # the reloaded page painted it as it grew
    _wait(lambda: _done(page), timeout=30, what="the page's final paint")
    ids = json.loads(after[0]["token_ids"])
    assert ids[:10] == cut and len(ids) > 10 + 10
    assert (
        after[0]["content"][-20:].strip() in page.locator("#chatbot .message.bot").last.inner_text()
    )
    prompt = read_db(db, "SELECT token_ids FROM messages WHERE id = ?", (after[0]["parent_id"],))
    assert _greedy_ids(json.loads(prompt[0]["token_ids"]), 10 + 300) == ids
    page.context.close()


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "legs": {"type": "integer", "minimum": 0, "maximum": 8},
    },
    "required": ["name", "legs"],
}


def test_reply_format_json_schema(module_server, browser):  # noqa: F811
    page = _open(browser, module_server.url)
    page.locator("#new-chat").click()
    _sampling(page, max_tokens=60, temperature=0)
    page.locator("#sampling .label-wrap").first.click()
    page.locator("#reply-format input").click()
    page.get_by_role("option", name="JSON matching a schema").click()
    page.fill("#reply-schema textarea", json.dumps(SCHEMA))
    page.locator("#reply-schema textarea").blur()
    page.locator("#sampling .label-wrap").first.click()
    before = {r["id"] for r in _replies(module_server.db)}
    _send(page, "Describe an animal.")
    new = [r for r in _replies(module_server.db) if r["id"] not in before]
    assert len(new) == 1
    jsonschema.validate(json.loads(new[0]["content"]), SCHEMA)
    page.context.close()
