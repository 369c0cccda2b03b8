"""Issue 48's neighbour-stream check: the largest gap between chunks of another caller's stream
while each hostile-tenant attack runs, and that neighbour's time to first token.

Starts `python app.py --auth alice --auth bob --admin alice --api-key alpha:... --api-key beta:...
--max-num-seqs 4 --num-blocks 64` (the issue's settings) from the folder given with --repo, so two
checkouts can be compared side by side. The neighbour is the logged-in chat user alice: a new
chat, a greedy 120-token reply through the page's own `/send` (gradio_client), its updates timed
by polling every 10 ms; during the 429 attack key beta's call is the neighbour too (its status).
The attacks, one after the other, by key alpha or user bob:

1. priority: 8 streams claiming `"priority": -1000`, 300 tokens each, retried on 429;
2. oracle: cache probes (max_tokens 1) in a loop;
3. flood429: one call holding alpha's whole in-flight bound (n = 2 x max_num_seqs);
4. pdf: bob uploads a 9 KB PDF bomb (40 pages, one shared 1.2 MB content stream), twice at once;
5. regex: `a{1000}{1000}` constrained calls in a loop;
6. metrics: anonymous /metrics scrapes, 4 at a time;
7. tier: distinct 300-token prompts that evict the 64-block pool into the disk tier.

    python -m loadgen.attack_gaps [--repo PATH] [--legacy] [--only priority,pdf]

--legacy: the checkout has no key classes nor --metrics-token (main before issue 48).
Prints one JSON line per attack: the chat neighbour's first-text time and largest gap between
updates (s); for the 429 attack also key beta's status.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

ALPHA, BETA = "sk-alpha", "sk-beta"
USERS = {"alice": "wonderland", "bob": "builder"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(port, method, path, body=None, key=None, timeout=300):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    return conn, conn.getresponse()


def chat_neighbour(alice, tokens=120) -> dict:
    """Alice's greedy reply in a new chat: first-text time and largest gap between updates."""
    alice.predict(api_name="/new_chat")
    t0 = time.perf_counter()
    job = alice.submit(
        "Write a short story about a lighthouse keeper.",
        0.0,
        1.0,
        0,
        tokens,
        1.0,
        None,
        1,
        api_name="/send",
    )
    seen, times = 0, []
    last_text = None
    while not job.done() or len(job.outputs()) > seen:
        outs = job.outputs()
        for out in outs[seen:]:
            chat = out[1] if isinstance(out, (list, tuple)) and len(out) > 1 else None
            if isinstance(chat, list) and chat and chat[-1].get("role") == "assistant":
                text = _text(chat[-1].get("content"))
                if (
                    text
                    and text.strip() not in ("", "…")
                    and "queued" not in text
                    and text != last_text
                ):
                    times.append(time.perf_counter())
                    last_text = text
        seen = len(outs)
        time.sleep(0.01)
    job.result()
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {
        "updates": len(times),
        "ttft_s": round(times[0] - t0, 3) if times else None,
        "max_gap_s": round(max(gaps), 3) if gaps else None,
        "total_s": round(times[-1] - t0, 2) if times else None,
    }


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text(c) for c in content)
    if isinstance(content, dict):
        return content.get("text") or ""
    return ""


def neighbour(port, model, tokens=120) -> dict:
    """Beta's greedy stream: status, first-token time and largest gap between chunks."""
    body = {
        "model": model,
        "prompt": "Write a short story about a lighthouse keeper.",
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "priority": 0,
    }
    t0 = time.perf_counter()
    conn, r = _request(port, "POST", "/v1/completions", body, BETA)
    if r.status != 200:
        r.read()
        conn.close()
        return {"status": r.status}
    times = []
    while True:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data: {"):
            times.append(time.perf_counter())
    conn.close()
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {
        "status": 200,
        "chunks": len(times),
        "ttft_s": round(times[0] - t0, 3) if times else None,
        "max_gap_s": round(max(gaps), 3) if gaps else None,
        "total_s": round(times[-1] - t0, 2),
    }


def _loop(stop, fn, threads=1):
    def run():
        while not stop.is_set():
            try:
                fn()
            except OSError:
                time.sleep(0.1)

    ts = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
    for t in ts:
        t.start()
    return ts


def _consume(port, body, key):
    conn, r = _request(
        port, "POST", "/v1/completions" if "prompt" in body else "/v1/chat/completions", body, key
    )
    r.read()
    conn.close()
    return r.status


def attack(name, port, model, stop, url, bomb):
    if name == "priority":
        body = {
            "model": model,
            "prompt": "Tell a long story about the sea",
            "max_tokens": 300,
            "ignore_eos": True,
            "stream": True,
            "priority": -1000,
        }

        def one():
            if _consume(port, body, ALPHA) == 429:
                time.sleep(0.2)

        return _loop(stop, one, 8)
    if name == "oracle":
        k = iter(range(10**9))
        return _loop(
            stop,
            lambda: _consume(
                port,
                {
                    "model": model,
                    "max_tokens": 1,
                    "messages": [
                        {"role": "system", "content": "You are helpful."},
                        {"role": "user", "content": f"My locker code is {next(k)} ALPHA. Confirm."},
                    ],
                },
                ALPHA,
            ),
        )
    if name == "flood429":
        body = {
            "model": model,
            "prompt": "Count slowly",
            "max_tokens": 300,
            "ignore_eos": True,
            "stream": True,
            "n": 8,
        }
        return _loop(stop, lambda: _consume(port, body, ALPHA))
    if name == "pdf":
        from gradio_client import Client, handle_file

        bob = Client(url, auth=("bob", USERS["bob"]), verbose=False)

        def upload():
            t = time.perf_counter()
            try:
                bob.predict(handle_file(bomb), api_name="/attach_document")
                what = "answered"
            except Exception as e:  # a refusal shows as a warning, not an error
                what = f"error {type(e).__name__}"
            print(
                json.dumps({"pdf_upload": what, "s": round(time.perf_counter() - t, 2)}),
                file=sys.stderr,
                flush=True,
            )

        return _loop(stop, upload, 2)
    if name == "regex":
        body = {
            "model": model,
            "max_tokens": 50,
            "messages": [{"role": "user", "content": "Write letters"}],
            "structured_outputs": {"regex": "a{1000}{1000}"},
        }
        return _loop(stop, lambda: _consume(port, body, ALPHA))
    if name == "metrics":

        def scrape():
            conn, r = _request(port, "GET", "/metrics")
            r.read()
            conn.close()

        return _loop(stop, scrape, 4)
    if name == "tier":
        k = iter(range(10**9))

        def fill():
            i = next(k)
            words = " ".join(f"w{i}x{j}" for j in range(150))
            _consume(port, {"model": model, "prompt": words, "max_tokens": 1}, ALPHA)

        return _loop(stop, fill)
    return []


def _bomb(path):
    import zlib

    content = b"BT /F1 12 Tf 72 720 Td (boom) Tj ET\n" + b"1 0 0 1 0 0 cm\n" * 80_000
    packed, pages = zlib.compress(content, 9), 40
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids ["
        + b" ".join(b"%d 0 R" % (5 + i) for i in range(pages))
        + b"] /Count %d >>" % pages,
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(packed) + packed + b"\nendstream",
    ]
    objs += [
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 3 0 R >> >> >>"
    ] * pages
    out, offsets = b"%PDF-1.4\n", []
    for k, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % k + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    with open(path, "wb") as f:
        f.write(out)


ATTACKS = ("priority", "oracle", "flood429", "pdf", "regex", "metrics", "tier")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", default=".", help="checkout whose app.py to start (default: this one)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument(
        "--legacy", action="store_true", help="a checkout without key classes / --metrics-token"
    )
    p.add_argument("--only", default=",".join(ATTACKS))
    p.add_argument(
        "--settle",
        type=float,
        default=3.0,
        help="seconds an attack runs before the neighbour starts",
    )
    args = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="attack-gaps-")
    port = _free_port()
    keys = [f"alpha:{ALPHA}", f"beta:{BETA}" if args.legacy else f"beta:{BETA}:0"]
    cmd = [
        args.python,
        "app.py",
        "--port",
        str(port),
        "--db",
        os.path.join(tmp, "chat.db"),
        "--num-blocks",
        "64",
        "--max-num-seqs",
        "4",
        "--max-model-len",
        "1024",
        "--admin",
        "alice",
        "--kv-offload-dir",
        os.path.join(tmp, "kv-tier"),
    ]
    for u, pw in USERS.items():
        cmd += ["--auth", f"{u}:{pw}"]
    for k in keys:
        cmd += ["--api-key", k]
    env = {
        **os.environ,
        "GRADIO_ANALYTICS_ENABLED": "False",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    log = open(os.path.join(tmp, "app.log"), "wb")
    proc = subprocess.Popen(cmd, cwd=args.repo, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/"
    bomb = os.path.join(tmp, "bomb.pdf")
    _bomb(bomb)
    try:
        deadline = time.time() + 300
        while True:
            try:
                conn, r = _request(port, "GET", "/v1/models", key=BETA, timeout=5)
                model = json.loads(r.read())["data"][0]["id"]
                break
            except (OSError, ValueError, KeyError):
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("the app did not start: " + open(log.name).read()[-2000:])
                time.sleep(0.5)
        from gradio_client import Client

        alice = Client(url, auth=("alice", USERS["alice"]), verbose=False)
        chat_neighbour(alice, 8)  # warm-up
        print(json.dumps({"attack": "none (alone)", **chat_neighbour(alice)}), flush=True)
        for name in args.only.split(","):
            stop = threading.Event()
            threads = attack(name, port, model, stop, url, bomb)
            time.sleep(args.settle)
            result = chat_neighbour(alice)
            if name == "flood429":
                result["key_beta"] = neighbour(port, model, 16)
            stop.set()
            for t in threads:
                t.join(timeout=600)
            print(json.dumps({"attack": name, **result}), flush=True)
        print(json.dumps({"attack": "none (after)", **chat_neighbour(alice)}), flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
