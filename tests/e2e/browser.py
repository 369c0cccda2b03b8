"""The one way the browser tests start Chromium: Debian's /usr/bin/chromium through Playwright
(never `playwright install`), with the flags every test wants.

Why the flags: `--no-sandbox` because the tests run as root in a container. `--disable-gpu` because
these machines have no GPU: Chromium otherwise runs a GPU process that emulates one in software
(SwiftShader) just to composite the page; without it Chromium composites in software directly.
Measured on this 2-core box (4 page loads of the chat page each, same run): ~3.3 CPU-s of Chromium
per page load with the GPU process, ~2.9 without. What the page does, its DOM and its screenshots
are the same.
"""

from __future__ import annotations

import os

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ("--no-sandbox", "--disable-gpu")


def require_chromium() -> None:
    if not os.path.exists(CHROMIUM):
        pytest.fail(
            "Debian chromium is not installed: `apt-get install chromium` (test.sh does it)"
        )


def launch_chromium(playwright):
    """A headless Chromium from a running sync_playwright(); the caller closes it."""
    require_chromium()
    return playwright.chromium.launch(executable_path=CHROMIUM, args=list(ARGS))


# The fixtures of the tests that share one Chromium per module. A module takes them with
# `from tests.e2e.browser import _chromium, browser`: the import names chromium, which is how
# tests/deps.py knows that module needs a browser (a conftest naming it would mark a whole folder).
@pytest.fixture(scope="module")
def _chromium():
    """One Chromium per test module: a launch costs ~1.2 s of CPU, and many tests use it."""
    require_chromium()
    import playwright.sync_api as sync_api

    with sync_api.sync_playwright() as p:
        b = launch_chromium(p)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def browser(_chromium):
    """The module's Chromium; every context (and page) a test opened is closed when it ends, so
    tests share nothing but the browser process."""
    yield _chromium
    for context in list(_chromium.contexts):
        context.close()
