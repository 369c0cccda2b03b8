"""What the Memory tab costs a real browser: main-thread busy fraction and bytes per tick, with
16 demo users chatting, in headless Chromium (Playwright + Debian chromium) against `python app.py`.

Why measured in a browser: the server can count what it sends, but only the browser shows what
the page does with it (parsing, Svelte updates, plot re-renders, layout). Method:
- busy fraction: CDP `Performance.getMetrics` TaskDuration (main-thread task time, cumulative)
  over a window / the window's wall time; ScriptDuration and LayoutDuration + RecalcStyleDuration
  are reported alongside. TaskDuration is wall time: on this 2-core machine the engine serving
  the demo users (and anything else running) stretches every task, so the renderer main thread's
  CPU time (/proc/<pid>/task/<pid>/stat) over the window is reported too (main_thread_cpu_pct);
- bytes: CDP `Network.dataReceived` over Gradio's event stream (`/gradio_api/queue/data`), the
  whole stream (ticks plus the sidebar's list refresh and heartbeats); the dashboard's share = the
  bytes of the window with the Memory tab shown minus the same-length baseline with it hidden,
  reported per second (one 1 s bus tick + half a 2 s slow tick: what "a tick" costs) and per
  tick request served (the app's /metrics counter counts both kinds);
- windows: --seconds with the Memory tab shown, then --seconds with the Chat tab shown (the
  dashboard's timer off; the demo users keep chatting).

    .venv/bin/python -m loadgen.bench_dashboard_browser [--blocks 3000] [--users 16] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def _wait(pred, timeout: float, what: str):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise TimeoutError(what)


def start_app(blocks: int, max_model_len: int, log: Path) -> tuple[subprocess.Popen, str]:
    return start_app_args(["--num-blocks", str(blocks), "--max-model-len", str(max_model_len)], log)


def start_app_args(args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    """`python app.py ARGS` on a free port with its own database; (process, url) once it serves."""
    port = _port()
    env = {
        **os.environ,
        "GRADIO_ANALYTICS_ENABLED": "False",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, "app.py", "--port", str(port), "--db", str(log.with_suffix(".db")), *args],
        cwd=ROOT,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}/"

    def ready():
        if proc.poll() is not None:
            raise RuntimeError(f"app exited: {log.read_text()[-2000:]}")
        try:
            return json.loads(_get(url + "api/kv")).get("pins") is not None
        except OSError:
            return False

    _wait(ready, 300, "app start")
    return proc, url


def ticks_served(url: str) -> int:
    return int(
        re.search(r"^paged_chat_dashboard_ticks_total (\d+)", _get(url + "metrics"), re.M).group(1)
    )


class Probe:
    """CDP counters of one page: main-thread time and bytes received on Gradio's event stream."""

    def __init__(self, page):
        self.cdp = page.context.new_cdp_session(page)
        self.cdp.send("Performance.enable")
        self.cdp.send("Network.enable")
        self.urls: dict[str, str] = {}
        self.bytes = 0
        self.cdp.on(
            "Network.requestWillBeSent",
            lambda e: self.urls.__setitem__(e["requestId"], e["request"]["url"]),
        )
        self.cdp.on("Network.dataReceived", self._data)

    def _data(self, e) -> None:
        if "queue/data" in self.urls.get(e["requestId"], ""):
            self.bytes += max(e.get("encodedDataLength") or 0, e.get("dataLength") or 0)

    def metrics(self) -> dict:
        return {m["name"]: m["value"] for m in self.cdp.send("Performance.getMetrics")["metrics"]}


def renderer_main_threads() -> list[int]:
    """Pids of Chromium renderer processes (their main thread has the process's pid)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if b"chromium" in cmd and b"--type=renderer" in cmd:
                out.append(int(d.name))
    return out


def cpu_s(pids, whole: bool = False) -> dict:
    """pid -> utime + stime of that renderer's main thread (whole=True: all its threads), in
    seconds. CPU time: unlike CDP's TaskDuration it does not grow when the 2 cores are busy with
    the engine or other work."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in pids:
        path = f"/proc/{pid}/stat" if whole else f"/proc/{pid}/task/{pid}/stat"
        try:
            f = Path(path).read_text().rsplit(")", 1)[1].split()
            out[pid] = (int(f[11]) + int(f[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return out


def _delta(a: dict, b: dict) -> float:
    """CPU seconds used between two readings by the renderers alive at both."""
    return sum(b[p] - a[p] for p in a.keys() & b.keys())


def window(page, probe: Probe, url: str, seconds: float) -> dict:
    pids = renderer_main_threads()
    c0, w0 = cpu_s(pids), cpu_s(pids, whole=True)
    m0, b0, k0, t0 = probe.metrics(), probe.bytes, ticks_served(url), time.time()
    end = t0 + seconds
    while time.time() < end:
        page.wait_for_timeout(250)  # lets Playwright dispatch the CDP events
    m1, b1, k1, t1 = probe.metrics(), probe.bytes, ticks_served(url), time.time()
    c1, w1 = cpu_s(pids), cpu_s(pids, whole=True)
    wall = t1 - t0
    d = lambda k: m1.get(k, 0.0) - m0.get(k, 0.0)  # noqa: E731
    return {
        "seconds": round(wall, 1),
        "busy_pct": round(100 * d("TaskDuration") / wall, 2),
        "main_thread_cpu_pct": round(100 * _delta(c0, c1) / wall, 2),
        "renderer_cpu_pct": round(100 * _delta(w0, w1) / wall, 2),
        "renderers": len(c0.keys() & c1.keys()),
        "script_pct": round(100 * d("ScriptDuration") / wall, 2),
        "layout_style_pct": round(100 * (d("LayoutDuration") + d("RecalcStyleDuration")) / wall, 2),
        "stream_bytes": b1 - b0,
        "ticks": k1 - k0,
    }


def run(
    blocks: int, users: int, seconds: float, max_model_len: int, screenshot: str | None
) -> dict:
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="bench-dash-"))
    proc, url = start_app(blocks, max_model_len, tmp / "app.log")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1360, "height": 1000})
            page.goto(url)
            page.wait_for_selector("#chatbot")
            probe = Probe(page)
            page.get_by_role("tab", name="Memory").click()
            page.fill("#kv-demo-n input", str(users))
            page.click("#kv-demo-start")
            _wait(
                lambda: f"{users} chats hold" in page.inner_text("#kv-story"),
                240,
                "demo users running",
            )
            page.wait_for_timeout(3000)
            shown = window(page, probe, url, seconds)
            if screenshot:
                page.locator("#kv-dashboard").screenshot(path=screenshot)
            page.get_by_role("tab", name="Chat").click()
            page.wait_for_timeout(2000)
            hidden = window(page, probe, url, seconds)
            browser.close()
        rate = hidden["stream_bytes"] / hidden["seconds"]  # sidebar refresh, heartbeats
        extra = shown["stream_bytes"] - rate * shown["seconds"]
        per_tick = round(extra / shown["ticks"]) if shown["ticks"] else None
        raw = round(shown["stream_bytes"] / shown["ticks"]) if shown["ticks"] else None
        return {
            "blocks": blocks,
            "users": users,
            "memory_tab_shown": shown,
            "memory_tab_hidden": hidden,
            "dashboard_bytes_per_second": round(extra / shown["seconds"]),
            "bytes_per_tick_request": per_tick,
            "stream_bytes_per_tick_incl_sidebar": raw,
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv=None) -> None:
    a = argparse.ArgumentParser()
    a.add_argument("--blocks", type=int, default=3000)
    a.add_argument("--users", type=int, default=16)
    a.add_argument("--seconds", type=float, default=20.0)
    a.add_argument("--max-model-len", type=int, default=4096)
    a.add_argument("--screenshot", default=None)
    args = a.parse_args(argv)
    print(
        json.dumps(run(args.blocks, args.users, args.seconds, args.max_model_len, args.screenshot))
    )


if __name__ == "__main__":
    main()
