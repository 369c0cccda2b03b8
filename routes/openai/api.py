"""The OpenAI-compatible API on the embedded engine: GET /v1/models, POST /v1/chat/completions,
POST /v1/completions (streaming SSE or not).

It is its own small FastAPI app mounted at /v1 next to the Gradio page, so its error shape, API-key
check and CORS policy apply to /v1 only and cannot change the UI's. It uses only LLM's public
calls (submit, abort, stats, latest_snapshot, get_tokenizer, encode_prompt). Chat prompts are
rendered by the same template code as the browser's chats. Their cache salt follows
engine/kv/salt_rule.py: none without --auth and with at most one key (one local user), else
`api:NAME`, one per key; the leading system prompt is never salted, so one shared with browser
chats hits the same blocks.

Queue bound: at most `max_pending` API sequences (n per prompt) in flight, default
2 x max_num_seqs, and none admitted while the engine already has `max_num_seqs` requests waiting;
past either bound the call gets 429 with Retry-After. Under fair scheduling both bounds count each
caller (API key = tenant) separately, in the pre-parse gate as in the route (the 429 names the
key's own bound), and the engine's admission bounds (--max-queued-*, per tenant first, then
overall) answer 429 + Retry-After too. 503 means the engine has shut down.

Priority: a call runs at the class the operator gave its key (`--api-priority`, or
`NAME:KEY:PRIORITY`); its own `priority` field may only lower it (routes/openai/keys.py).
"""

from __future__ import annotations

import asyncio
import os
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.datastructures import Headers

from engine.core.admission import QueueFull
from engine.protocol import SwitchesModels
from engine.kv.salt_rule import principal_salt, prompt_salt
from engine.text.session_prompt import continue_session_prompt
from routes.openai import schemas as S
from routes.openai.errors import APIError, error_body, install_error_handlers
from routes.security.auth import LoginThrottle
from routes.security.cross_site import foreign_origin
from routes.openai.admission import ApiAdmission
from routes.openai.keys import ApiAccess, add_cors, effective_priority
from routes.openai.metrics import ApiMetrics
from routes.openai.params import LogprobFormatter, to_sampling_params
from routes.security.request_limits import RequestLimits
from routes.openai.stream import DONE, Generation, Submitted, sse, watch_disconnect
from routes.openai import tools as openai_tools
from routes.openai.render import ChatRender, CompletionRender, ReasoningSplit
from routes.openai.structured import structured_spec

KEY_THROTTLE_USER = "\x00api-key"  # the throttle's user slot for API keys (no login name has a NUL)

API_PREFIX = "api-"  # engine request ids of API calls start with this (dashboard, /api/kv)


def served_model_name(llm) -> str:
    """The model id clients must send: the model file or folder name (as /metrics labels it)."""
    base = os.path.basename(str(llm.model_source or "").rstrip("/"))
    return (base[:-5] if base.endswith(".gguf") else base) or "default"


def _endpoint_of(path: str) -> str:
    for suffix, name in (
        ("/chat/completions", "chat_completions"),
        ("/completions", "completions"),
        ("/models", "models"),
    ):
        if path.rstrip("/").endswith(suffix):
            return name
    return "other"


class _KeyCheck:
    """Pure ASGI middleware: 401 before the body is even parsed (a bad key never sees a 400).

    Wrong keys are throttled per client address like logins (routes/security/auth.LoginThrottle): after a
    few free failures an address waits 1, 2, 4 ... s (429 + Retry-After) before its next key is
    even checked, so keys cannot be guessed at line rate. A right key clears the address.
    Requests sent by another site's page (not an --allowed-origin) are refused with 403 first and
    count for nobody, so a page cannot get the local user's own key throttled (#29.6)."""

    def __init__(
        self,
        app,
        access: ApiAccess,
        metrics: ApiMetrics,
        throttle: LoginThrottle | None = None,
        allowed_origins=(),
    ):
        self.app, self.access, self.metrics = app, access, metrics
        self.throttle = throttle or LoginThrottle()
        self.allowed_origins = list(allowed_origins or ())

    async def __call__(self, scope, receive, send):
        reason = foreign_origin(scope, self.allowed_origins) if scope["type"] == "http" else None
        if reason and scope["method"] != "OPTIONS":
            self.metrics.count(_endpoint_of(scope.get("path", "")), 403)
            body = error_body(403, f"cross-site request refused: {reason}", code="cross_site")
            return await JSONResponse(body, status_code=403)(scope, receive, send)
        if scope["type"] == "http" and scope["method"] != "OPTIONS" and self.access.require_key:
            address = (scope.get("client") or ("?", 0))[0]
            wait = self.throttle.retry_after(KEY_THROTTLE_USER, address)
            try:
                if wait > 0:
                    raise APIError(
                        429,
                        f"too many requests with a wrong API key; try again in {wait:.0f} s",
                        code="rate_limit_exceeded",
                    )
                self.access.check(Headers(scope=scope))
            except APIError as e:
                if e.status == 401 and self.access.keys:
                    self.throttle.failed(KEY_THROTTLE_USER, address)
                self.metrics.count(_endpoint_of(scope.get("path", "")), e.status)
                headers = {"Retry-After": str(max(1, round(wait)))} if e.status == 429 else None
                await JSONResponse(e.body(), status_code=e.status, headers=headers)(
                    scope, receive, send
                )
                return
            self.throttle.succeeded(KEY_THROTTLE_USER, address)
        await self.app(scope, receive, send)


DEFAULT_API_PRIORITY = 1  # chat turns are 0: interactive first unless a call asks (--api-priority)


class OpenAIServer:
    def __init__(
        self,
        llm,
        *,
        model_name: str | None = None,
        max_pending: int | None = None,
        multi_user: bool = False,
        access: ApiAccess | None = None,
        default_priority: int = DEFAULT_API_PRIORITY,
    ):
        self.llm = llm
        self.access = access or ApiAccess(default_priority=default_priority)
        # one principal per key (issue 48.2): under --auth, or whenever several keys are configured
        # (each key holder is then someone else), every key has its own cache salt `api:NAME`
        self.multi_user = bool(multi_user) or len(self.access.keys) > 1
        self._model_name = model_name
        self.created = int(time.time())
        self.max_num_seqs = llm.config.max_num_seqs
        self.max_pending = max_pending if max_pending is not None else 2 * self.max_num_seqs
        self._fmt: tuple | None = None  # (tokenizer, LogprobFormatter) of the served model
        self.metrics = ApiMetrics()
        # fair scheduling: the waiting and in-flight bounds count each tenant (API key) on its own,
        # so one key that floods /v1 is refused, not every other key with it
        self.per_tenant = llm.config.scheduling_policy == "fair"
        self.admission = ApiAdmission(
            llm,
            self.metrics,
            max_pending=self.max_pending,
            max_num_seqs=self.max_num_seqs,
            per_tenant=self.per_tenant,
        )

    # ---- the model served now (an app with several models may switch: engine/front/model_host.py) --
    @property
    def model(self) -> str:
        return self._model_name or served_model_name(self.llm)

    @property
    def max_model_len(self) -> int:
        return self.llm.max_model_len

    @property
    def tokenizer(self):
        return self.llm.get_tokenizer()

    @property
    def reasoning_markers(self) -> tuple:
        """A thinking model's markers (engine/text/reasoning.py): replies split into reasoning_content."""
        return tuple(self.llm.model_info().reasoning_markers or ())

    @property
    def fmt(self) -> LogprobFormatter:
        tok = self.tokenizer
        if self._fmt is None or self._fmt[0] is not tok:
            self._fmt = (tok, LogprobFormatter(tok))
        return self._fmt[1]

    # ---- shared steps ------------------------------------------------------------------------------
    def _check_model(self, name: str) -> None:
        if name != self.model:
            raise APIError(
                404,
                f"the model '{name}' does not exist; this server serves '{self.model}'",
                param="model",
                code="model_not_found",
            )

    def salt_of(self, tenant: str):
        """The cache salt of a caller (engine/kv/salt_rule.py): its key's name, one per key."""
        return principal_salt("api", tenant if self.access.keys else "", multi_user=self.multi_user)

    def capacity_refusal(self, seqs: int, tenant: str) -> str | None:
        """Why `seqs` more sequences of `tenant` cannot start now, or None: the pre-parse gate's
        question (routes/security/request_limits.py), answered by the route's own rule."""
        return self.admission.refusal(seqs, tenant)

    def _admit(self, seqs: int, tenant: str = "api") -> None:
        self.admission.admit(seqs, tenant)

    def release(self, seqs: int, tenant: str, usage: dict | None = None) -> None:
        """Give back what _admit reserved (once per admitted call)."""
        self.admission.release(seqs, tenant, usage)

    def _submit(
        self,
        prompts: list[list[int]],
        params_list,
        cid: str,
        n: int,
        messages=None,
        tenant: str = "api",
        priority: int = DEFAULT_API_PRIORITY,
    ) -> Generation:
        subs = []
        try:
            for k, (ids, params) in enumerate(zip(prompts, params_list)):
                rid = f"{API_PREFIX}{cid}" if len(prompts) == 1 else f"{API_PREFIX}{cid}-{k}"
                salt = prompt_salt(self.tokenizer, messages, ids, self.salt_of(tenant))
                stream = self.llm.submit(
                    {"prompt_token_ids": ids},
                    params,
                    request_id=rid,
                    cache_salt=salt,
                    tenant=tenant,
                    priority=priority,
                )
                subs.append(Submitted(stream, len(ids), k * n))
        except QueueFull as e:  # an admission bound (--max-queued-requests / -tokens)
            self._abort_subs(subs)
            raise APIError(
                429,
                f"the server is busy: {e}; retry in {e.retry_after_s} s",
                code="queue_full",
                headers={"Retry-After": str(e.retry_after_s)},
            ) from e
        except ValueError as e:
            self._abort_subs(subs)
            raise APIError(400, str(e), code="invalid_value") from e
        except RuntimeError as e:
            self._abort_subs(subs)
            raise APIError(
                503, f"the engine is not available: {e}", code="engine_unavailable"
            ) from e
        return Generation(self.llm, subs, n)

    def _abort_subs(self, subs) -> None:
        """A later prompt of the call was refused: the earlier ones must not run for nobody."""
        if subs:
            Generation(self.llm, subs, 1).abort()

    async def _run(
        self,
        endpoint: str,
        request: Request,
        body,
        prompts: list[list[int]],
        cid: str,
        render,
        messages=None,
        structured=None,
    ):
        """Admit, submit, then either stream (render.chunks) or collect and answer (render.final).
        A constraint is compiled first in a worker thread (cached), so neither the event loop nor
        the engine's step loop waits for it."""
        params = [
            to_sampling_params(body, len(ids), self.max_model_len, structured) for ids in prompts
        ]
        if structured is not None:
            try:
                await asyncio.to_thread(self.llm.compile_structured, structured)
            except ValueError as e:
                param = "tools" if getattr(body, "tools", None) else "response_format"
                raise APIError(400, str(e), param=param, code="invalid_value") from e
        seqs = len(prompts) * body.n
        tenant = self.access.tenant_of(request.headers)
        priority = effective_priority(body.priority, self.access.priority_class(tenant))  # 48.1
        self._admit(seqs, tenant)
        try:
            gen = self._submit(prompts, params, cid, body.n, messages, tenant, priority)
        except BaseException:
            self.release(seqs, tenant)
            raise
        if body.stream:
            self.metrics.count(endpoint, 200)
            ender = _StreamEnd(gen, self, seqs, tenant)
            return _EngineStream(
                self._stream(gen, body, render, ender),
                ender,
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        watcher = asyncio.create_task(watch_disconnect(request, gen))
        try:
            await gen.collect()
        except BaseException:
            gen.abort()
            self.release(seqs, tenant)
            raise
        finally:
            watcher.cancel()
        usage = gen.usage()
        self.release(seqs, tenant, usage)
        err = gen.error()
        if err:
            status = 503 if "shut down" in err else 500
            self.metrics.count(endpoint, status)
            return JSONResponse(error_body(status, f"generation failed: {err}"), status_code=status)
        self.metrics.count(endpoint, 499 if gen.disconnected else 200)
        return JSONResponse(render.final(cid, gen, usage))

    async def _stream(self, gen: Generation, body, render, ender: "_StreamEnd"):
        created = int(time.time())
        try:
            for chunk in render.opening(created, gen):
                yield sse(chunk)
            async for i, d in gen.deltas():
                if d.error:
                    yield sse(
                        error_body(
                            503 if "shut down" in d.error else 500, f"generation failed: {d.error}"
                        )
                    )
                    continue
                for chunk in render.chunks(created, gen, i, d):
                    yield sse(chunk)
            ender.usage = gen.usage()
            if body.include_usage:
                yield sse(render.usage_chunk(created, ender.usage))
            yield DONE
        finally:
            ender()  # a client that left mid-stream: free its blocks now

    # ---- endpoints ---------------------------------------------------------------------------------
    def models(self) -> dict:
        others = (
            [
                c.name.removesuffix(".gguf")
                for c in self.llm.loadable_models()
                if c.name != self.llm.current_model()
            ]
            if isinstance(self.llm, SwitchesModels)
            else []
        )
        return S.model_list(self.model, self.created, self.max_model_len, loadable=others)

    async def chat(self, body: S.ChatCompletionRequest, request: Request):
        self._check_model(body.model)
        tools = openai_tools.plan(body)
        spec, tool_spec = structured_spec(body), tools.spec() if tools else None
        if spec is not None and tool_spec is not None:
            raise APIError(
                400,
                "response_format / structured_outputs cannot be combined with tools unless "
                "tool_choice is 'none'",
                param="response_format",
                code="invalid_value",
            )
        mode = dict(
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            enable_thinking=body.enable_thinking(),
            reasoning_effort=body.effort(),
        )
        try:
            messages = openai_tools.template_messages(body, tools)
            ids = await asyncio.to_thread(
                continue_session_prompt, self.tokenizer, messages, None, **mode
            )
        except ValueError as e:
            raise APIError(400, str(e), param="messages", code="invalid_value") from e
        cid = S.new_id("chatcmpl")
        thinking = ReasoningSplit.of(
            self.tokenizer, self.reasoning_markers, ids
        )  # None: not a thinking model
        return await self._run(
            "chat_completions",
            request,
            body,
            [ids],
            cid,
            ChatRender(self, body, cid, tools if tools and tools.parses else None, thinking),
            messages=messages,
            structured=spec or tool_spec,
        )

    async def completions(self, body: S.CompletionRequest, request: Request):
        self._check_model(body.model)
        prompts = []
        for p in body.prompts():
            try:
                prompts.append(await asyncio.to_thread(self.llm.encode_prompt, p))
            except ValueError as e:
                raise APIError(400, str(e), param="prompt", code="invalid_value") from e
        if body.echo and body.stream:
            raise APIError(
                400, "echo: not supported with stream", param="echo", code="invalid_value"
            )
        cid = S.new_id("cmpl")
        return await self._run(
            "completions",
            request,
            body,
            prompts,
            cid,
            CompletionRender(self, body, cid, prompts),
            structured=structured_spec(body),
        )


class _StreamEnd:
    """Runs once, whichever comes first: the SSE generator ends, or the response ends without the
    generator ever running (client gone before the first chunk): abort what is left, release slots."""

    def __init__(self, gen: Generation, srv: "OpenAIServer", seqs: int, tenant: str):
        self.gen, self.srv, self.seqs, self.tenant = gen, srv, seqs, tenant
        self.usage: dict | None = None
        self._done = False

    def __call__(self) -> None:
        if self._done:
            return
        self._done = True
        self.gen.abort()
        self.srv.release(self.seqs, self.tenant, self.usage)


class _EngineStream(StreamingResponse):
    def __init__(self, content, ender: _StreamEnd, **kw):
        super().__init__(content, **kw)
        self._ender = ender

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._ender()


def create_openai_app(
    llm,
    *,
    api_keys: list[str] | None = None,
    require_key: bool = False,
    allowed_origins: list[str] | None = None,
    max_pending: int | None = None,
    model_name: str | None = None,
    multi_user: bool = False,
    default_priority: int = DEFAULT_API_PRIORITY,
) -> FastAPI:
    """The /v1 sub-application (mount it with `mount_openai_api`, or serve it alone in tests).
    multi_user: the app has logins (--auth), so API calls get their own cache salt (as do
    several keys).
    api_keys: "KEY", "NAME:KEY" or "NAME:KEY:PRIORITY" (the name is the caller's tenant for fair
    scheduling and its cache salt; PRIORITY its class, else default_priority: --api-priority)."""
    access = ApiAccess(api_keys, require_key=require_key, default_priority=default_priority)
    srv = OpenAIServer(
        llm,
        model_name=model_name,
        max_pending=max_pending,
        multi_user=multi_user,
        access=access,
        default_priority=default_priority,
    )
    app = FastAPI(
        title="Paged Chat OpenAI-compatible API", docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.server = srv
    install_error_handlers(app)

    @app.get("/models")
    def models():
        srv.metrics.count("models", 200)
        return srv.models()

    @app.post("/chat/completions")
    async def chat_completions(body: S.ChatCompletionRequest, request: Request):
        return await _counted(srv, "chat_completions", srv.chat(body, request))

    @app.post("/completions")
    async def completions(body: S.CompletionRequest, request: Request):
        return await _counted(srv, "completions", srv.completions(body, request))

    app.add_middleware(
        RequestLimits, server=srv
    )  # caps before parsing (routes/security/request_limits.py)
    app.add_middleware(
        _KeyCheck, access=access, metrics=srv.metrics, allowed_origins=allowed_origins
    )
    add_cors(app, allowed_origins)  # outermost: answers preflights before the key check
    return app


async def _counted(srv: OpenAIServer, endpoint: str, call):
    try:
        return await call
    except APIError as e:
        srv.metrics.count(endpoint, e.status)
        raise


def mount_openai_api(app: FastAPI, llm, **kw) -> FastAPI:
    """Serve the API at /v1 of `app` (call before Gradio is mounted at '/') and add its counters
    to the app's /metrics text via `app.state.extra_metrics`."""
    api = create_openai_app(llm, **kw)
    app.mount("/v1", api)
    extra = getattr(app.state, "extra_metrics", None)
    if extra is None:
        extra = app.state.extra_metrics = []
    extra.append(api.state.server.metrics.prometheus_text)
    return api
