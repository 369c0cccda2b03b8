"""The FastAPI app that serves the page together with /metrics, /api/kv and the OpenAI API.

`build_app(llm, storage, auth=...)` is all app.py and the tests need. Why here and not in ui/:
the page is one thing the server mounts; security, exports, pins at start-up and the HTTP routes
are the server's, and routes must not import ui nor ui routes (tests/test_import_graph.py).
"""

from __future__ import annotations

import atexit

import fastapi
import gradio as gr
from fastapi import Request  # module level: the goodbye route's annotation resolves here

from engine.protocol import PinsPrompts, SwitchesModels
from routes.exports import register_export_route
from routes.kv import register_kv_route
from routes.metrics import register_routes
from routes.security.host_guard import install_security
from ui.chat.context import ChatContext
from ui.chat.prompt_pins import PromptPins
from ui.chat.tabs import RELEASE_GRACE_S, TabRegistry
from ui.layout import build_demo, page_css
from ui.page_assets import HEAD
from server.page_head import HeadFirst


def build_app(
    llm,
    storage,
    *,
    auth=None,
    ctx: ChatContext | None = None,
    bind_host: str = "127.0.0.1",
    allowed_hosts=(),
    api_options: dict | None = None,
    engine_routes: bool = True,
    admins=(),
    share_hosts: set | None = None,
    metrics_token: str | None = None,
):
    """(FastAPI app serving the page at / plus /metrics, /api/kv and the OpenAI API at /v1, the Blocks
    demo). api_options: api_keys, allowed_origins, ... for routes.openai.api.mount_openai_api.
    metrics_token: under --auth, a bearer token that shows /metrics' per-tenant lines (--admin
    logins see them too; nobody else does).
    engine_routes=False (app.py --backend): no /metrics, /api/kv, /v1 here; the backend serves its own."""
    ctx = ctx or ChatContext(
        llm,
        storage,
        TabRegistry(llm, release_grace_s=RELEASE_GRACE_S),
        auth=bool(auth),
        admins=frozenset(admins),
    )
    pin_shared_prompts(ctx, llm, storage)
    demo = build_demo(ctx)
    demo.queue(default_concurrency_limit=None)
    _calm_idle_polling(demo)
    demo.chat_context = ctx
    app = fastapi.FastAPI()
    _serve_exports(app, ctx, demo, auth)
    _serve_goodbyes(app, ctx, demo, auth)
    if engine_routes:  # before mounting Gradio at "/", which would shadow them
        _register_engine_routes(
            app,
            llm,
            storage,
            demo,
            auth,
            api_options,
            tenant_viewer(demo, frozenset(admins), metrics_token),
        )
    app = gr.mount_gradio_app(
        app,
        demo,
        path="/",
        auth=auth,
        css=page_css(),
        ssr_mode=False,
        footer_links=["api", "gradio"],
    )
    if engine_routes:
        _count_dashboard_ticks(app, llm)
    app.add_middleware(HeadFirst, script=HEAD)  # ui/page_assets.HEAD, before Gradio's scripts
    install_security(
        app,
        bind_host,
        allowed_hosts,
        auth=auth,  # Host check, no /docs, login throttle
        share_hosts=share_hosts,
    )
    if auth:  # Gradio's /cancel takes any session hash: owner check (#12.10)
        from routes.security.cancel_guard import install_cancel_guard

        install_cancel_guard(app, ctx.tabs)
    return app, demo


def _serve_goodbyes(app, ctx: ChatContext, demo, auth) -> None:
    """POST /api/tab/goodbye (a page going away, ui/chat/tab_goodbye.py) and the sweep of tabs
    that went silent without one."""
    from fastapi.responses import Response

    from routes.kv import gradio_user
    from ui.chat import tab_goodbye

    @app.post("/" + tab_goodbye.GOODBYE_PATH, include_in_schema=False)
    async def goodbye(request: Request) -> Response:
        session, token = tab_goodbye.parse(await request.body())
        user = gradio_user(demo, request) if auth else None
        if session and token:
            ctx.tabs.goodbye(session, token, user)
        return Response(status_code=204)  # the same answer either way: nothing to probe

    app.state.tab_sweep = tab_goodbye.start_sweeper(ctx.tabs)


# Gradio's event queue polls for work every 1 ms and for progress every 10 ms on Linux, even with no
# page open: ~8% of a core while the app sits idle (measured, 2-core box). Every 10 ms / 50 ms is
# invisible next to a model step and brings the idle app to ~2.5%.
QUEUE_POLL_S, PROGRESS_POLL_S = 0.01, 0.05


def _calm_idle_polling(demo) -> None:
    queue = getattr(demo, "_queue", None)  # Gradio's own object; absent in other versions
    if queue is None:
        return
    if getattr(queue, "sleep_when_free", 0) < QUEUE_POLL_S:
        queue.sleep_when_free = QUEUE_POLL_S
    if getattr(queue, "progress_update_sleep_when_free", 0) < PROGRESS_POLL_S:
        queue.progress_update_sleep_when_free = PROGRESS_POLL_S


def pin_shared_prompts(ctx: ChatContext, llm, storage) -> None:
    """An engine that pins prefixes (the real one) holds the shared prompt's blocks from start-up."""
    if ctx.pins is not None or not isinstance(llm, PinsPrompts):
        return
    ctx.pins = PromptPins(llm, storage)
    note = ctx.pins.fit_default()
    if note:
        print(f"[app] {note}", flush=True)
    ctx.pins.pin_startup()
    if isinstance(llm, SwitchesModels):  # another model's pool: pin its shared prompts again
        llm.on_switch(lambda _engine: ctx.pins.pin_startup())


def _serve_exports(app, ctx: ChatContext, demo, auth) -> None:
    if ctx.exports is None:  # exports are served by our route, owner-only (#12.12)
        from storage.exports import PrivateExports

        ctx.exports = PrivateExports()
        atexit.register(ctx.exports.close)
    register_export_route(app, ctx.exports, demo=demo, auth=bool(auth))


def tenant_viewer(demo, admins: frozenset, token: str | None):
    """Who may read /metrics' per-tenant lines under --auth: a request with the metrics token as
    its bearer token, or the login cookie of an --admin user (issue 48.6)."""
    import hmac

    from routes.kv import gradio_user

    def allowed(request) -> bool:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if (
            token
            and scheme.lower() == "bearer"
            and hmac.compare_digest(given.strip().encode(), token.encode())
        ):
            return True
        return bool(admins) and gradio_user(demo, request) in admins

    return allowed


def _register_engine_routes(
    app, llm, storage, demo, auth, api_options: dict | None, viewer=None
) -> None:
    register_routes(app, llm, kv_route=False, auth=bool(auth), tenant_viewer=viewer)
    register_kv_route(
        app, llm, storage=storage, demo=demo, auth=bool(auth)
    )  # viewer-scoped /api/kv
    from routes.openai.api import mount_openai_api

    mount_openai_api(app, llm, require_key=bool(auth), multi_user=bool(auth), **(api_options or {}))


def _count_dashboard_ticks(app, llm) -> None:
    """/metrics also reports the dashboard's ticks (ui/dashboard/page.DashboardState.metrics_text)."""
    from ui.dashboard.page import state_for

    extra = getattr(app.state, "extra_metrics", None)
    if extra is None:
        extra = app.state.extra_metrics = []
    extra.append(state_for(llm).metrics_text)
