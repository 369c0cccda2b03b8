"""System prompt presets (issue 11 item 6): pick a built-in or one of your own saved prompts, see
how many tokens it is and how many blocks every new chat will share, save your own by name.

Why separate from the chat layout: it only fills the shared-prompt textbox; saving the shared
prompt (and pinning it) stays the existing "Save for new chats" button (ui/chat/sidebar.py).
"""

from __future__ import annotations

import gradio as gr

from storage.presets import PRESETS

MINE = "mine: "  # prefix of a user's own saved prompts in the picker


def _choices(ctx, owner: str) -> list[str]:
    return list(PRESETS) + [MINE + p["name"] for p in ctx.storage.named_prompts(owner)]


def _text_of(ctx, owner: str, choice: str) -> str | None:
    if choice in PRESETS:
        return PRESETS[choice]
    if choice and choice.startswith(MINE):
        name = choice[len(MINE) :]
        return next(
            (p["text"] for p in ctx.storage.named_prompts(owner) if p["name"] == name), None
        )
    return None


def build_prompt_picker(ctx, shared_prompt: gr.Textbox) -> gr.Markdown:
    """Create the picker under the shared-prompt box (inside the current Blocks context); returns
    its hint line, which the app clears once "Save for new chats" has been pressed."""
    with gr.Row():
        picker = gr.Dropdown(
            choices=list(PRESETS),
            value=None,
            label="Presets",
            scale=2,
            elem_id="prompt-presets",
            allow_custom_value=False,
        )
        name = gr.Textbox(
            label="Save the box as my preset named", scale=2, elem_id="prompt-save-name"
        )
        save = gr.Button("Save preset", size="sm", scale=1, elem_id="prompt-save-preset")
    info = gr.Markdown(elem_id="prompt-preset-info")

    def describe(text: str) -> str:
        pins = ctx.pins
        return pins.describe(text) if pins is not None and (text or "").strip() else ""

    def on_pick(choice, request: gr.Request):
        text = _text_of(ctx, ctx.owner(request), choice)
        if text is None:
            return gr.skip(), gr.skip()
        return text, describe(text) + " — press “Save for new chats” to use it."

    def on_save(preset_name, text, request: gr.Request):
        owner = ctx.owner(request)
        try:
            ctx.storage.save_named_prompt(owner, preset_name or "", text or "")
        except ValueError as e:
            gr.Warning(str(e))
            return gr.skip(), gr.skip()
        gr.Info(f"Saved your preset “{preset_name.strip()}”.")
        return gr.update(choices=_choices(ctx, owner)), describe(text)

    def on_open(request: gr.Request):
        return gr.update(choices=_choices(ctx, ctx.owner(request)))

    quick = dict(concurrency_limit=None, show_progress="hidden", api_visibility="private")
    picker.input(on_pick, picker, [shared_prompt, info], **quick)
    save.click(on_save, [name, shared_prompt], [picker, info], **quick)
    picker.focus(on_open, None, picker, **quick)
    return info
