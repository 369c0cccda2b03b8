"""Launch `python app.py` as a real server process on a free local port, wait until it serves,
and always stop it in teardown. Used by the chat (and dashboard) end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.app_zygote import Zygote
from tests.e2e.polling import wait_until as wait_for

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--num-blocks", "512", "--max-model-len", "1024"]
_ZYGOTE = Zygote()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppServer:
    """One app process. `url`, `kv()` (exact snapshot from /api/kv?fresh=1), `stop()`, `kill()`."""

    def __init__(self, db: Path, args: list[str], log: Path, env: dict | None = None):
        self.db, self.port, self.log_path = db, free_port(), log
        self.url = f"http://127.0.0.1:{self.port}/"
        cmd = [sys.executable, "app.py", "--port", str(self.port), "--db", str(db), *args]
        full_env = {
            **os.environ,
            "GRADIO_ANALYTICS_ENABLED": "False",
            "HF_HUB_OFFLINE": "1",
            "GRADIO_HEARTBEAT_INTERVAL": "1",
            "PYTHONUNBUFFERED": "1",
            "PAGED_CHAT_KV_OFFLOAD_DIR": str(log.parent / "kv-tier"),  # per test, not ~/.cache
            **(env or {}),
        }
        self._log = open(log, "wb")
        # forked from a zygote that has the app's modules imported (tests/e2e/app_zygote.py), else a
        # plain subprocess: either way a separate `app.py` process with this command line
        self.proc = _ZYGOTE.spawn(cmd[1:], full_env, log) or subprocess.Popen(
            cmd, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, env=full_env
        )

    def wait_ready(self, timeout: float = 120) -> "AppServer":
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "config", timeout=2):
                    return self
            except urllib.error.HTTPError:  # e.g. 401 with --auth: it is serving
                return self
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"app not ready after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def get(self, path: str, timeout: float = 10):
        with urllib.request.urlopen(self.url + path.lstrip("/"), timeout=timeout) as r:
            return r.read().decode()

    def kv(self) -> dict:
        return json.loads(self.get("api/kv?fresh=1"))

    def wait_kv(self, pred, timeout: float = 20, every: float = 0.1) -> dict:
        deadline = time.time() + timeout
        while True:
            snap = self.kv()
            if pred(snap) or time.time() > deadline:
                return snap
            time.sleep(every)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM (what Ctrl-C / a service manager sends) and wait for a clean exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture
def launch(tmp_path):
    """launch(db=None, args=SMALL) -> a ready AppServer; every one is stopped at teardown."""
    servers = []

    def _launch(
        db: Path | None = None, args: list[str] | None = None, env: dict | None = None
    ) -> AppServer:
        server = AppServer(
            db or tmp_path / "chat.db",
            SMALL if args is None else args,
            tmp_path / f"app-{len(servers)}.log",
            env,
        )
        servers.append(server)
        return server.wait_ready()

    yield _launch
    for s in servers:
        s.kill()


@pytest.fixture(scope="module")
def module_server(tmp_path_factory):
    """One shared app per test module (small pool, short context, at most 2 running sequences)."""
    tmp = tmp_path_factory.mktemp("app")
    server = AppServer(
        tmp / "chat.db",
        ["--num-blocks", "512", "--max-model-len", "512", "--max-num-seqs", "2"],
        tmp / "app.log",
    )
    try:
        yield server.wait_ready()
    finally:
        server.kill()


# ---- gradio_client helpers (exposed through the `chat_api` fixture) ----------------------------
def sampling(max_tokens: int = 16, n: int = 1, temperature: float = 0.0, seed=None) -> list:
    """Positional sampling inputs of /send and /regenerate (temperature, top_p, top_k, max_tokens,
    repetition_penalty, seed, n)."""
    return [temperature, 1.0, 0, max_tokens, 1.0, seed, n]


def text_of(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # a reply's parts (ui/chat/view.row_content): text, then footer
        return "\n\n".join(text_of(c) for c in content)
    if isinstance(content, dict):
        return content.get("text") or ""
    return ""


def chat_rows(output) -> list[tuple[str, str]] | None:
    """(role, text) rows of the chatbot in one /send output, or None when that output skipped it."""
    chat = output[1]
    if not isinstance(chat, list):
        return None
    return [(m["role"], text_of(m["content"])) for m in chat]


def reply_text(output) -> str | None:
    rows = chat_rows(output)
    if not rows or rows[-1][0] != "assistant":
        return None
    return rows[-1][1]


def conversation_id(output) -> str | None:
    radio = output[3]
    return radio.get("value") if isinstance(radio, dict) else None


def streaming_text(job) -> str | None:
    """The reply text of a running /send job once real text (not the queued/… placeholder) shows."""
    outs = job.outputs()
    for out in reversed(outs):
        text = reply_text(out)
        if text is not None:
            return text if text.strip() and "queued" not in text and text.strip() != "…" else None
    return None


def read_db(db: Path, sql: str, params=()) -> list[dict]:
    """Read the app's SQLite file from outside (read-only; WAL lets us read while it runs)."""
    import sqlite3

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(sql, params)]
    finally:
        con.close()


@pytest.fixture(scope="session")
def chat_api():
    import types

    return types.SimpleNamespace(
        sampling=sampling,
        chat_rows=chat_rows,
        reply_text=reply_text,
        conversation_id=conversation_id,
        wait_for=wait_for,
        streaming_text=streaming_text,
        read_db=read_db,
        text_of=text_of,
    )


@pytest.fixture
def screenshot_dir(tmp_path):
    """Where browser tests save screenshots: docs/ when UPDATE_SCREENSHOTS=1 (to refresh the
    committed pictures), else the test's tmp folder, so a test run leaves the tree clean."""
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        docs = Path(__file__).resolve().parents[2] / "docs"
        docs.mkdir(exist_ok=True)
        return docs
    return tmp_path
