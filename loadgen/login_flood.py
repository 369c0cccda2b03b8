"""How much a flood of /login attempts slows generation (issue #29.7's measurement).

Starts `python app.py --auth alice:... --api-key KEY --trusted-proxy 127.0.0.1` (from the folder
given with --repo, so two checkouts can be compared side by side), then measures a greedy
/v1/completions decode alone, during a flood of login attempts that lasts as long as the decode
(each attempt from its own made-up client address, as many attackers would; known and unknown
names, half each), and alone again.

    python -m loadgen.login_flood [--repo PATH] [--concurrency 32] [--control]

--control sends the same flood marked cross-site, refused before any check: what the HTTP traffic
alone costs on this machine (the flooding client runs here too), to tell it from hashing.

Prints one JSON line: tok/s alone (before and after), tok/s during the flood, their ratio, and
how the attempts were answered.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

KEY = "sk-flood"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port, path, body: bytes, headers: dict, timeout=600):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, body=body, headers={"Host": f"127.0.0.1:{port}", **headers})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def decode_rate(port, model: str, tokens: int) -> float:
    body = json.dumps(
        {
            "model": model,
            "prompt": "Once upon a time, in a small village by the sea,",
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
    ).encode()
    t = time.perf_counter()
    status, data = _post(
        port,
        "/v1/completions",
        body,
        {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    took = time.perf_counter() - t
    if status != 200:
        raise RuntimeError(f"completion failed: {status} {data[:200]!r}")
    return json.loads(data)["usage"]["completion_tokens"] / took


def flood(
    port, attempts: int, concurrency: int, stop: threading.Event, control: bool = False
) -> Counter:
    codes: Counter = Counter()

    def one(i):
        if stop.is_set():
            return
        user = "alice" if i % 2 else f"ghost{i}"
        body = urllib.parse.urlencode({"username": user, "password": f"guess{i}"}).encode()
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Forwarded-For": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
        }
        if control:  # refused at once as cross-site: the cost of the HTTP traffic alone
            headers["Sec-Fetch-Site"] = "cross-site"
        try:
            status, _ = _post(port, "/login", body, headers, timeout=120)
        except OSError:
            status = "error"
        codes[status] += 1

    counter = iter(range(10**9))
    lock = threading.Lock()

    def worker():
        while not stop.is_set():
            with lock:
                i = next(counter)
            if attempts and i >= attempts:
                return
            one(i)

    with ThreadPoolExecutor(concurrency) as ex:
        for _ in range(concurrency):
            ex.submit(worker)
    return codes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", default=".", help="checkout whose app.py to start (default: this one)")
    p.add_argument(
        "--attempts",
        type=int,
        default=0,
        help="stop the flood after this many attempts (default 0: flood until the decode ends)",
    )
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument(
        "--control",
        action="store_true",
        help="send the same flood marked cross-site (refused before any check): the HTTP cost alone",
    )
    args = p.parse_args(argv)
    port = _free_port()
    env = {
        **os.environ,
        "GRADIO_ANALYTICS_ENABLED": "False",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"login-flood-{port}.log"), "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "app.py",
            "--port",
            str(port),
            "--db",
            f"/tmp/login-flood-{port}.db",
            "--num-blocks",
            "256",
            "--max-model-len",
            "512",
            "--auth",
            "alice:wonderland",
            "--api-key",
            KEY,
            "--trusted-proxy",
            "127.0.0.1",
        ],
        cwd=args.repo,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        deadline = time.time() + 300
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
                model = json.loads(conn.getresponse().read())["data"][0]["id"]
                break
            except (OSError, ValueError, KeyError):
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("the app did not start")
                time.sleep(0.5)
        decode_rate(port, model, 8)  # warm-up
        before = decode_rate(port, model, args.tokens)
        stop = threading.Event()
        result: dict = {}
        flooder = threading.Thread(
            target=lambda: result.update(
                codes=flood(port, args.attempts, args.concurrency, stop, args.control)
            )
        )
        flooder.start()
        time.sleep(1.0)  # let the flood build up
        during = decode_rate(port, model, args.tokens)
        flooding_at_end = flooder.is_alive()
        stop.set()
        flooder.join()
        after = decode_rate(port, model, args.tokens)
        alone = (before + after) / 2
        print(
            json.dumps(
                {
                    "repo": os.path.abspath(args.repo),
                    "control": args.control,
                    "tok_s_before": round(before, 2),
                    "tok_s_during_flood": round(during, 2),
                    "tok_s_after": round(after, 2),
                    "during_over_alone": round(during / alone, 3),
                    "flood_still_running_when_decode_ended": flooding_at_end,
                    "login_answers": {str(k): v for k, v in result.get("codes", {}).items()},
                }
            )
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
