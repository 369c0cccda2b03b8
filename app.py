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


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    """Every flag of the app (the engine's come from EngineConfig); the README's usage block lists
    them all (tests/server/test_readme_flags.py)."""
    p = argparse.ArgumentParser(description="Local LLM chat server with a paged KV cache.")
    p.add_argument(
        "--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=7860)
    from engine.config import add_arguments as add_engine_flags  # every EngineConfig field

    add_engine_flags(p)
    p.add_argument("--db", default="data/chat.db", help="SQLite file for the chat history")
    p.add_argument(
        "--trusted-proxy",
        action="append",
        default=[],
        metavar="IP",
        help="a reverse proxy whose X-Forwarded-For is believed (repeatable); by default none is, "
        "so a client cannot pick the address login throttling counts against",
    )
    p.add_argument(
        "--share",
        action="store_true",
        help="also open a public Gradio share link to this app (opt-in; use with --auth)",
    )
    p.add_argument(
        "--auth",
        action="append",
        default=None,
        metavar="USER:PASS",
        help="require a login; repeat for several users (each sees only their own chats)",
    )
    p.add_argument(
        "--auth-file",
        default=None,
        metavar="FILE",
        help="USER:HASH per line (make one: python -m routes.security.auth USER); also $PAGED_CHAT_AUTH",
    )
    p.add_argument(
        "--admin",
        action="append",
        default=[],
        metavar="USER",
        help="with --auth: a user who may start the Memory tab's demo users (repeatable)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="extra Host name to answer to (DNS-rebinding guard; loopback names always work)",
    )
    p.add_argument(
        "--api-key",
        action="append",
        default=None,
        metavar="[NAME:]KEY[:PRIORITY]",
        help="require this key (Authorization: Bearer KEY) on the OpenAI API at /v1; repeatable; "
        "NAME (letters, digits, _.@-) is the caller's tenant for fair scheduling "
        "and its own prefix cache; PRIORITY (-1000..1000, after a NAME) its class "
        "instead of --api-priority. Also read from PAGED_CHAT_API_KEYS (comma "
        "separated)",
    )
    p.add_argument(
        "--metrics-token",
        default=None,
        metavar="TOKEN",
        help="with --auth: /metrics shows per-tenant lines to requests with "
        "'Authorization: Bearer TOKEN' (and to --admin users); others get the "
        "aggregates only. Also $PAGED_CHAT_METRICS_TOKEN",
    )
    p.add_argument(
        "--api-priority",
        type=int,
        default=1,
        help="the class of /v1 calls (lower first; chat turns are 0); a call's own "
        "'priority' may lower it, never raise it. Default 1",
    )
    p.add_argument(
        "--allowed-origin",
        action="append",
        default=None,
        metavar="URL",
        help="let web pages from this origin call /v1 (CORS); repeatable. Default: none",
    )
    p.add_argument(
        "--backend",
        action="append",
        default=None,
        metavar="URL",
        help="run the UI, history and dashboard on a remote OpenAI-compatible server (vLLM, "
        "SGLang, llama.cpp, another app.py) instead of loading a model here; "
        "repeat it for several replicas (each turn picks one: --backend-routing)",
    )
    p.add_argument(
        "--backend-kv-events",
        action="append",
        default=None,
        metavar="ENDPOINT[,REPLAY]",
        help="a replica's KV-event stream (vLLM --kv-events-config), e.g. "
        "tcp://gpu1:5557,tcp://gpu1:5558 (replay endpoint optional): one per "
        "--backend, same order (or one per replica behind a single --backend "
        "router). The Memory tab then draws each replica's cached blocks "
        "(docs/SCALE_OUT.md)",
    )
    p.add_argument(
        "--backend-routing",
        choices=["conversation", "round-robin"],
        default="conversation",
        help="several --backend: conversation (default) keeps each chat on one replica, "
        "picked by its first messages; round-robin sends each turn to the next one",
    )
    p.add_argument(
        "--backend-tokenizer",
        default=None,
        metavar="FOLDER",
        help="a folder with the backend model's tokenizer.json, to show cached "
        "prefixes by their first words (default: the folder the backend "
        "reports, if it is here)",
    )
    p.add_argument(
        "--backend-key",
        default=None,
        metavar="KEY",
        help="API key for --backend (also $PAGED_CHAT_BACKEND_KEY)",
    )
    p.add_argument(
        "--backend-model",
        default=None,
        metavar="NAME",
        help="model id to ask --backend for (default: the first of its /v1/models)",
    )
    return p


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
    sys.stderr.write(
        f"\r[{'#' * done}{'.' * (width - done)}] {fraction * 100:3.0f}%  {message[:70]:<70}"
    )
    if fraction >= 1.0:
        sys.stderr.write("\n")
    sys.stderr.flush()


APP_DEPENDENCIES = {
    "gradio": "gradio",
    "uvicorn": "uvicorn",
    "sqlite_utils": "sqlite-utils",
    "pandas": "pandas",
}


def missing_app_dependencies() -> list[str]:
    """pip names of the app's own dependencies that are not installed (the engine needs none)."""
    import importlib.util

    return [pip for mod, pip in APP_DEPENDENCIES.items() if importlib.util.find_spec(mod) is None]


def main(argv=None) -> int:
    args = parse_args(argv)
    missing = missing_app_dependencies()
    if missing:  # e.g. a GPU machine with only the engine's requirements: say so before loading
        print(
            f"error: the chat app needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
            f"not installed.\n  Install the app's dependencies without touching an installed (CUDA) "
            f"torch: bash scripts/setup.sh\n  (or: pip install {' '.join(missing)}). The engine alone "
            f"(engine.LLM, scripts/gpu_check.sh) runs without them.",
            file=sys.stderr,
        )
        return 2
    # SIGTERM while loading: unwind like Ctrl-C so the cleanup below still runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from routes.security.auth import load_credentials

    try:
        creds = load_credentials(
            parse_auth(args.auth), args.auth_file, os.environ.get("PAGED_CHAT_AUTH")
        )
    except (OSError, ValueError) as e:
        raise SystemExit(f"auth: {e}")
    auth = creds.gradio_auth if creds else None
    if args.auth:
        print(
            "NOTE: --auth passwords are visible to other local users (ps); prefer --auth-file or "
            "PAGED_CHAT_AUTH (see docs/SECURITY.md).",
            file=sys.stderr,
        )
    if not is_local(args.host) and not auth:
        print(
            f"WARNING: binding to {args.host} without --auth: anyone who can reach this machine "
            f"can read and write every conversation.",
            file=sys.stderr,
        )

    if args.share and not auth:
        print(
            "WARNING: --share without --auth: anyone with the public link can read and write every "
            "conversation.",
            file=sys.stderr,
        )

    from routes.openai.keys import ApiAccess, keys_from_env

    api_keys = (args.api_key or []) + keys_from_env()
    try:
        ApiAccess(api_keys)  # a bad PRIORITY stops here, not at the first call
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    if not is_local(args.host) and not auth and not api_keys:
        print(
            f"WARNING: binding to {args.host} without --api-key: anyone who can reach this machine "
            f"can use the OpenAI API at /v1.",
            file=sys.stderr,
        )

    if args.backend:
        return main_remote(args, auth)

    from engine.config import from_args
    from engine.exec.loader import ModelLoadError
    from engine.front.model_host import ModelHost, model_catalog
    from storage import Storage

    try:
        config = from_args(args)  # the engine's options, validated once
        catalog = model_catalog(args.model)  # --model PATH ... (or a folder of .gguf files)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    started = time.time()
    print("Loading the model…", file=sys.stderr)
    try:
        llm = ModelHost(catalog, config, progress=terminal_progress)
    except ModelLoadError as e:
        raise SystemExit(f"error: {e}")
    storage = None
    try:
        storage = Storage(args.db)
        s = llm.stats()
        print(
            f"Model ready in {time.time() - started:.1f} s: {llm.model_source}; KV pool "
            f"{s['total_blocks']} blocks x {s['block_size']} tokens = {s['kv_capacity_tokens']} tokens "
            f"({s.get('kv_cache_dtype') or 'auto'}, {s['kv_bytes_per_token']:,} B/token); "
            f"context {llm.max_model_len}; history in {args.db}",
            file=sys.stderr,
        )
        info = llm.model_info()
        if info.compute_path:
            print(f"CPU path: {info.compute_path}", file=sys.stderr)
        if s.get("tier_kind"):
            print(
                f"KV tier: {s['tier_kind']}, {s['tier_capacity_bytes'] / 2**30:.2f} GiB, "
                f"{s['tier_restored_blocks']} blocks restored",
                file=sys.stderr,
            )
        serve(llm, storage, args, auth)
    finally:
        print("Shutting down…", file=sys.stderr)
        saved = llm.shutdown()
        if saved:  # the KV tier keeps the pool's blocks for the next start (issue 47)
            print(
                f"KV tier: kept {saved['saved']} more blocks of the pool for the next start in "
                f"{saved['seconds']:.1f} s ({saved['already']} were there already"
                + (f", {saved['left']} left out of time or room" if saved["left"] else "")
                + ")",
                file=sys.stderr,
            )
        if storage is not None:
            storage.close()
        print("Bye.", file=sys.stderr)
    return 0


def main_remote(args, auth) -> int:
    """--backend URL: no model here; chats go to the remote server (backends/remote.py)."""
    from backends import RemoteEngine
    from storage import Storage

    key = args.backend_key or os.environ.get("PAGED_CHAT_BACKEND_KEY")
    if len(args.backend) > 1 or args.backend_kv_events:  # several replicas / their KV events
        from backends.cluster_engine import ClusterEngine

        try:
            llm = ClusterEngine(
                args.backend,
                api_key=key,
                model=args.backend_model,
                kv_events=args.backend_kv_events,
                routing=args.backend_routing,
                tokenizer=args.backend_tokenizer,
            ).start()
        except ValueError as e:
            raise SystemExit(f"error: {e}")
    else:
        llm = RemoteEngine(args.backend[0], api_key=key, model=args.backend_model)
    if llm.startup_error:
        print(
            f"WARNING: {llm.startup_error}. Serving the stored chats anyway; each message will say "
            f"whether the backend answers.",
            file=sys.stderr,
        )
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


if __name__ == "__main__":
    sys.exit(main())
