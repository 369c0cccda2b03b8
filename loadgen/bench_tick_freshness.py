"""Where a Memory-tab tick waits under chat load, measured in a real browser (issue 47).

Load: `--tabs` chat tabs streaming long replies (each sends again when its reply ends) and
`--users` demo users started from the Memory tab's own Start button, against `python app.py`.
For every fast tick the Memory tab applies, the page logs (ui/dashboard/bus.py, window.__kvTicks):
the snapshot's time, the server's time when the tick function returned, and the browser's time when
it applied the message; a fetch hook logs when the page asked for each tick (Gradio's queue/join).
Meanwhile this script reads /api/kv every 0.5 s. Same machine, one clock. Reported per tick:

  asked -> served     the tick's request until its function returned (Gradio queue + event loop +
                      worker thread + the function itself, with the snapshot it read)
  served -> applied   the message's way back (the event stream, the page's script)
  snapshot age        when served, how old the snapshot was
  behind /api/kv      the newest /api/kv snapshot read before the tick was applied, minus the
                      tick's snapshot: what the issue's bound (at most 2 s) is about
  gaps                time between two applied ticks (ticks dropped while one is pending)

    .venv/bin/python -m loadgen.bench_tick_freshness [--tabs 4] [--users 16] [--seconds 60] [--app-arg ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from loadgen.bench_dashboard_browser import CHROMIUM, _wait, start_app_args

PROMPT = (
    "Write a long, detailed essay about the history of computing, from the abacus to modern "
    "GPUs, with many sections."
)
JOIN_HOOK = """(() => {
  const f = window.fetch.bind(window);
  window.__kvJoins = [];
  window.fetch = (url, opts) => {
    try {
      if (String(url).includes('queue/join') && opts && opts.body) {
        const b = JSON.parse(opts.body);
        window.__kvJoins.push({ fn: b.fn_index, t: Date.now() / 1000 });
      }
    } catch (e) { /* not ours */ }
    return f(url, opts);
  };
})();"""


def _fast_fn_index(url: str) -> int:
    """The dependency id of the Memory tab's fast tick (its one output is the bus)."""
    with urllib.request.urlopen(url + "config", timeout=10) as r:
        cfg = json.load(r)
    bus = next(c["id"] for c in cfg["components"] if c.get("props", {}).get("elem_id") == "kv-bus")
    return next(
        d["id"]
        for d in cfg["dependencies"]
        if d["outputs"] == [bus] and any(t[1] == "tick" for t in d["targets"])
    )


class ApiPoller(threading.Thread):
    """(local time read, snapshot time) of /api/kv every `every` seconds."""

    def __init__(self, url: str, every: float = 0.5):
        super().__init__(daemon=True)
        self.url, self.every, self.rows, self.stop = url, every, [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with urllib.request.urlopen(self.url + "api/kv?compact=true", timeout=10) as r:
                    snap = json.load(r)
                self.rows.append(
                    (
                        time.time(),
                        snap["time"],
                        snap["stats"]["running"],
                        snap["stats"]["used_blocks"],
                    )
                )
            except OSError:
                pass
            self.stop.wait(self.every)


def _chat_tab(context, url: str, max_tokens: int):
    page = context.new_page()
    page.goto(url)
    page.wait_for_selector("#msg textarea")
    page.locator("#sampling .label-wrap").first.click()
    box = page.locator("#max-tokens input[type=number]")
    box.fill(str(max_tokens))
    box.press("Enter")
    page.locator("#sampling .label-wrap").first.click()
    return page


def _keep_streaming(pages) -> None:
    """Each chat tab sends again when its reply has ended (its Send button is back)."""
    for page in pages:
        try:
            if page.locator("#send").is_visible():
                page.fill("#msg textarea", PROMPT)
                page.keyboard.press("Enter")
        except Exception:  # noqa: BLE001  a page mid-repaint: next round
            pass


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def summary(xs) -> dict:
    return {
        "n": len(xs),
        "median": round(statistics.median(xs), 3) if xs else None,
        "p90": round(pct(xs, 0.9), 3) if xs else None,
        "max": round(max(xs), 3) if xs else None,
    }


def analyse(ticks: list, joins: list, api: list) -> dict:
    asked_served, back, age, behind, gaps = [], [], [], [], []
    joins = sorted(j["t"] for j in joins)
    prev = None
    for t in ticks:
        asked = max((j for j in joins if j <= t["at"]), default=None)
        if asked is not None:
            asked_served.append(t["at"] - asked)
        back.append(t["recv"] - t["at"])
        age.append(t["at"] - t["snap"])
        seen = [s for (read, s, *_rest) in api if read <= t["recv"]]
        if seen:
            behind.append(max(seen) - t["snap"])
        if prev is not None:
            gaps.append(t["recv"] - prev)
        prev = t["recv"]
    return {
        "asked_to_served_s": summary(asked_served),
        "served_to_applied_s": summary(back),
        "snapshot_age_when_served_s": summary(age),
        "behind_api_kv_s": summary(behind),
        "gap_between_ticks_s": summary(gaps),
    }


def run(tabs: int, users: int, seconds: float, max_tokens: int, app_args: list[str]) -> dict:
    from playwright.sync_api import sync_playwright

    tmp = Path(tempfile.mkdtemp(prefix="bench-fresh-"))
    proc, url = start_app_args(app_args, tmp / "app.log")
    try:
        fast_fn = _fast_fn_index(url)
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
            )
            chats = browser.new_context(viewport={"width": 1100, "height": 800})
            pages = [_chat_tab(chats, url, max_tokens) for _ in range(tabs)]
            # one browser profile, as a person's: its tabs share the browser's connections per host
            mem = chats.new_page()
            mem.set_viewport_size({"width": 1360, "height": 1000})
            mem.add_init_script(JOIN_HOOK)
            mem.goto(url)
            mem.wait_for_selector("#msg textarea")
            mem.get_by_role("tab", name="Memory").click()
            _wait(lambda: mem.evaluate("(window.__kvTicks || []).length") > 0, 60, "first tick")
            api = ApiPoller(url)
            api.start()
            _keep_streaming(pages)
            t0 = time.time()
            while time.time() - t0 < 3:
                mem.wait_for_timeout(250)
            mem.fill("#kv-demo-n input", str(users))
            mem.click("#kv-demo-start")
            start = time.time()
            while time.time() - start < seconds:
                _keep_streaming(pages)
                mem.wait_for_timeout(500)
            ticks = mem.evaluate("window.__kvTicks")
            joins = [j for j in mem.evaluate("window.__kvJoins") if j["fn"] == fast_fn]
            api.stop.set()
            browser.close()
        ticks = [t for t in ticks if t["recv"] >= start]
        out = analyse(ticks, [j for j in joins if j["t"] >= start - 5], api.rows)
        out.update(
            tabs=tabs,
            users=users,
            seconds=seconds,
            ticks=len(ticks),
            api_reads=len(api.rows),
            load_avg=open("/proc/loadavg").read().split()[:3],
        )
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except Exception:  # noqa: BLE001
            proc.kill()


def main(argv=None) -> None:
    a = argparse.ArgumentParser()
    a.add_argument("--tabs", type=int, default=4)
    a.add_argument("--users", type=int, default=16)
    a.add_argument("--seconds", type=float, default=60.0)
    a.add_argument("--max-tokens", type=int, default=512)
    a.add_argument(
        "--app-arg", action="append", default=[], help="extra app.py argument (repeatable)"
    )
    args = a.parse_args(argv)
    print(
        json.dumps(
            run(args.tabs, args.users, args.seconds, args.max_tokens, args.app_arg), indent=2
        )
    )


if __name__ == "__main__":
    main()
