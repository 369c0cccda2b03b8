"""The README's `python app.py` usage block names every flag the app takes, and no flag it does not
take: a new engine flag (one EngineConfig field) must show up where a new user first looks."""

from __future__ import annotations

import re
from pathlib import Path

from app import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"


def _app_flags() -> set[str]:
    return {
        o
        for a in build_parser()._actions
        for o in a.option_strings
        if o.startswith("--") and o != "--help"
    }


def _readme_flags() -> set[str]:
    text = README.read_text()
    block = re.search(r"```bash\npython app\.py (.*?)```", text, flags=re.S).group(1)
    flags = set(re.findall(r"--[a-z][a-z0-9-]*", block))
    for neg in re.findall(r"--\[no-\]([a-z0-9-]+)", block):  # --[no-]X stands for --X and --no-X
        flags |= {f"--{neg}", f"--no-{neg}"}
    return flags


def test_the_usage_block_names_every_flag_and_only_real_ones():
    app, readme = _app_flags(), _readme_flags()
    assert app - readme == set(), "flags missing from the README's usage block"
    assert readme - app == set(), "the README names flags the app does not take"
