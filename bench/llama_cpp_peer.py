"""llama.cpp as a peer: its server in a process of its own, and its own reference figure (issue 49).

llama.cpp is never built or fetched by this repo: the bench is given the binaries (`llama-server`,
`llama-bench` from the same build) and GGUF files. `Server` starts `llama-server` with the bench's
thread count, waits for /health, and talks to /completion with prompt token ids (so both systems
read the same ids, whatever either's chat template does). `reference` runs `llama-bench -p 0 -n N`
on the same GGUF: the build's own decode rate alone, the figure a server run is checked against.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import urllib.request


def _env(binary: str) -> dict:
    """The build's shared libraries sit next to its binaries."""
    d = os.path.dirname(os.path.abspath(binary))
    return dict(
        os.environ,
        LD_LIBRARY_PATH=d
        + (":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else ""),
    )


class Server:
    """`with Server(path, gguf, threads=2, extra=[...]) as s:` a running llama-server on a free port."""

    def __init__(
        self,
        binary: str,
        gguf: str,
        threads: int = 2,
        extra: list[str] | None = None,
        ctx: int = 4096,
        startup_s: float = 300,
    ):
        self.binary, self.gguf, self.threads = binary, gguf, threads
        self.extra, self.ctx, self.startup_s = list(extra or []), ctx, startup_s
        self.port = 18000 + os.getpid() % 1000
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def __enter__(self) -> "Server":
        args = [
            self.binary,
            "-m",
            self.gguf,
            "-t",
            str(self.threads),
            "-tb",
            str(self.threads),
            "--port",
            str(self.port),
            "-np",
            "1",
            "--no-webui",
        ]
        if "-c" not in self.extra:
            args += ["-c", str(self.ctx)]
        # its log goes to a file: a pipe nobody reads fills up (64 KB) and the server then blocks
        # on its next log line, in the middle of a request
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            args + self.extra,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
            env=_env(self.binary),
            text=True,
        )
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(
                    f"llama-server exited ({self.proc.returncode}): {self.log.read()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.__exit__()
        raise RuntimeError("llama-server did not become healthy")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            self.log.close()

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(
            self.base + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=900) as r:
            return json.loads(r.read())

    def complete(
        self, prompt_ids: list[int], n: int, cache_prompt: bool = False, n_probs: int = 0
    ) -> dict:
        """Greedy, EOS ignored: {"tokens": the n generated ids, "timings": the server's, "probs": ...}."""
        d = self.post(
            "/completion",
            {
                "prompt": prompt_ids,
                "n_predict": n,
                "temperature": 0.0,
                "top_k": 1,
                "ignore_eos": True,
                "cache_prompt": cache_prompt,
                "return_tokens": True,
                "n_probs": n_probs,
            },
        )
        return {
            "tokens": list(d.get("tokens") or []),
            "timings": d.get("timings") or {},
            "probs": d.get("completion_probabilities") or [],
        }

    def teacher_forced_top(self, full: list[int], n_prompt: int, top: int) -> list[dict]:
        """The top-`top` log-probabilities (token id -> logprob) of the next token at positions
        n_prompt - 1 .. len(full) - 2, fed one token per request: the server's prompt cache keeps
        the rest, so each position after the prompt is one decode step over the cached KV."""
        out = []
        for j in range(n_prompt, len(full)):
            d = self.complete(full[:j], 1, cache_prompt=True, n_probs=top)
            if not d["probs"]:  # seen once in 1,920 positions: ask again without the cache
                d = self.complete(full[:j], 1, cache_prompt=False, n_probs=top)
            out.append(
                {int(p["id"]): float(p["logprob"]) for p in d["probs"][0]["top_logprobs"]}
                if d["probs"]
                else None
            )
        return out


def reference(bench_binary: str, gguf: str, threads: int = 2, n: int = 128, reps: int = 3) -> dict:
    """llama-bench's decode rate (tg n, no prompt) for this GGUF: {"tok_s": mean, "stdev", "cmd"}."""
    cmd = [
        bench_binary,
        "-m",
        gguf,
        "-t",
        str(threads),
        "-p",
        "0",
        "-n",
        str(n),
        "-r",
        str(reps),
        "-o",
        "json",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(bench_binary), timeout=1800)
    if r.returncode != 0:
        return {"error": r.stderr[-1000:], "cmd": " ".join(cmd)}
    rows = json.loads(r.stdout)
    row = rows[0]
    return {
        "tok_s": round(float(row["avg_ts"]), 2),
        "stdev": round(float(row.get("stddev_ts", 0)), 2),
        "cmd": " ".join(cmd),
        "build": row.get("build_commit"),
        "type": row.get("model_type"),
    }
