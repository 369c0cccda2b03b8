"""GET /metrics (Prometheus text, vLLM metric names where one exists) and GET /api/kv (the KV
snapshot in its versioned JSON form, engine/observe/kv_contract.py; documented in docs/DESIGN.md).

Existing vLLM Grafana dashboards read `vllm:*` with a `model_name` label; our own block and
sharing gauges are `paged_chat_*`. Both endpoints read `LLM.latest_snapshot()` (one on-demand
snapshot shared per 0.25 s by every caller); `/api/kv?fresh=1` asks for an exact one.
"""

from __future__ import annotations

from fastapi import Request  # module level: the route's annotation is resolved from here

from engine.protocol import ChatEngine, ServesSnapshotForms
from engine.observe.savings import sharing_savings

# (name, type, help, value from (stats, extra)); vLLM names first
_VLLM = (
    (
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        lambda s, x: s["used_blocks"] / s["total_blocks"],
    ),
    (
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        lambda s, x: s["prefix_cache_queries"],
    ),
    (
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        lambda s, x: s["prefix_cache_hits"],
    ),
    (
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemptions from the engine.",
        lambda s, x: s["num_preemptions"],
    ),
    (
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        lambda s, x: s["running"],
    ),
    (
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        lambda s, x: s["waiting"],
    ),
    (
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        lambda s, x: s.get("generated_tokens_total", 0),
    ),
    # speculative decoding (engine/core/speculation.py); 0 with --speculative off
    (
        "vllm:spec_decode_num_drafts_total",
        "counter",
        "Number of spec decoding drafts.",
        lambda s, x: s.get("spec_num_drafts", 0),
    ),
    (
        "vllm:spec_decode_num_draft_tokens_total",
        "counter",
        "Number of draft tokens.",
        lambda s, x: s.get("spec_draft_tokens", 0),
    ),
    (
        "vllm:spec_decode_num_accepted_tokens_total",
        "counter",
        "Number of accepted tokens.",
        lambda s, x: s.get("spec_accepted_tokens", 0),
    ),
)
_OWN = (
    ("paged_chat_kv_blocks_total", "gauge", "Physical KV blocks in the pool.", "total_blocks"),
    (
        "paged_chat_kv_blocks_used",
        "gauge",
        "Physical KV blocks held (ref_count >= 1).",
        "used_blocks",
    ),
    (
        "paged_chat_kv_blocks_free",
        "gauge",
        "Free KV blocks (including cached-free).",
        "free_blocks",
    ),
    (
        "paged_chat_kv_blocks_cached",
        "gauge",
        "Free blocks still holding a reusable cached prefix.",
        "cached_blocks",
    ),
    (
        "paged_chat_kv_blocks_shared",
        "gauge",
        "Blocks held by 2 or more chats, not pinned (ref_count >= 2; pinned blocks count as pinned).",
        "shared_blocks",
    ),
    (
        "paged_chat_kv_blocks_pinned",
        "gauge",
        "Blocks held by the app's pins of shared system prompts (never evicted).",
        "pinned_blocks",
    ),
    (
        "paged_chat_kv_blocks_peak_used",
        "gauge",
        "Highest number of used blocks so far.",
        "peak_used_blocks",
    ),
    (
        "paged_chat_kv_blocks_logical",
        "gauge",
        "Block-table entries over live sequences: blocks paging without sharing would hold.",
        "logical_blocks",
    ),
    (
        "paged_chat_kv_blocks_saved_by_sharing",
        "gauge",
        "Saved by sharing: block-table entries of the live chats (what paging without sharing would "
        "hold) minus the blocks they hold.",
        "saved_blocks",
    ),
    (
        "paged_chat_kv_bytes_saved_by_sharing",
        "gauge",
        "Bytes of KV saved by block sharing.",
        "saved_bytes",
    ),
    ("paged_chat_kv_block_size_tokens", "gauge", "Tokens per KV block.", "block_size"),
    (
        "paged_chat_kv_capacity_tokens",
        "gauge",
        "Tokens the KV pool can hold.",
        "kv_capacity_tokens",
    ),
    (
        "paged_chat_kv_used_tokens",
        "gauge",
        "Token slots holding valid KV in used blocks.",
        "used_tokens",
    ),
    ("paged_chat_kv_free_tokens", "gauge", "Token slots in free blocks.", "free_tokens"),
    (
        "paged_chat_kv_internal_fragmentation_tokens",
        "gauge",
        "Allocated but unfilled token slots (last blocks).",
        "internal_fragmentation_tokens",
    ),
    (
        "paged_chat_kv_bytes_per_token",
        "gauge",
        "KV bytes per token in the pool's format (2 x layers x KV "
        "heads x row bytes; int8/fp8 rows carry a 4-byte scale).",
        "kv_bytes_per_token",
    ),
    (
        "paged_chat_kv_weights_dtype_bytes_per_token",
        "gauge",
        "KV bytes per token the weights' dtype would "
        "take (compare with paged_chat_kv_bytes_per_token).",
        "weights_kv_bytes_per_token",
    ),
    ("paged_chat_kv_bytes_per_block", "gauge", "KV bytes per block.", "kv_bytes_per_block"),
    ("paged_chat_kv_bytes_total", "gauge", "KV pool size in bytes.", "pool_bytes"),
    ("paged_chat_kv_bytes_used", "gauge", "Bytes of the KV pool in used blocks.", "used_bytes"),
    (
        "paged_chat_kv_savings_vs_unshared_ratio",
        "gauge",
        "1 - used blocks / blocks paging without sharing would hold.",
        "savings_vs_unshared",
    ),
    (
        "paged_chat_kv_savings_vs_contiguous_ratio",
        "gauge",
        "1 - used blocks / blocks contiguous max_model_len pre-allocation would hold.",
        "savings_vs_contiguous",
    ),
    (
        "paged_chat_kv_groups",
        "gauge",
        "KV cache groups (layers of one attention kind share one).",
        "num_groups",
    ),
    (
        "paged_chat_kv_window_released_blocks_total",
        "counter",
        "Blocks sliding-window groups gave back once no query could read them.",
        "window_released_blocks",
    ),
    (
        "paged_chat_kv_savings_vs_full_attention_ratio",
        "gauge",
        "1 - used blocks / blocks the live tables would hold without sliding windows.",
        "savings_vs_full_attention",
    ),
    ("paged_chat_sequences_running", "gauge", "Live sequences holding blocks.", "num_sequences"),
    (
        "paged_chat_sessions_idle",
        "gauge",
        "Idle chat sessions pinning their blocks between turns.",
        "num_idle_sessions",
    ),
    (
        "paged_chat_requests_running_peak",
        "gauge",
        "Highest number of running requests so far.",
        "peak_running",
    ),
    (
        "paged_chat_prompt_tokens_computed_total",
        "counter",
        "Prompt tokens prefilled (cache misses).",
        "prompt_tokens_computed_total",
    ),
    ("paged_chat_engine_steps_total", "counter", "Engine iterations run.", "steps"),
    (
        "paged_chat_spec_rollbacks_total",
        "counter",
        "Speculative steps that gave the slots of rejected draft tokens back to the pool.",
        "spec_rollbacks",
    ),
    (
        "paged_chat_spec_rolled_back_slots_total",
        "counter",
        "KV slots of rejected draft tokens rolled back.",
        "spec_rolled_back_slots",
    ),
    # the second KV tier (engine/kv/tier/store.py; KV contract v6); all 0 without a tier
    (
        "paged_chat_kv_tier_blocks",
        "gauge",
        "KV blocks held by the second tier (disk or host memory).",
        "tier_blocks",
    ),
    ("paged_chat_kv_tier_bytes", "gauge", "Bytes held by the second KV tier.", "tier_bytes"),
    (
        "paged_chat_kv_tier_capacity_bytes",
        "gauge",
        "Capacity of the second KV tier (0: off).",
        "tier_capacity_bytes",
    ),
    (
        "paged_chat_kv_tier_hits_blocks_total",
        "counter",
        "Blocks read back from the KV tier.",
        "tier_hits_blocks",
    ),
    (
        "paged_chat_kv_tier_loaded_tokens_total",
        "counter",
        "Prompt tokens served by KV-tier loads instead of computed (included in prefix cache hits).",
        "tier_loaded_tokens",
    ),
    (
        "paged_chat_kv_tier_writes_blocks_total",
        "counter",
        "Blocks written to the KV tier (all reasons).",
        "tier_writes_blocks",
    ),
    (
        "paged_chat_kv_tier_writebacks_blocks_total",
        "counter",
        "Blocks written back when the pool evicted them.",
        "tier_writebacks_blocks",
    ),
    (
        "paged_chat_kv_tier_swapouts_blocks_total",
        "counter",
        "Blocks written when their sequence was preempted.",
        "tier_swapouts_blocks",
    ),
    (
        "paged_chat_kv_tier_dropped_corrupt_total",
        "counter",
        "KV-tier entries dropped because their checksum or identity check failed.",
        "tier_dropped_corrupt",
    ),
    (
        "paged_chat_kv_tier_restored_blocks",
        "gauge",
        "KV-tier blocks found at start-up (warm restart).",
        "tier_restored_blocks",
    ),
    (
        "paged_chat_swap_preemptions_total",
        "counter",
        "Preemptions that swapped blocks out instead of dropping them.",
        "swap_preemptions",
    ),
    (
        "paged_chat_tokens_recomputed_after_preempt_total",
        "counter",
        "Computed tokens preemptions dropped (to be recomputed).",
        "tokens_recomputed_after_preempt",
    ),
)


def _num(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    return repr(float(v))


def _label(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus_text(snap: dict, model_name: str = "") -> str:
    """Prometheus exposition format 0.0.4 for one snapshot."""
    st = snap["stats"]
    sav = sharing_savings(snap)
    extra = dict(
        st,
        saved_blocks=sav["saved_blocks"],
        saved_bytes=sav["saved_bytes"],
        free_tokens=st["free_blocks"] * st["block_size"],
        pool_bytes=st["total_blocks"] * st["kv_bytes_per_block"],
        used_bytes=st["used_blocks"] * st["kv_bytes_per_block"],
    )
    labels = f'{{model_name="{_label(model_name)}"}}' if model_name else ""
    lines = []
    for name, kind, help_, fn in _VLLM:
        lines += [
            f"# HELP {name} {help_}",
            f"# TYPE {name} {kind}",
            f"{name}{labels} {_num(fn(st, extra))}",
        ]
    for name, kind, help_, key in _OWN:
        if key in extra:
            lines += [
                f"# HELP {name} {help_}",
                f"# TYPE {name} {kind}",
                f"{name} {_num(extra[key])}",
            ]
    if st.get("kv_cache_dtype"):  # the pool's format as a label (Prometheus' info-metric idiom)
        lines += [
            "# HELP paged_chat_kv_cache_dtype_info The KV pool's format (--kv-cache-dtype), as a label.",
            "# TYPE paged_chat_kv_cache_dtype_info gauge",
            f'paged_chat_kv_cache_dtype_info{{kv_cache_dtype="{_label(st["kv_cache_dtype"])}"}} 1',
        ]
    return "\n".join(lines) + "\n"


def model_name_of(llm) -> str:
    return llm.model_info().name if isinstance(llm, ChatEngine) else ""


def register_routes(
    app, llm, *, kv_route: bool = True, auth: bool = False, tenant_viewer=None
) -> None:
    """Add GET /metrics and GET /api/kv to a FastAPI app (call before mounting Gradio at '/').
    kv_route=False: the app registers its viewer-scoped /api/kv itself (routes/kv.py).
    Under --auth (auth=True) the per-tenant lines go only to requests `tenant_viewer(request)`
    accepts (an --admin login, the --metrics-token; server/assembly.py); everyone else gets the
    aggregates (issue 48.6: from a user's own label and the other's token counts and times, one
    user could read the length and time of each message of another)."""
    from fastapi.responses import JSONResponse, PlainTextResponse

    name = model_name_of(llm)
    # /metrics reads only "stats": the compact form spares a per-block build at GPU pool sizes
    compact = {"compact": True} if isinstance(llm, ServesSnapshotForms) else {}

    from routes.tenant_metrics import tenant_metrics_source

    tenants = tenant_metrics_source(llm, anonymous_users=auth)  # per-tenant lines, bounded labels

    def sees_tenants(request) -> bool:
        if tenants is None:
            return False
        return not auth or (tenant_viewer is not None and bool(tenant_viewer(request)))

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> PlainTextResponse:
        extra = "".join(
            f() for f in getattr(app.state, "extra_metrics", ())
        )  # e.g. the /v1 API's counters
        if sees_tenants(request):
            extra += tenants()
        return PlainTextResponse(
            prometheus_text(llm.latest_snapshot(**compact), name) + extra,
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    if not kv_route:
        return

    @app.get("/api/kv")
    def api_kv(fresh: bool = False) -> JSONResponse:
        snap = llm.snapshot() if fresh else llm.latest_snapshot()
        return JSONResponse(snap)  # already the versioned JSON form (KVSnapshot.to_json)
