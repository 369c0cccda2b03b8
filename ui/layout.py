"""The page: sidebar (conversations), Chat tab, Memory tab (dashboard).

`build_demo(ctx)` builds the Gradio Blocks and `page_css()` its style sheet; the server
(server/assembly.py) mounts them on FastAPI next to /metrics, /api/kv and /v1. What the controls do
when used is wired in ui/events.py.
"""

from __future__ import annotations

import gradio as gr

from ui.chat import (
    beam,
    context_meter,
    documents,
    model_picker,
    reply_format,
    shortcuts,
    tab_goodbye,
    thinking,
    view,
)
from ui.chat.context import ChatContext
from ui.chat.prompt_picker import build_prompt_picker
from ui.dashboard.page import build_dashboard
from ui.dashboard.panels import THEME_CSS
from ui.dashboard.timers import wire_memory_tab
from ui.events import wire
from ui.page_assets import CSS, LIST_REFRESH_MEMORY_TAB_S, LIST_REFRESH_S


def _sampling_controls(llm):
    with gr.Accordion("Sampling", open=False, elem_id="sampling"):
        # short labels (a long one wrapped onto five lines in a narrow column); what a setting
        # means is its `info` line
        with gr.Row():
            temperature = gr.Slider(
                0.0,
                2.0,
                value=0.7,
                step=0.05,
                label="Temperature",
                info="0 = greedy",
                elem_id="temperature",
                min_width=180,
            )
            top_p = gr.Slider(
                0.05, 1.0, value=0.95, step=0.05, label="Top-p", elem_id="top-p", min_width=180
            )
            top_k = gr.Slider(
                0,
                200,
                value=0,
                step=1,
                label="Top-k",
                info="0 = off",
                elem_id="top-k",
                min_width=180,
            )
            max_tokens = gr.Slider(
                1,
                min(2048, llm.max_model_len - 1),
                value=256,
                step=1,
                label="Max new tokens",
                elem_id="max-tokens",
                min_width=180,
            )
        with gr.Row():
            rep = gr.Slider(
                0.8,
                2.0,
                value=1.1,
                step=0.01,
                label="Repetition penalty",
                elem_id="rep-penalty",
                min_width=180,
            )
            seed = gr.Number(
                value=-1,
                precision=0,
                label="Seed",
                info="-1 = random",
                elem_id="seed",
                min_width=140,
            )
            n = gr.Slider(
                1,
                view.MAX_ALTERNATIVES,
                value=1,
                step=1,
                label="Alternatives",
                info="n replies side by side, sharing the prompt's blocks",
                elem_id="n-alternatives",
                min_width=180,
            )
            decoding = gr.Dropdown(
                beam.CHOICES,
                value=beam.SAMPLE,
                label="Decoding",
                info="beam search: the k best replies side by side",
                elem_id="decoding",
                min_width=180,
            )
        with gr.Row():
            fmt = gr.Dropdown(
                reply_format.CHOICES,
                value=reply_format.FREE,
                label="Reply format",
                info="JSON: constrained decoding, token by token",
                elem_id="reply-format",
            )
            schema = gr.Textbox(
                "",
                label="JSON schema",
                info="for \"JSON matching a schema\"",
                lines=2,
                max_lines=10,
                elem_id="reply-schema",
            )
    return [temperature, top_p, top_k, max_tokens, rep, seed, n, decoding, fmt, schema]


def build_demo(ctx: ChatContext) -> gr.Blocks:
    with gr.Blocks(title="Paged chat") as demo:
        c = _sidebar()
        gr.HTML(shortcuts.overlay_html(), elem_id="shortcuts", padding=False)
        c["tab_id"] = gr.HTML("", elem_id="tab-id", padding=False)  # ui/chat/tab_goodbye.py
        with gr.Tab("Chat") as chat_tab:
            c.update(_chat_view(ctx))
            c.update(_composer(ctx))
            c.update(_system_prompt_box(ctx))
            c["sampling"] = _sampling_controls(ctx.llm)
        with gr.Tab("Memory") as memory_tab:
            # demo users chat with the current shared prompt, so they share blocks with real chats
            dash = build_dashboard(
                ctx.llm,
                lambda: ctx.storage.get_system_prompt()["text"],
                storage=ctx.storage,
                auth=ctx.auth,
                own_conv=lambda r: ctx.tab(r).conv_id,
                may_start_demo=lambda r: not ctx.auth or ctx.owner(r) in ctx.admins,
                chat_states=ctx.tabs.chat_states,
            )
        # the dashboard's timers run only while its tab is shown; on arrival the sidebar's chat is highlighted
        wire_memory_tab(memory_tab, chat_tab, dash)
        # the chat list refreshes less often while the Memory tab is shown (each refresh is a
        # Gradio event the page pays for; measured with loadgen/bench_dashboard_browser.py)
        quiet = dict(api_visibility="private", show_progress="hidden")
        memory_tab.select(lambda: gr.Timer(LIST_REFRESH_MEMORY_TAB_S), None, c["timer"], **quiet)
        chat_tab.select(lambda: gr.Timer(LIST_REFRESH_S), None, c["timer"], **quiet)
        wire(ctx, demo, c)
    return demo


def _sidebar() -> dict:
    """The conversation list, its search and timer, and the rename / delete / export / import box;
    {local name: component} for the wiring."""
    with gr.Sidebar(open=True, width=300, elem_id="sidebar"):
        gr.Markdown("### Conversations")
        signed_in = gr.HTML("", elem_id="signed-in", padding=False)  # --auth: who, and Log out
        new_btn = gr.Button("+ New chat", variant="primary", size="sm", elem_id="new-chat")
        with gr.Row():
            query = gr.Textbox(
                placeholder="Search chats…", show_label=False, container=False, scale=5
            )
            # an icon drawn by CSS (no font glyph), its tooltip and label set by the page's script
            refresh_btn = gr.Button(
                "Refresh", size="sm", scale=1, min_width=40, elem_id="refresh-list"
            )
        conv_list = gr.Radio(choices=[], value=None, show_label=False, elem_id="conv-list")
        timer = gr.Timer(LIST_REFRESH_S)
        open_id = gr.Textbox(visible=False, label="Conversation id")  # API: open any id
        with gr.Accordion("Rename · delete · export · import", open=False) as manage:
            title = gr.Textbox(
                label="Title (of the chat on screen)", max_lines=1, elem_id="chat-title"
            )
            with gr.Row(elem_id="manage-row"):
                rename_btn = gr.Button("Rename", size="sm")
                delete_btn = gr.Button("Delete…", variant="stop", size="sm", elem_id="delete")
            with gr.Group(visible=False, elem_id="delete-confirm") as delete_confirm:
                delete_question = gr.Markdown()
                with gr.Row():
                    delete_yes = gr.Button(
                        "Yes, delete", variant="stop", size="sm", elem_id="delete-yes"
                    )
                    delete_no = gr.Button("Cancel", size="sm", elem_id="delete-no")
            with gr.Row(elem_id="export-row"):
                export_json_btn = gr.Button("Export JSON", size="sm")
                export_md_btn = gr.Button("Export Markdown", size="sm")
            export_file = gr.HTML("", elem_id="export-link")
            import_file = gr.UploadButton("Import JSON…", file_types=[".json"], size="sm")
    return dict(locals())


def _chat_view(ctx: ChatContext) -> dict:
    """The model line, the chat, its status line, the context meter and the n alternatives."""
    model_head = gr.Markdown(model_picker.model_line(ctx), elem_id="model-line")
    picker = model_picker.build(ctx)  # shown when the app has several models (--model A B ...)
    model_picker_c, model_note = picker["model_picker"], picker["model_note"]
    chatbot = gr.Chatbot(
        height=520,
        editable="user",
        label="Chat",
        show_label=False,
        elem_id="chatbot",
        placeholder="Start a conversation: every open chat is a live engine session "
        "that keeps its KV blocks between turns.",
        buttons=["copy"],
    )
    # the n alternatives / k beams right under the chat they belong to (not below the meter)
    with gr.Row(visible=False, elem_id="alt-row") as alt_row:
        alt_mds, pick_btns = [], []
        for i in range(view.MAX_ALTERNATIVES):
            with gr.Column(min_width=160):
                alt_mds.append(
                    gr.Markdown(
                        visible=False,
                        elem_id=f"alt-{i}",
                        elem_classes=["alternative"],
                        container=True,
                    )
                )
                pick_btns.append(
                    gr.Button(
                        "Continue with this one", size="sm", visible=False, elem_id=f"pick-{i}"
                    )
                )
    status = gr.Markdown(" ", elem_id="chat-status")
    with gr.Row(elem_id="ctx-row"):  # the context meter (ui/chat/context_meter.py), always shown
        meter = gr.HTML(context_meter.html(None), elem_id="ctx-meter")
        summary_btn = gr.Button(
            "Start a new chat with a summary",
            size="sm",
            visible=False,
            scale=0,
            min_width=120,
            elem_id="ctx-summary",
        )
    return {
        k: v for k, v in locals().items() if k not in ("ctx", "i", "picker", "model_picker_c")
    } | picker


def _composer(ctx: ChatContext) -> dict:
    """Attached documents, the message box with Send / Stop and the "Think" switch (a thinking
    model's), Regenerate / Continue, and the hidden branch switch the `< k/n >` links click."""
    doc_chips = gr.HTML("", elem_id="doc-chips")  # attached documents (ui/chat/documents.py)
    with gr.Row(elem_id="composer"):
        # an icon drawn by CSS (ui/page_assets.py: no emoji font needed), its tooltip and label
        # set by the page's script; several files at once, or dropped on the chat
        attach_btn = gr.UploadButton(
            "Attach",
            file_types=sorted(documents.TEXT_EXTENSIONS | {".pdf"}),
            scale=0,
            min_width=44,
            elem_id="attach",
            file_count="multiple",
        )
        msg = gr.Textbox(
            label="Message",
            placeholder="Message (Enter to send, Shift+Enter for a new line)",
            show_label=False,
            scale=8,
            lines=1,
            max_lines=8,
            elem_id="msg",
            autofocus=True,
        )
        # one place, one button: Send while idle, Stop (or Esc) while a reply is generated
        # shown when the model's template has a thinking switch (ui/chat/thinking.py); kept per chat
        think = gr.Checkbox(
            True,
            label="Think",
            visible=ctx.thinking_switch,
            scale=0,
            min_width=90,
            container=False,
            elem_id="think",
        )
        send_btn = gr.Button("Send", variant="primary", scale=1, min_width=80, elem_id="send")
        stop_btn = gr.Button(
            "Stop", variant="stop", scale=1, min_width=80, elem_id="stop", visible=False
        )
    with gr.Row(elem_id="regen-row"):  # shown only when it can act (CSS below)
        regen_btn = gr.Button("Regenerate", size="sm", elem_id="regenerate")
        # extends a stopped / cut-off reply in place (ui/chat/handlers.continue_reply)
        continue_btn = gr.Button("Continue", size="sm", elem_id="continue-reply")
    # `< k/n >` links in messages write "<message id>:<nonce>" here (PAGE_JS), then click
    branch_cmd = gr.Textbox(
        elem_id="branch-cmd", elem_classes=["offscreen"], show_label=False, container=False
    )
    branch_go = gr.Button("switch version", elem_id="branch-go", elem_classes=["offscreen"])
    return {k: v for k, v in locals().items() if k != "ctx"}


def _system_prompt_box(ctx: ChatContext) -> dict:
    """The shared system prompt (with presets) and this conversation's own override."""
    with gr.Accordion("System prompt", open=False, elem_id="system-prompt"):
        shared_prompt = gr.Textbox(
            label="Shared system prompt (every new chat starts with it, so "
            "their first blocks are shared)",
            lines=3,
        )
        save_prompt_btn = gr.Button("Save for new chats", size="sm")
        preset_info = build_prompt_picker(
            ctx, shared_prompt
        )  # presets + your own (ui/chat/prompt_picker.py)
        override = gr.Textbox(
            label="This conversation's own system prompt (optional override)", lines=2
        )
        with gr.Row():
            override_btn = gr.Button("Use for this conversation", size="sm")
            reset_btn = gr.Button("Back to the shared prompt", size="sm")
        prompt_line = gr.Markdown()
    return {k: v for k, v in locals().items() if k != "ctx"}


def page_css() -> str:
    """The page's style sheet: the chat's, the dashboard's theme, and each widget's own."""
    return (
        CSS
        + THEME_CSS
        + context_meter.CSS
        + shortcuts.CSS
        + documents.CSS
        + tab_goodbye.CSS
        + thinking.CSS
    )
