"""The chat page's model picker (issue 45, item 5): which model the app serves, and a switch.

Why on the chat page: the model is what a person chats with; the Memory tab then shows the new
pool. A switch changes the model for everyone using this app, so under --auth only an --admin may
make it (others see the model and the choices, disabled). The engine side is
engine/front/model_host.ModelHost (the `SwitchesModels` ability): the old model serves until the new
one is ready; a model that cannot load is refused in plain words and the running one keeps serving.
The picker is shown only when the app has more than one model to offer.
"""
from __future__ import annotations

import asyncio

import gradio as gr

from engine.protocol import SwitchesModels
from ui.chat.context import ChatContext


def model_line(ctx: ChatContext) -> str:
    """'Model **X** · context N tokens (prompt + reply) · KV blocks of B tokens' (the chat's header)."""
    info = ctx.llm.model_info()
    blocks = (f"KV blocks of {info.block_size} tokens" if info.block_size else
              "KV block size: not reported by the backend")      # --backend without it in /metrics
    return f"Model **{info.name}** · context {ctx.max_model_len:,} tokens (prompt + reply) · {blocks}"


def choices(ctx: ChatContext) -> list[str]:
    return [c.name for c in ctx.llm.loadable_models()] if isinstance(ctx.llm, SwitchesModels) else []


def build(ctx: ChatContext) -> dict:
    """The picker and its status line (hidden with one model); {name: component}."""
    names = choices(ctx)
    shown = len(names) > 1
    with gr.Row(visible=shown, elem_id="model-row"):
        picker = gr.Dropdown(names, value=ctx.llm.current_model() if shown else None, label="Model",
                             info="Switching loads the other model for everyone using this app; "
                                  "conversations stay, their KV blocks are dropped.",
                             elem_id="model-picker", scale=3)
        note = gr.Markdown(" ", elem_id="model-switch-status")
    return {"model_picker": picker, "model_note": note}


def may_switch(ctx: ChatContext, request) -> bool:
    return not ctx.auth or ctx.owner(request) in ctx.admins


def wire(ctx: ChatContext, c: dict) -> None:
    """Picking a model switches the app to it, with a progress line; the header follows."""
    if len(choices(ctx)) <= 1:
        return

    async def switch(name, request: gr.Request = None, progress=gr.Progress()):
        current = ctx.llm.current_model()
        if not name or name == current:
            return gr.update(value=current), gr.update(), gr.update()
        if not may_switch(ctx, request):
            return (gr.update(value=current), gr.update(),
                    "Only an admin of this app may switch the model (it changes it for everyone).")
        progress(0.0, desc=f"Loading {name}…")
        try:
            line = await asyncio.to_thread(ctx.llm.switch_model, name,
                                           lambda f, m: progress(f, desc=f"Loading {name}: {m}"))
        except (ValueError, RuntimeError) as e:      # ModelLoadError is a ValueError: said, not raised
            return gr.update(value=current), gr.update(), f"{name} was not loaded: {e}. Still serving {current}."
        return gr.update(value=name), model_line(ctx), line[0].upper() + line[1:] + "."

    c["model_picker"].input(switch, [c["model_picker"]], [c["model_picker"], c["model_head"], c["model_note"]],
                            concurrency_limit=1, show_progress="full")
