"""The README's API examples are executed as written (only the port changes): each curl command must
succeed and print a well-formed answer, and the Python example must run with the `openai` package."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
DOC_URL = "http://127.0.0.1:7860"


def api_section() -> str:
    text = README.read_text()
    start = text.index("## OpenAI-compatible API")
    nxt = text.find("\n## ", start + 3)
    return text[start : nxt if nxt != -1 else len(text)]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", api_section(), flags=re.S)


def run_doc(cmd: list[str], server, stdin: str | None = None) -> str:
    env = {**os.environ, "PAGED_CHAT_API_KEY": "sk-readme"}
    out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_readme_curl_examples_run(server, model_id):
    curls = blocks("bash")
    assert len(curls) >= 4 and all(c.lstrip().startswith("curl") for c in curls)
    assert all(model_id in c for c in curls[1:])  # the documented model name is the served one
    outputs = [
        run_doc(
            ["bash", "-c", "set -euo pipefail; " + c.replace(DOC_URL, server.url.rstrip("/"))],
            server,
        )
        for c in curls
    ]
    assert json.loads(outputs[0])["data"][0]["id"] == model_id
    chat = json.loads(outputs[1])
    assert (
        chat["choices"][0]["message"]["content"]
        and "cached_tokens" in chat["usage"]["prompt_tokens_details"]
    )
    events = [line[6:] for line in outputs[2].splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "cached_tokens" in json.loads(events[-2])["usage"]["prompt_tokens_details"]
    comp = json.loads(outputs[3])
    assert [c["index"] for c in comp["choices"]] == [0, 1]


def test_readme_python_example_runs(server):
    (code,) = blocks("python")
    out = run_doc(
        [sys.executable, "-"], server, stdin=code.replace(DOC_URL, server.url.rstrip("/"))
    )
    assert "cached prompt tokens:" in out
