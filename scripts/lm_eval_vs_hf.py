"""lm-evaluation-harness against the running server vs its own HF backend, same tasks, same model.

    python scripts/lm_eval_vs_hf.py --lm-eval /path/to/venv/bin/lm_eval [--port 7871] [--limit N]

Starts `python app.py --dtype float32` on a free port (fp32, like the HF backend), runs the
harness's `local-completions` model against its /v1/completions (log-likelihood requests use
`echo` + `logprobs`; generation requests plain completions), then the harness's `hf` backend on
the same model folder, and prints one table. The tasks are defined in bench/lm_eval_tasks/ with
local JSONL files (no dataset hub is reachable here): `pc_sums` (multiple choice, log-likelihood)
and `pc_capitals` (greedy generation, exact match). lm-eval is not a requirement of the project:
install it in its own environment (`pip install "lm-eval[api]"`) and point --lm-eval at its CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = "pc_sums,pc_capitals"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("app.py exited early")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(url)


def _scores(out_dir: Path) -> dict:
    files = sorted(out_dir.rglob("results_*.json"))
    res = json.loads(files[-1].read_text())["results"]
    out = {}
    for task, m in res.items():
        for key, value in m.items():
            if key.endswith(",none") or key.endswith(",strip"):
                name = key.split(",")[0]
                if not name.endswith("_stderr") and isinstance(value, (int, float)):
                    out[task] = (name, value, m.get(f"{name}_stderr,{key.split(',')[1]}"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lm-eval", required=True, help="the lm_eval CLI (its own environment)")
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--limit", type=int, default=None)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from engine.exec.loader import resolve_hf_folder

    folder = resolve_hf_folder(None)[1]
    port = a.port or _free_port()
    tmp = Path(tempfile.mkdtemp(prefix="lm-eval-"))
    env = {
        **os.environ,
        "GRADIO_ANALYTICS_ENABLED": "False",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    app = subprocess.Popen(
        [
            sys.executable,
            "app.py",
            "--port",
            str(port),
            "--db",
            str(tmp / "chat.db"),
            "--dtype",
            "float32",
            "--num-blocks",
            "512",
            "--max-model-len",
            "1024",
        ],
        cwd=ROOT,
        env=env,
        stdout=open(tmp / "app.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    common = ["--tasks", TASKS, "--include_path", str(ROOT / "bench" / "lm_eval_tasks")]
    if a.limit:
        common += ["--limit", str(a.limit)]
    try:
        _wait(f"http://127.0.0.1:{port}/v1/models", app)
        model = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models"))["data"][0][
            "id"
        ]
        t = time.time()
        subprocess.run(
            [
                a.lm_eval,
                "--model",
                "local-completions",
                "--model_args",
                f"model={model},base_url=http://127.0.0.1:{port}/v1/completions,tokenizer={folder},"
                "tokenized_requests=False,num_concurrent=4,max_retries=1",
                "--output_path",
                str(tmp / "server"),
                *common,
            ],
            cwd=ROOT,
            env=env,
            check=True,
        )
        server_s = time.time() - t
    finally:
        app.terminate()
        app.wait(timeout=60)
    t = time.time()
    subprocess.run(
        [
            a.lm_eval,
            "--model",
            "hf",
            "--model_args",
            f"pretrained={folder},dtype=float32",
            "--device",
            "cpu",
            "--batch_size",
            "8",
            "--output_path",
            str(tmp / "hf"),
            *common,
        ],
        cwd=ROOT,
        env=env,
        check=True,
    )
    hf_s = time.time() - t
    srv, hf = _scores(tmp / "server"), _scores(tmp / "hf")
    print("\n| task | metric | server (local-completions) | HF backend | |diff| | stderr |")
    print("|---|---|---|---|---|---|")
    for task in sorted(set(srv) | set(hf)):
        name, v, se = srv.get(task, ("?", float("nan"), None))
        _, h, hse = hf.get(task, ("?", float("nan"), None))
        print(
            f"| {task} | {name} | {v:.4f} | {h:.4f} | {abs(v - h):.4f} | {se or 0:.4f} / {hse or 0:.4f} |"
        )
    print(f"\nserver run {server_s:.0f} s, HF run {hf_s:.0f} s; outputs under {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
