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
        pytest.fail("Debian chromium is not installed: `apt-get install chromium` (test.sh does it)")


def launch_chromium(playwright):
    """A headless Chromium from a running sync_playwright(); the caller closes it."""
    require_chromium()
    return playwright.chromium.launch(executable_path=CHROMIUM, args=list(ARGS))
