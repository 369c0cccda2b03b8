"""Page helpers the browser tests share, here so that no test module imports another and a helper
is written once. Two kinds of sending: `send` only types and presses Enter (tests that watch the
reply stream), `send_and_wait` waits for the whole reply (tests about what comes after it)."""

from tests.e2e.polling import wait_until


# ---- a page, typing, and the reply (the plain chat page tests) --------------------------------
def open_page(context, url):
    """A new page of `context` at `url`, once the message box is there."""
    page = context.new_page()
    page.goto(url)
    page.wait_for_selector("#msg textarea")
    return page


def set_number(page, elem_id: str, value) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def send(page, text: str) -> None:
    page.fill("#msg textarea", text)
    page.keyboard.press("Enter")


def reply(page) -> str:
    bots = page.locator("#chatbot .message.bot")
    return bots.last.inner_text() if bots.count() else ""


def finished(page) -> bool:
    """The status line under the chat says "finished"; the stats line is under the reply."""
    status = page.locator("#chat-status").inner_text()
    return status.strip() == "finished" and "tok/s" in reply(
        page
    )  # the stats line, under the reply


# ---- whole turns (the branch, button and state tests) -----------------------------------------
def open_in_new_context(browser, url, **kw):
    """A page in a new browser context (its own cookies) at `url`, once the message box is there."""
    return open_page(browser.new_context(**kw), url)


def set_sampling(page, max_tokens=None, n=None, temperature=None):
    page.locator("#sampling .label-wrap").first.click()
    for elem_id, value in (
        ("max-tokens", max_tokens),
        ("n-alternatives", n),
        ("temperature", temperature),
    ):
        if value is not None:
            set_slider(page, elem_id, value)
    page.locator("#sampling .label-wrap").first.click()


def set_slider(page, elem_id: str, value) -> None:
    """Type `value` into a slider's number box until its range input (the slider's state, what a send
    carries) holds it. On a busy machine the first commit can be lost while the page is still
    hydrating (CI saw the range keep its old value for 10 s), so type again rather than wait forever."""
    box = page.locator(f"#{elem_id} input[type=number]")
    rng = page.locator(f"#{elem_id} input[type=range]")
    for _ in range(6):
        box.fill(str(value))
        box.press("Enter")
        box.blur()
        try:
            wait_until(lambda: float(rng.input_value()) == float(value), timeout=5)
            return
        except TimeoutError:
            print(
                f"[set_slider] {elem_id}: typed {value}, box {box.input_value()!r}, "
                f"range {rng.input_value()!r}; typing again"
            )
    raise TimeoutError(
        f"{elem_id}: typed {value}, box {box.input_value()!r}, range {rng.input_value()!r}"
    )


def status(page) -> str:
    return page.locator("#chat-status").inner_text()


def done(page) -> bool:
    return page.locator("#send").is_visible() and status(page).strip() in ("finished", "stopped")


def send_and_wait(page, text):
    """Send and wait for the whole reply. The previous turn's "finished" is still on the page when
    Enter is pressed, so first wait for this turn's question to show (a fast reply can be over
    before the Stop button is ever seen), then for a reply row beside it and the status."""
    asked = len(rows(page, "user"))
    page.fill("#msg textarea", text)
    page.keyboard.press("Enter")
    wait_until(lambda: len(rows(page, "user")) > asked, timeout=30)
    wait_until(
        lambda: done(page) and len(rows(page, "bot")) >= len(rows(page, "user")), timeout=120
    )


def rows(page, role):
    return [t for t in page.locator(f"#chatbot .message.{role}").all_inner_texts()]


# the colour the canvas painted at the centre of a block's cell (pinned cells with ref 1 carry no number)
PIXEL = """(b) => { const c = document.querySelector('#kv-grid canvas'); const p = c.kvCellAt(b);
  const r = window.devicePixelRatio || 1;
  const d = c.getContext('2d').getImageData(Math.floor(p.x * r), Math.floor(p.y * r), 1, 1).data;
  return `rgb(${d[0]}, ${d[1]}, ${d[2]})`; }"""


def rgb(hex_colour: str) -> str:
    h = hex_colour.lstrip("#")
    return "rgb(%d, %d, %d)" % tuple(int(h[i : i + 2], 16) for i in (0, 2, 4))


# {replica: its cached blocks}, as the tab's replica cards carry them (data-replica, data-blocks)
REPLICA_COUNTS = """() => Object.fromEntries(
    [...document.querySelectorAll('#kv-cluster-reps [data-replica]')]
        .map(e => [e.dataset.replica, +e.dataset.blocks]))"""
