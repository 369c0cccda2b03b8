"""Start `python app.py` processes in about a second instead of ~15: a zygote that has already
imported the app's modules forks each one.

Why: the end-to-end suite starts ~45 app processes, and ~10 s of each start is importing torch,
gradio, transformers and the app's own packages — the same work every time, about a third of the
whole suite on a 2-core machine. A forked child is still a real, separate app process: its own pid,
port, SQLite file, engine thread and signal handlers; it runs `app.py` as `__main__` exactly as
`python app.py ARGS` would, with the test's environment, working directory and log file. Only the
module imports are inherited (copy-on-write), which is also why the zygote must stay single-threaded
and must never run a torch op (an OpenMP pool initialised before fork() does not survive it): it
checks its own thread count after importing and refuses to serve otherwise (then the harness falls
back to plain subprocesses). `PAGED_CHAT_TEST_FORK=0` turns the zygote off.

Protocol (one JSON object per line on the zygote's stdin / stdout; the zygote serves one client):
  {"op": "spawn", "argv": [...], "env": {...}, "cwd": "...", "log": "..."}  -> {"pid": N}
  {"op": "status", "pid": N}  -> {"returncode": int | null}   (reaps the child when it has exited)
The zygote is the children's parent, so only it can reap them; the client signals them by pid.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What `python app.py` imports before it serves (measured: ~10 s of a ~15 s start on 2 cores). The
# transformers modules are imported lazily, at the first AutoConfig / AutoTokenizer call: left out,
# every forked app spent ~1.3 s of its ~2.2 s start importing them (torch.distributed, sympy, ...).
PRELOAD = (
    "torch",
    "gradio",
    "transformers",
    "uvicorn",
    "sqlite_utils",
    "engine",
    "engine.front.llm",
    "server.assembly",
    "ui.layout",
    "routes.openai.api",
    "storage",
)
LAZY_PRELOAD = (
    "transformers.models.llama.configuration_llama",
    "transformers.models.auto.tokenization_auto",
    "transformers.tokenization_utils_tokenizers",
)  # names of transformers 5; skipped if absent
# Variables read when a module is imported: a spawn that changes them gets a plain subprocess.
IMPORT_TIME_ENV = (
    "TRITON_INTERPRET",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "GRADIO_ANALYTICS_ENABLED",
    "HF_HUB_OFFLINE",
    "TOKENIZERS_PARALLELISM",
    "OMP_WAIT_POLICY",
)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _child(req: dict) -> None:
    """In the forked child: become `python app.py ARGV` with the given environment and log."""
    code = 1
    try:
        fd = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.argv = list(req["argv"])
        import runpy

        runpy.run_path(str(ROOT / "app.py"), run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - report like the interpreter would, then exit
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _prepare_default_model() -> str:
    """Prepare the default model's weights here, once, the way an app's engine would: every child
    then finds them in its process-wide cache (engine/exec/models/llama_weights.py) instead of
    building its own copy.

    Why: an app's first engine fuses, packs and tiles its weights (the default model in bf16:
    ~0.7 GB) into memory it has never touched, and on these VMs first-touched memory is the
    expensive kind (tests/conftest.py `_keep_freed_memory`). Measured per app start: ready in 0.67
    instead of 1.24 s, 0.7 instead of 1.3 CPU-s; a suite starts ~45. Forked, a child shares these
    pages copy-on-write and never writes them (prepared weights are read-only, llama_weights.py).

    The cache is keyed by the weight files, dtype, device, quantization and packing, all computed
    again in the child: an app asking for anything else (another model, another --dtype,
    --quantization int8, PAGED_CHAT_PACKED_FP32=0) prepares its own, as without the zygote.
    Torch runs here on one thread, so no OpenMP pool exists to be lost at fork(); the thread count
    the children will use is put back afterwards (set_num_threads only records it)."""
    try:
        import torch
        from engine.config import resolve_dtype
        from engine.exec.loader import ModelLoadError, load_model
        from engine.exec.models.llama import LlamaModel
    except ImportError as e:
        return f"not prepared: {e}"
    if torch.cuda.is_available():
        return "not prepared: a CUDA machine (the app's weights go to the GPU)"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loaded = load_model(None)
        dtype = getattr(torch, resolve_dtype("auto", "cpu"))
        LlamaModel(
            loaded.config,
            loaded.weights,
            dtype,
            torch.device("cpu"),
            max_positions=1,
            weights_key=loaded.weights_key,
        )
        return f"{loaded.source} ({dtype})"
    except (ModelLoadError, OSError, ValueError) as e:
        return f"not prepared: {e}"
    finally:
        torch.set_num_threads(threads)


def serve() -> None:
    """The zygote's loop (run as `python -m tests.e2e.app_zygote`)."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints of imported modules must not corrupt the protocol
    for name in PRELOAD:
        __import__(name)
    for name in LAZY_PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    prepared = _prepare_default_model()
    # the imports live as long as every child: frozen, a child's GC passes neither walk them nor
    # write to their pages (which would copy them, page by page, into every app process)
    gc.collect()
    gc.freeze()
    threads = _threads()
    out.write(json.dumps({"ready": threads == 1, "threads": threads, "prepared": prepared}) + "\n")
    if threads != 1:
        return
    exited: dict[int, int] = {}
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "spawn":
            pid = os.fork()
            if pid == 0:
                out.close()
                _child(req)
            out.write(json.dumps({"pid": pid}) + "\n")
        elif req["op"] == "status":
            pid = req["pid"]
            if pid not in exited:
                try:
                    got, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    got, status = pid, 0
                if got == pid:
                    exited[pid] = os.waitstatus_to_exitcode(status)
            out.write(json.dumps({"returncode": exited.get(pid)}) + "\n")


class Zygote:
    """The client side, one per test process: spawn() -> ForkedProcess, or None when unavailable."""

    def __init__(self):
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._broken = os.environ.get("PAGED_CHAT_TEST_FORK", "1") == "0"

    def _start(self) -> bool:
        # numpy's OpenBLAS starts a worker thread at import; with one BLAS thread the zygote stays
        # single-threaded. Only numpy's BLAS is affected in the children (the engine computes with
        # torch's own thread pool, which is created after the fork).
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OPENBLAS_NUM_THREADS": "1"}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.app_zygote"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        hello = json.loads(self._proc.stdout.readline() or "{}")
        if not hello.get("ready"):
            print(
                f"[app zygote] not used: {hello or 'it exited'}; starting plain subprocesses",
                file=sys.stderr,
            )
            self.close()
            return False
        return True

    def _ask(self, req: dict) -> dict:
        self._proc.stdin.write(json.dumps(req) + "\n")
        self._proc.stdin.flush()
        return json.loads(self._proc.stdout.readline())

    def spawn(self, argv: list[str], env: dict, log: Path) -> "ForkedProcess | None":
        if any(env.get(k) != os.environ.get(k) for k in IMPORT_TIME_ENV):
            return None
        with self._lock:
            if self._broken:
                return None
            if self._proc is None and not self._start():
                self._broken = True
                return None
            pid = self._ask(
                {"op": "spawn", "argv": argv, "env": env, "cwd": str(ROOT), "log": str(log)}
            )["pid"]
        return ForkedProcess(self, pid, argv)

    def returncode(self, pid: int) -> int | None:
        with self._lock:
            return self._ask({"op": "status", "pid": pid})["returncode"]

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


class ForkedProcess:
    """The subset of subprocess.Popen the harness and tests use, for a child of the zygote."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]):
        self._zygote, self.pid, self.args, self.returncode = zygote, pid, args, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.time() + timeout
        while self.poll() is None:
            if deadline is not None and time.time() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    serve()
