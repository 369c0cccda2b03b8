"""The chat page's model picker (issue 45, item 5): which model the app serves, and a switch.

Why on the chat page: the model is what a person chats with; the Memory tab then shows the new
pool. A switch changes the model for everyone using this app, so under --auth only an --admin may
make it (others see the model and the choices, disabled). The engine side is
engine/front/model_host.ModelHost (the `SwitchesModels` ability): the old model serves until the new
one is ready; a model that cannot load is refused in plain words and the running one keeps serving.
The picker is shown only when the app has more than one model to offer.

What a switch shows: the status line says at once which model is loading and that the current one
keeps serving (a load takes from a second to minutes), Gradio's progress bar follows the loader's
steps, and at the end the header names the new model and its pool (blocks, tokens, bytes), the line
says what the pool holds, and the "Think" switch appears or goes with the new model's template.
Other tabs follow on their next tick (`follow_model`): their header, picker and switch change too.
"""

from __future__ import annotations

import asyncio

import gradio as gr

from engine.protocol import ReportsStats, SwitchesModels
from ui.chat.context import ChatContext
from ui.dashboard.kv_math import fmt_bytes


def pool_words(stats: dict) -> str:
    """'KV pool 1,024 blocks of 16 tokens (16,384 tokens, 12.0 MiB)': the pool the header names."""
    blocks, bs = stats["total_blocks"], stats["block_size"]
    size = (
        fmt_bytes(blocks * stats["kv_bytes_per_block"]) if stats.get("kv_bytes_per_block") else ""
    )
    groups = stats.get("num_groups", 1)
    if groups > 1:  # a block holds one group's layers: a token takes a slot in each group
        size = f"{size}; " if size else ""
        return f"KV pool {blocks:,} blocks of {bs} tokens ({size}{groups} KV cache groups)"
    return (
        f"KV pool {blocks:,} blocks of {bs} tokens ({blocks * bs:,} tokens"
        + (f", {size}" if size else "")
        + ")"
    )


def model_line(ctx: ChatContext) -> str:
    """'Model **X** · context N tokens (prompt + reply) · KV pool B blocks of 16 tokens (...)' (the
    chat's header); a backend without stats names its block size only."""
    info = ctx.llm.model_info()
    if isinstance(ctx.llm, ReportsStats):
        blocks = pool_words(ctx.llm.stats())
    else:
        blocks = (
            f"KV blocks of {info.block_size} tokens"
            if info.block_size
            else "KV block size: not reported by the backend"
        )  # --backend without it in /metrics
    return (
        f"Model **{info.name}** · context {ctx.max_model_len:,} tokens (prompt + reply) · {blocks}"
    )


def choices(ctx: ChatContext) -> list[str]:
    return (
        [c.name for c in ctx.llm.loadable_models()] if isinstance(ctx.llm, SwitchesModels) else []
    )


def build(ctx: ChatContext) -> dict:
    """The picker and its status line (hidden with one model); {name: component}."""
    names = choices(ctx)
    shown = len(names) > 1
    with gr.Row(visible=shown, elem_id="model-row"):
        picker = gr.Dropdown(
            names,
            value=ctx.llm.current_model() if shown else None,
            label="Model",
            info="Switching loads the other model for everyone using this app; "
            "conversations stay, their KV blocks are dropped.",
            elem_id="model-picker",
            scale=3,
        )
        note = gr.Markdown(" ", elem_id="model-switch-status")
    return {"model_picker": picker, "model_note": note}


def may_switch(ctx: ChatContext, request) -> bool:
    return not ctx.auth or ctx.owner(request) in ctx.admins


def refused(name: str, error: Exception, current: str) -> str:
    """A model that did not load, in plain words: what, why, and that nothing changed."""
    why = str(error).strip().rstrip(".") or type(error).__name__
    return f"**{name} was not loaded:** {why}. Still serving {current}."


def loading(name: str, current: str) -> str:
    return f"Loading **{name}**… {current} keeps serving until it is ready."


def switched_line(ctx: ChatContext, host_line: str) -> str:
    """After a switch: 'Now serving beta: KV pool ... · context 4,096 tokens.' (the host's own
    sentence for an engine without stats)."""
    if not isinstance(ctx.llm, ReportsStats):
        return host_line[0].upper() + host_line[1:] + "."
    pool = pool_words(ctx.llm.stats())
    name = ctx.llm.current_model()
    return f"Now serving **{name}**: {pool}, context {ctx.max_model_len:,} tokens."


def served(ctx: ChatContext) -> str:
    """The model served now, as the tick compares it ('' for an engine that cannot switch)."""
    return ctx.llm.current_model() if isinstance(ctx.llm, SwitchesModels) else ""


def follow_model(ctx: ChatContext, tab) -> tuple:
    """For a tab's tick: (header, picker, Think switch) when the served model changed since the
    tab last showed it (another tab switched it), else gr.skip() for each."""
    now = served(ctx)
    if tab.model_seen is None:
        tab.model_seen = now
    if now == tab.model_seen:
        return gr.skip(), gr.skip(), gr.skip()
    tab.model_seen = now
    return model_line(ctx), gr.update(value=now), gr.update(visible=ctx.thinking_switch)


def wire(ctx: ChatContext, c: dict) -> None:
    """Picking a model switches the app to it, with a progress line; the header follows."""
    if len(choices(ctx)) <= 1:
        return
    outs = [c["model_picker"], c["model_head"], c["model_note"], c["think"]]

    async def switch(name, request: gr.Request = None, progress=gr.Progress()):
        current = ctx.llm.current_model()
        tab = ctx.tab(request) if request is not None else None
        if not name or name == current:
            yield gr.update(value=current), gr.skip(), gr.skip(), gr.skip()
            return
        if not may_switch(ctx, request):
            yield (
                gr.update(value=current),
                gr.skip(),
                "Only an admin of this app may switch the model (it changes it for everyone).",
                gr.skip(),
            )
            return
        yield gr.update(interactive=False), gr.skip(), loading(name, current), gr.skip()
        progress(0.0, desc=f"Loading {name}…")
        try:
            line = await asyncio.to_thread(
                ctx.llm.switch_model, name, lambda f, m: progress(f, desc=f"Loading {name}: {m}")
            )
        except (
            ValueError,
            RuntimeError,
            OSError,
        ) as e:  # ModelLoadError is a ValueError: said, not raised
            yield (
                gr.update(value=current, interactive=True),
                gr.skip(),
                refused(name, e, current),
                gr.skip(),
            )
            return
        if tab is not None:
            tab.model_seen = ctx.llm.current_model()
        yield (
            gr.update(value=name, interactive=True),
            model_line(ctx),
            switched_line(ctx, line),
            gr.update(visible=ctx.thinking_switch),
        )

    c["model_picker"].input(
        switch, [c["model_picker"]], outs, concurrency_limit=1, show_progress="full"
    )
