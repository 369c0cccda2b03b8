"""Start the chat server: `python app.py [--model PATH] [--host 127.0.0.1] [--port 7860] ...`

Loads the model (progress in the terminal), opens the SQLite history, serves the Gradio page
mounted on FastAPI (so /metrics and /api/kv are served too) and shuts down cleanly on Ctrl-C or
SIGTERM: the engine thread is stopped and the database closed.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sys
import time

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _offload_gib(v: str):
    """--kv-offload-gib: 'auto' or a number of GiB >= 0."""
    if v == "auto":
        return v
    x = float(v)
    if x < 0:
        raise ValueError(v)
    return x


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Local LLM chat server with a paged KV cache.")
    p.add_argument("--model", default=None, help="HF folder or .gguf file (default: SmolLM2-135M-Instruct)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    pool = p.add_mutually_exclusive_group()
    pool.add_argument("--num-blocks", type=int, default=None, help="KV pool size in blocks")
    pool.add_argument("--kv-cache-gib", type=float, default=None, help="KV pool size in GiB")
    p.add_argument("--max-model-len", type=int, default=None, help="context length (prompt + reply)")
    p.add_argument("--kv-offload-gib", type=_offload_gib, default="auto", metavar="GIB",
                   help="second KV tier behind the pool (CPU: files under --kv-offload-dir, survive a "
                        "restart; CUDA: host memory): evicted, parked and preempted blocks are kept there "
                        "instead of recomputed. 'auto' (default): min(8 GiB, 10%% of free disk) on CPU, a "
                        "quarter of free RAM on CUDA; 0 turns it off")
    p.add_argument("--kv-offload-dir", default=None, metavar="DIR",
                   help="folder of the disk KV tier (default: <cache>/kv-tier; 0700, files 0600)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="sequences decoded together; more wait")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, metavar="N",
                   help="tokens one engine step may compute (prefill chunks + decodes); default 512 on "
                        "CPU, 8192 on CUDA")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="weights and KV dtype. auto (default): bfloat16 on CUDA or on a CPU with "
                        "AVX512-BF16/AMX (~2.4x faster decode, no longer bit-matches HF fp32), else float32")
    p.add_argument("--quantization", choices=["int8"], default=None,
                   help="int8: weight-only int8 weights with per-channel scales (CPU, bf16 activations); "
                        "fastest at batch 1, slightly less accurate")
    p.add_argument("--lean-step", choices=["auto", "on", "off"], default="auto",
                   help="CPU, one conversation decoding: run the whole step in one C++ call (1.5-2.3x tokens/s "
                        "at fp32 here). It reads plain weights, so fp32/bf16 keep a second copy of the layer "
                        "weights (+405 MiB fp32 for the default model; int8: none). auto (default): on when "
                        "that copy is under 1.5 GiB; off: the per-layer loop only")
    p.add_argument("--kv-cache-dtype", choices=["auto", "float32", "bfloat16", "float16", "int8", "fp8"],
                   default="auto", help="KV pool format (vLLM's flag). auto (default): the weights' dtype; "
                        "int8: ~1.9x the bf16 tokens in the same memory, any device (accuracy: docs/BENCHMARKS.md); "
                        "fp8: e4m3, CUDA sm_89+ only")
    p.add_argument("--kv-cache-rotation", choices=["auto", "hadamard", "none"], default="auto",
                   help="int8/fp8 KV: rotate K, V (and q, and the attention output back) per head by a fixed "
                        "Hadamard matrix before quantizing; auto (default): on for int8/fp8 with a power-of-two "
                        "head_dim (~4x lower KL vs fp32, docs/BENCHMARKS.md); none: off")
    p.add_argument("--speculative", choices=["ngram", "suffix", "off"], default="off",
                   help="speculative decoding: draft the next tokens from the conversation itself and verify "
                        "them in one step (exact for greedy, same distribution when sampling). ngram: prompt "
                        "lookup over this chat; suffix: also the user's recent replies. It backs off by itself "
                        "where it would not pay (low acceptance, large batches). Default off")
    p.add_argument("--num-speculative-tokens", type=int, default=5, metavar="K",
                   help="the longest draft (1..16, default 5); the adaptive rule picks 0..K per request and step")
    p.add_argument("--db", default="data/chat.db", help="SQLite file for the chat history")
    p.add_argument("--trusted-proxy", action="append", default=[], metavar="IP",
                   help="a reverse proxy whose X-Forwarded-For is believed (repeatable); by default none is, "
                        "so a client cannot pick the address login throttling counts against")
    p.add_argument("--share", action="store_true", help="also open a public Gradio share link to this app (opt-in; use with --auth)")
    p.add_argument("--auth", action="append", default=None, metavar="USER:PASS",
                   help="require a login; repeat for several users (each sees only their own chats)")
    p.add_argument("--auth-file", default=None, metavar="FILE",
                   help="USER:HASH per line (make one: python -m routes.auth USER); also $PAGED_CHAT_AUTH")
    p.add_argument("--admin", action="append", default=[], metavar="USER",
                   help="with --auth: a user who may start the Memory tab's demo users (repeatable)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="extra Host name to answer to (DNS-rebinding guard; loopback names always work)")
    p.add_argument("--api-key", action="append", default=None, metavar="[NAME:]KEY",
                   help="require this key (Authorization: Bearer KEY) on the OpenAI API at /v1; repeatable; "
                        "NAME (letters, digits, _.@-) is the caller's tenant for fair scheduling. "
                        "Also read from PAGED_CHAT_API_KEYS (comma separated)")
    fair = p.add_argument_group("fair scheduling (engine/core/fairness.py, docs/DESIGN.md)")
    fair.add_argument("--scheduling-policy", choices=["fair", "fcfs"], default="fair",
                      help="fair (default): per-user virtual token counters + priorities; fcfs: arrival order")
    fair.add_argument("--tenant-weight", action="append", default=[], metavar="NAME=W",
                      help="a tenant's share weight (default 1); tenants: user:NAME under --auth, the "
                           "--api-key name, api (keyless /v1), local, demo-user-K. Repeatable")
    fair.add_argument("--api-priority", type=int, default=1,
                      help="priority of /v1 calls that send none (lower first; chat turns are 0). Default 1")
    fair.add_argument("--max-queued-requests", type=int, default=None,
                      help="requests that may wait, over all tenants; more get 429 / a busy sentence")
    fair.add_argument("--max-queued-tokens", type=int, default=None, help="prompt tokens that may wait, overall")
    fair.add_argument("--tenant-max-queued-requests", type=int, default=None,
                      help="requests one tenant may have waiting")
    fair.add_argument("--tenant-max-queued-tokens", type=int, default=None,
                      help="prompt tokens one tenant may have waiting")
    p.add_argument("--allowed-origin", action="append", default=None, metavar="URL",
                   help="let web pages from this origin call /v1 (CORS); repeatable. Default: none")
    p.add_argument("--backend", default=None, metavar="URL",
                   help="run the UI, history and dashboard on a remote OpenAI-compatible server (vLLM, "
                        "SGLang, llama.cpp, another app.py) instead of loading a model here")
    p.add_argument("--backend-key", default=None, metavar="KEY",
                   help="API key for --backend (also $PAGED_CHAT_BACKEND_KEY)")
    p.add_argument("--backend-model", default=None, metavar="NAME",
                   help="model id to ask --backend for (default: the first of its /v1/models)")
    return p.parse_args(argv)


def parse_auth(values: list[str] | None) -> list[tuple[str, str]] | None:
    if not values:
        return None
    pairs = []
    for v in values:
        user, sep, password = v.partition(":")
        if not sep or not user or not password:
            raise SystemExit(f"--auth expects USER:PASS, got {v!r}")
        pairs.append((user, password))
    return pairs


def is_local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def terminal_progress(fraction: float, message: str) -> None:
    width = 30
    done = int(width * max(0.0, min(1.0, fraction)))
    sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {fraction * 100:3.0f}%  {message[:70]:<70}")
    if fraction >= 1.0:
        sys.stderr.write("\n")
    sys.stderr.flush()


APP_DEPENDENCIES = {"gradio": "gradio", "uvicorn": "uvicorn", "sqlite_utils": "sqlite-utils",
                    "pandas": "pandas"}


def missing_app_dependencies() -> list[str]:
    """pip names of the app's own dependencies that are not installed (the engine needs none)."""
    import importlib.util
    return [pip for mod, pip in APP_DEPENDENCIES.items() if importlib.util.find_spec(mod) is None]


def main(argv=None) -> int:
    args = parse_args(argv)
    missing = missing_app_dependencies()
    if missing:   # e.g. a GPU machine with only the engine's requirements: say so before loading
        print(f"error: the chat app needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
              f"not installed.\n  Install the app's dependencies without touching an installed (CUDA) "
              f"torch: bash scripts/setup.sh\n  (or: pip install {' '.join(missing)}). The engine alone "
              f"(engine.LLM, scripts/gpu_check.sh) runs without them.", file=sys.stderr)
        return 2
    # SIGTERM while loading: unwind like Ctrl-C so the cleanup below still runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from routes.auth import load_credentials
    try:
        creds = load_credentials(parse_auth(args.auth), args.auth_file, os.environ.get("PAGED_CHAT_AUTH"))
    except (OSError, ValueError) as e:
        raise SystemExit(f"auth: {e}")
    auth = creds.gradio_auth if creds else None
    if args.auth:
        print("NOTE: --auth passwords are visible to other local users (ps); prefer --auth-file or "
              "PAGED_CHAT_AUTH (see docs/SECURITY.md).", file=sys.stderr)
    if not is_local(args.host) and not auth:
        print(f"WARNING: binding to {args.host} without --auth: anyone who can reach this machine "
              f"can read and write every conversation.", file=sys.stderr)

    if args.share and not auth:
        print("WARNING: --share without --auth: anyone with the public link can read and write every "
              "conversation.", file=sys.stderr)

    from routes.openai_keys import keys_from_env
    api_keys = (args.api_key or []) + keys_from_env()
    if not is_local(args.host) and not auth and not api_keys:
        print(f"WARNING: binding to {args.host} without --api-key: anyone who can reach this machine "
              f"can use the OpenAI API at /v1.", file=sys.stderr)

    if args.backend:
        return main_remote(args, auth)

    from engine import LLM
    from engine.core.admission import QueueBounds
    from engine.core.fairness import parse_tenant_weights
    from storage import Storage

    try:
        weights = parse_tenant_weights(args.tenant_weight)
        bounds = QueueBounds(args.max_queued_requests, args.max_queued_tokens,
                             args.tenant_max_queued_requests, args.tenant_max_queued_tokens)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    started = time.time()
    print("Loading the model…", file=sys.stderr)
    from engine.errors import ModelLoadError
    try:
        llm = _load_engine(LLM, args, weights, bounds)
    except ModelLoadError as e:           # a model we cannot serve: one sentence, no traceback
        raise SystemExit(f"error: {e}")
    storage = None
    try:
        storage = Storage(args.db)
        s = llm.stats()
        print(f"Model ready in {time.time() - started:.1f} s: {llm.model_source}; KV pool "
              f"{s['total_blocks']} blocks x {s['block_size']} tokens = {s['kv_capacity_tokens']} tokens "
              f"({s.get('kv_cache_dtype') or 'auto'}, {s['kv_bytes_per_token']:,} B/token); "
              f"context {llm.max_model_len}; history in {args.db}", file=sys.stderr)
        info = llm.model_info()
        if info.compute_path:
            print(f"CPU path: {info.compute_path}", file=sys.stderr)
        if s.get("tier_kind"):
            print(f"KV tier: {s['tier_kind']}, {s['tier_capacity_bytes'] / 2**30:.2f} GiB, "
                  f"{s['tier_restored_blocks']} blocks restored", file=sys.stderr)
        serve(llm, storage, args, auth)
    finally:
        print("Shutting down…", file=sys.stderr)
        llm.shutdown()
        if storage is not None:
            storage.close()
        print("Bye.", file=sys.stderr)
    return 0


def main_remote(args, auth) -> int:
    """--backend URL: no model here; chats go to the remote server (backends/remote.py)."""
    from backends import RemoteEngine
    from storage import Storage

    llm = RemoteEngine(args.backend, api_key=args.backend_key or os.environ.get("PAGED_CHAT_BACKEND_KEY"),
                       model=args.backend_model)
    if llm.startup_error:
        print(f"WARNING: {llm.startup_error}. Serving the stored chats anyway; each message will say "
              f"whether the backend answers.", file=sys.stderr)
    else:
        print(f"Backend: {llm.model_source}; context {llm.max_model_len}", file=sys.stderr)
    storage = None
    try:
        storage = Storage(args.db)
        serve(llm, storage, args, auth)
    finally:
        llm.shutdown()
        if storage is not None:
            storage.close()
        print("Bye.", file=sys.stderr)
    return 0


def serve(llm, storage, args, auth) -> None:
    """Build the app (server/assembly.py) and run it until Ctrl-C / SIGTERM (server/run.py)."""
    from server import serve as run_server
    run_server(llm, storage, args, auth)



def _load_engine(LLM, args, weights, bounds):
    """The embedded engine from the command line's flags (a ModelLoadError says why it cannot)."""
    return LLM(model=args.model, block_size=args.block_size, num_blocks=args.num_blocks,
               kv_cache_gib=args.kv_cache_gib, max_model_len=args.max_model_len,
               max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
               dtype=args.dtype, quantization=args.quantization, lean_step=args.lean_step,
               kv_cache_dtype=args.kv_cache_dtype, kv_cache_rotation=args.kv_cache_rotation, progress=terminal_progress,
               scheduling_policy=args.scheduling_policy, tenant_weights=weights,
               queue_bounds=bounds, kv_offload_gib=args.kv_offload_gib, kv_offload_dir=args.kv_offload_dir,
               speculative=None if args.speculative == "off" else args.speculative,
               num_speculative_tokens=args.num_speculative_tokens)


if __name__ == "__main__":
    sys.exit(main())
