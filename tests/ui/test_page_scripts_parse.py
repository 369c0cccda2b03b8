"""The page's scripts are Python strings: an escape written for Python instead of JavaScript breaks
the whole page ("Invalid or unexpected token", nothing renders). Each one is checked by Node's
parser (Debian nodejs, installed with chromium for the browser tests)."""

import shutil
import subprocess

import pytest

from ui.chat import shortcuts, tab_goodbye
from ui.page_assets import PAGE_JS, URL_JS


@pytest.mark.parametrize(
    "name,js",
    [
        ("PAGE_JS", PAGE_JS),
        ("URL_JS", URL_JS),
        ("shortcuts.JS", shortcuts.JS),
        ("tab_goodbye.JS", tab_goodbye.JS),
    ],
)
def test_page_script_parses(tmp_path, name, js):
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        pytest.skip("node is not installed (apt-get install nodejs)")
    f = tmp_path / "s.js"
    f.write_text(f"const f = {js};\n")
    r = subprocess.run([node, "--check", str(f)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"{name}: {r.stderr}"
