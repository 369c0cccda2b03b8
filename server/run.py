"""Run the assembled app: uvicorn with this project's shutdown order, "Ready" once serving, and
the --share link (routes/share.py). app.py parses the flags and loads the engine; this runs it.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time


def serve(llm, storage, args, auth) -> None:
    """Serve until Ctrl-C / SIGTERM: the first one ends replies in flight and Gradio's heartbeat
    streams, uvicorn shuts down gracefully; the caller (app.py) then stops the engine and storage."""
    import uvicorn

    from routes.openai.keys import keys_from_env
    from server.assembly import build_app

    share_hosts: set = set()  # --share: the link's host name, allowed once the tunnel is up
    app, demo = build_app(
        llm,
        storage,
        auth=auth,
        bind_host=args.host,
        allowed_hosts=args.allowed_host,
        admins=args.admin,
        share_hosts=share_hosts,
        api_options=dict(
            api_keys=(args.api_key or []) + keys_from_env(),
            allowed_origins=args.allowed_origin,
            default_priority=args.api_priority,
        ),
        engine_routes=not args.backend,
        metrics_token=getattr(args, "metrics_token", None)
        or os.environ.get("PAGED_CHAT_METRICS_TOKEN")
        or None,
    )
    shown_host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    url = f"http://{shown_host}:{args.port}/"
    # X-Forwarded-For only from proxies named with --trusted-proxy (uvicorn would believe any local
    # client by default, letting it rotate made-up addresses past the login and API-key throttles)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        timeout_graceful_shutdown=3,
        ws="none",
        proxy_headers=bool(args.trusted_proxy),
        forwarded_allow_ips=args.trusted_proxy or None,
    )
    tabs = demo.chat_context.tabs

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if not self.should_exit:  # first Ctrl-C / SIGTERM: end replies in flight, so their
                tabs.abort_all()  # handlers store them as "stopped" while the loop still runs,
                for route in app.routes:  # and end Gradio's heartbeat streams, so the
                    stop = getattr(getattr(route, "app", None), "stop_event", None)  # graceful
                    if stop is not None:  # shutdown does not wait for open tabs
                        stop.set()
            super().handle_exit(sig, frame)

    server = Server(config)
    _announce_when_started(server, url, share_hosts if args.share else None, shown_host, args.port)
    # uvicorn catches Ctrl-C / SIGTERM, shuts down gracefully, restores the previous handlers and
    # re-raises the signal. With no-op handlers in place that re-raise is harmless, so main()'s
    # cleanup (engine thread stopped, database closed) runs and the exit status is 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    # What exists now (imported libraries, the model's modules, Gradio's Blocks graph: ~430k objects)
    # lives until shutdown. A full GC pass holds the GIL, so it pauses every stream and the engine
    # thread while it walks them all again (0.27 s a pass, measured); frozen, it walks only what
    # requests allocate. Reference counting still frees frozen objects.
    gc.collect()
    gc.freeze()
    try:
        server.run()
    finally:
        # A second Ctrl-C / SIGTERM during the cleanup below ends the process the usual way.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        tabs.shutdown(timeout=10)  # queued aborts/releases reach the engine before it stops


def _announce_when_started(
    server, url: str, share_hosts: set | None = None, host: str = "127.0.0.1", port: int = 0
) -> None:
    """Print "Ready" once serving; with --share (share_hosts given) then open the public link to
    this same app (routes/share.py) and print it."""
    import threading

    def watch():
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if not server.started:
            return
        print(f"Ready: {url}", flush=True)
        if share_hosts is not None:
            from routes.share import open_share_link

            try:
                print(f"Public link: {open_share_link(host, port, share_hosts)}", flush=True)
            except Exception as e:  # no internet, share server down: the local app keeps serving
                print(
                    f"WARNING: could not open a share link ({e}); serving locally only.",
                    file=sys.stderr,
                    flush=True,
                )

    threading.Thread(target=watch, daemon=True, name="announce").start()
