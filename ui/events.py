"""The chat page's events: which handler each control runs, with which inputs and outputs.

Why apart from ui/layout.py: the layout says what is on the page, this file what happens when it is
used. `wire(ctx, demo, c)` connects every event, in groups (replies, attachments, the context
meter, summary and stop, branches, navigation, the sidebar's management box); `c` holds the
components ui/layout.py built, by name.
"""

from __future__ import annotations

import gradio as gr

from engine.protocol import BeamSearches, ConstrainsOutput
from ui.chat import (
    beam,
    branches,
    confirm,
    context_meter,
    documents,
    shortcuts,
    summary,
    tab_goodbye,
)
from ui.chat import handlers as chat
from ui.chat import limits, model_picker, reply_format, thinking, view
from ui.chat import sidebar as side
from ui.chat.context import ChatContext
from ui.page_assets import PAGE_JS, URL_JS


def wire(ctx: ChatContext, demo: gr.Blocks, c: dict) -> None:
    """Every event of the page, in groups: replies, attachments, the context meter, summary and
    stop, branches, the page's scripts, the sidebar's navigation and its management box."""
    chat_out = [
        c["msg"],
        c["chatbot"],
        c["status"],
        c["conv_list"],
        c["alt_row"],
        *c["alt_mds"],
        *c["pick_btns"],
        c["send_btn"],
        c["stop_btn"],
    ]
    view_out = [
        c["chatbot"],
        c["status"],
        c["conv_list"],
        c["title"],
        c["override"],
        c["prompt_line"],
        c["alt_row"],
        c["think"],
    ]
    events = _wire_replies(ctx, c, chat_out)
    _wire_attachments(ctx, c, events)
    meter = _wire_meter(ctx, c, events)
    _wire_summary_and_stop(ctx, c, view_out, meter)
    _wire_branches(ctx, c, meter)
    demo.load(None, None, None, js=PAGE_JS)
    demo.load(None, None, None, js=shortcuts.JS)  # the `?` overlay's keys (ui/chat/shortcuts.py)
    demo.load(None, None, None, js=tab_goodbye.JS)  # the page's goodbye (no unload: see there)
    _wire_navigation(ctx, demo, c, chat_out, view_out)
    _wire_management(ctx, c, view_out)
    model_picker.wire(ctx, c)  # several models: the picker switches (admins under --auth)
    _wire_think(ctx, c)


def _wire_think(ctx: ChatContext, c: dict) -> None:
    """The "Think" switch (a thinking model's template has one): kept with the chat on screen, so
    it shows again when the chat is opened; a new chat takes it when its first message is sent."""

    def set_think(value, request: gr.Request):
        tab = ctx.tab(request)
        if tab.conv_id is not None and ctx.thinking_switch:
            try:
                ctx.remember_thinking(tab.conv_id, bool(value), request)
            except (KeyError, PermissionError):  # deleted meanwhile: nothing to keep it with
                pass

    c["think"].input(
        set_think, c["think"], None, api_name=False, concurrency_limit=None, show_progress="hidden"
    )


NO_CHAT_IN_URL_JS = """() => {
  const u = new URL(window.location.href);
  if (!u.searchParams.has("c")) { return; }
  u.searchParams.delete("c");
  window.history.replaceState(null, "", u.href);
}"""
DOWNLOAD_JS = "() => { document.querySelector('#export-link a')?.click(); }"
NO_BEAM_SEARCH = (
    "Beam search runs only on the built-in engine; this app serves a remote backend (--backend)."
)
NO_REPLY_FORMAT = (
    "A JSON reply format runs only on the built-in engine; this app serves a remote backend "
    "(--backend)."
)


def _settings(ctx: ChatContext):
    """The sampling controls' values -> the engine's keyword arguments, validated (gr.Error)."""

    def settings(
        temperature,
        top_p,
        top_k,
        max_tokens,
        repetition_penalty,
        seed,
        n,
        decoding,
        fmt=reply_format.FREE,
        schema="",
    ):
        kw = limits.sampling(
            temperature, top_p, top_k, max_tokens, repetition_penalty, seed, n
        )  # validate first
        if beam.beam_width(decoding):
            if not isinstance(ctx.llm, BeamSearches):
                raise gr.Error(NO_BEAM_SEARCH, title="Not available")
            kw["beam_width"] = beam.beam_width(decoding)
        structured = reply_format.spec(fmt, schema)
        if structured is not None:
            if not isinstance(ctx.llm, ConstrainsOutput):
                raise gr.Error(NO_REPLY_FORMAT, title="Not available")
            if "beam_width" in kw:
                raise gr.Error(
                    "A JSON reply format needs sampling or greedy decoding, not beam search.",
                    title="Not accepted",
                )
            try:  # a schema the grammar library refuses: said now, nothing stored
                ctx.llm.compile_structured(structured)
            except ValueError as e:
                raise gr.Error(
                    f"The reply format is not accepted: {e}", title="Not accepted"
                ) from None
            kw["structured"] = structured
        return kw

    return settings


def _wire_replies(ctx: ChatContext, c: dict, chat_out: list) -> list:
    """Send (button and Enter), Regenerate, Continue and an edit: the events that stream a reply."""
    settings = _settings(ctx)

    # Explicit parameters: Gradio maps inputs by position and finds gr.Request by annotation.
    async def send(
        message,
        temperature,
        top_p,
        top_k,
        max_tokens,
        repetition_penalty,
        seed,
        n,
        decoding=beam.SAMPLE,
        fmt=reply_format.FREE,
        schema="",
        think=None,
        request: gr.Request = None,
    ):
        kw = settings(
            temperature,
            top_p,
            top_k,
            max_tokens,
            repetition_penalty,
            seed,
            n,
            decoding,
            fmt,
            schema,
        )
        kw["thinking"] = thinking.requested(think, ctx.thinking_switch)
        tab = ctx.tab(request) if request is not None else None
        if (
            tab is not None and tab.attachments
        ):  # documents first: chats attaching one share its blocks
            message = documents.message_text(tab.attachments, view.text_of(message))
            tab.attachments = []
        async for out in chat.send(ctx, message, kw, request):
            yield out

    async def regenerate(
        temperature,
        top_p,
        top_k,
        max_tokens,
        repetition_penalty,
        seed,
        n,
        decoding=beam.SAMPLE,
        fmt=reply_format.FREE,
        schema="",
        think=None,
        request: gr.Request = None,
    ):
        kw = settings(
            temperature,
            top_p,
            top_k,
            max_tokens,
            repetition_penalty,
            seed,
            n,
            decoding,
            fmt,
            schema,
        )
        kw["thinking"] = thinking.requested(think, ctx.thinking_switch)
        async for out in chat.regenerate(ctx, kw, request):
            yield out

    async def continue_reply(
        temperature,
        top_p,
        top_k,
        max_tokens,
        repetition_penalty,
        seed,
        n,
        decoding=beam.SAMPLE,
        fmt=reply_format.FREE,
        schema="",
        request: gr.Request = None,
    ):
        kw = settings(
            temperature, top_p, top_k, max_tokens, repetition_penalty, seed, n, beam.SAMPLE
        )
        async for out in chat.continue_reply(ctx, kw, request):
            yield out

    async def edit(
        temperature,
        top_p,
        top_k,
        max_tokens,
        repetition_penalty,
        seed,
        n,
        decoding,
        fmt,
        schema,
        think,
        edit_data: gr.EditData,
        request: gr.Request,
    ):
        kw = settings(
            temperature,
            top_p,
            top_k,
            max_tokens,
            repetition_penalty,
            seed,
            n,
            decoding,
            fmt,
            schema,
        )
        kw["thinking"] = thinking.requested(think, ctx.thinking_switch)
        async for out in chat.edit(ctx, edit_data.index, edit_data.value, kw, request):
            yield out

    msg, sampling, think = c["msg"], c["sampling"], c["think"]
    stream_opts = dict(concurrency_limit=None, show_progress="minimal")
    return [
        c["send_btn"].click(
            send, [msg, *sampling, think], chat_out, api_name="send", **stream_opts
        ),
        # "multiple": Enter while a reply streams must reach the server, which says "one reply at
        # a time" (Gradio's default would drop the second trigger silently)
        msg.submit(
            send,
            [msg, *sampling, think],
            chat_out,
            api_name=False,
            trigger_mode="multiple",
            **stream_opts,
        ),
        c["regen_btn"].click(
            regenerate, [*sampling, think], chat_out, api_name="regenerate", **stream_opts
        ),
        c["continue_btn"].click(
            continue_reply, sampling, chat_out, api_name="continue_reply", **stream_opts
        ),
        c["chatbot"].edit(edit, [*sampling, think], chat_out, api_name=False, **stream_opts),
    ]


def _wire_attachments(ctx: ChatContext, c: dict, events: list) -> None:
    slots = documents.UploadSlots()  # documents being read at once, per user (issue 48.4)

    def attach(files, request: gr.Request):
        """Documents for the next message (several at once, or dropped on the chat), each refused
        (with the numbers) if it cannot fit; the others are attached. A user's documents are read
        one at a time (issue 48.4): a file that finds its user's slot taken is refused."""
        tab = ctx.tab(request)
        tok = ctx.llm.get_tokenizer()
        who = ctx.tenant(request)
        for file in files if isinstance(files, (list, tuple)) else [files]:
            path = getattr(file, "name", None) or (
                file.get("path") if isinstance(file, dict) else file
            )
            busy = slots.enter(who)
            if busy is not None:
                gr.Warning(f"Not attached: {busy}")
                break
            try:
                doc = documents.read_document(
                    path,
                    getattr(file, "orig_name", None) or path,
                    lambda t: len(tok.encode(t, add_special_tokens=False)),
                )
                m = context_meter.for_tab(ctx, request)
                documents.check_fits(doc, m.tokens if m else 0, ctx.max_model_len, tab.attachments)
            except (OSError, ValueError) as e:
                gr.Warning(f"Not attached: {e}")
                continue
            finally:
                slots.leave(who)
            tab.attachments = tab.attachments + [doc]
        return documents.chips_html(tab.attachments)

    c["attach_btn"].upload(
        attach,
        c["attach_btn"],
        c["doc_chips"],
        api_name="attach_document",
        concurrency_limit=None,
        show_progress="hidden",
    )
    for ev in events[:2]:  # sent: the chips go (the message now holds them)
        ev.then(lambda: "", None, c["doc_chips"], api_name=False, show_progress="hidden")


def _meter(ctx: ChatContext, request, only_changed: bool) -> tuple:
    """The context meter's line and its summary button; with only_changed, gr.skip() for both when
    the tab already shows them (the list's tick: an idle tab gets nothing to re-render)."""
    m = context_meter.for_tab(ctx, request)
    shown = (context_meter.html(m), bool(m and m.warn))
    tab = ctx.tab(request)
    if only_changed and shown == tab.meter_sig:
        return gr.skip(), gr.skip()
    tab.meter_sig = shown
    return shown[0], gr.Button(visible=shown[1])


def _wire_meter(ctx: ChatContext, c: dict, events: list) -> dict:
    """The context meter after each reply (the list's tick repaints it when it changed, see
    _wire_navigation); the event to repaint it."""

    def meter_fn(request: gr.Request):
        return _meter(ctx, request, only_changed=False)

    meter = dict(
        fn=meter_fn,
        inputs=None,
        outputs=[c["meter"], c["summary_btn"]],
        api_name=False,
        concurrency_limit=None,
        show_progress="hidden",
    )
    for ev in events:
        ev.then(**meter)
    return meter


def _wire_summary_and_stop(ctx: ChatContext, c: dict, view_out: list, meter: dict) -> None:
    async def summary_fn(request: gr.Request):
        try:
            conv = await summary.new_chat_from_summary(ctx, request)
        except (ValueError, RuntimeError) as e:  # this request only
            raise gr.Error(f"No summary: {e}") from None
        return side.open_conversation(ctx, conv["id"] if conv else None, request)

    c["summary_btn"].click(
        summary_fn,
        None,
        view_out,
        api_name="new_chat_from_summary",
        concurrency_limit=None,
        show_progress="minimal",
    ).then(**meter)

    async def stop(request: gr.Request):
        return await chat.stop(ctx, request)

    # no cancels=events: the reply's own handler paints "stopped" and ends (chat.stop says why)
    c["stop_btn"].click(
        stop,
        None,
        [c["chatbot"], c["status"], c["send_btn"], c["stop_btn"]],
        api_name="stop",
        concurrency_limit=None,
        show_progress="hidden",
    )


def _wire_branches(ctx: ChatContext, c: dict, meter: dict) -> None:
    """`< k/n >` version links and the "Continue with this one" buttons under the alternatives;
    the context meter follows the version now on screen."""

    def switch_branch(command, request: gr.Request):
        return branches.switch(ctx, command, request)

    c["branch_go"].click(
        switch_branch,
        c["branch_cmd"],
        [c["chatbot"], c["status"], c["conv_list"]],
        api_name="switch_branch",
        concurrency_limit=None,
        show_progress="hidden",
    ).then(**meter)
    for k, btn in enumerate(c["pick_btns"]):

        def pick(request: gr.Request, k=k):
            return branches.pick(ctx, k, request)

        btn.click(
            pick,
            None,
            [c["chatbot"], c["status"], c["conv_list"], *c["alt_mds"], *c["pick_btns"]],
            api_name=f"pick_alternative_{k + 1}",
            concurrency_limit=None,
            show_progress="hidden",
        ).then(**meter)


def _wire_navigation(
    ctx: ChatContext, demo: gr.Blocks, c: dict, chat_out: list, view_out: list
) -> None:
    """Page load and unload, new chat, opening a chat (list, address, API), search, the list's tick."""

    def on_load(request: gr.Request):
        return side.on_load(ctx, request) + (
            tab_goodbye.html(ctx.tab(request)),
            side.signed_in(ctx, request),
        )

    async def follow(request: gr.Request):
        async for out in chat.follow(ctx, request):
            yield out

    def tick(query, request: gr.Request):
        return (
            chat.refresh(ctx, query, request)
            + _meter(ctx, request, only_changed=True)
            + model_picker.follow_model(ctx, ctx.tab(request))
        )

    def new_chat(request: gr.Request):
        return side.new_chat(ctx, request)

    def open_conv(conv_id, request: gr.Request):
        return side.open_conversation(ctx, conv_id, request)

    def search(query, request: gr.Request):
        return side.search(ctx, query, request)

    quick = dict(concurrency_limit=None, show_progress="hidden")
    conv_list, chatbot = c["conv_list"], c["chatbot"]
    loaded = view_out + [c["shared_prompt"], c["tab_id"], c["signed_in"]]
    demo.load(on_load, None, loaded, api_name=False, **quick).then(
        follow, None, chat_out, api_name=False, **quick
    )
    # a new chat has no address yet: the old chat's ?c= goes at once (a reload reopened it)
    c["new_btn"].click(new_chat, None, view_out, api_name="new_chat", js=NO_CHAT_IN_URL_JS, **quick)
    chatbot.clear(
        new_chat,
        None,
        view_out,
        api_name=False,
        js=NO_CHAT_IN_URL_JS,  # its trash icon
        **quick,
    )
    # A click shows the chosen chat at once, then paints its reply live if one is being generated.
    conv_list.input(open_conv, conv_list, view_out, api_name=False, **quick).then(
        follow, None, chat_out, api_name=False, **quick
    )
    # The address bar names the open chat (/?c=<id>), so a reload or a shared link reopens it.
    conv_list.change(None, conv_list, None, js=URL_JS)
    # Every tab polls: chats created, renamed or continued in the user's other tabs show up, and the
    # context meter follows the engine. One event a tick, each part sent only when it changed.
    c["timer"].tick(
        tick,
        c["query"],
        [
            conv_list,
            chatbot,
            c["meter"],
            c["summary_btn"],
            c["model_head"],
            c["model_picker"],
            c["think"],
        ],
        api_name=False,
        **quick,
    )
    # API clients open a conversation by id (the radio only accepts ids already in its list).
    c["open_id"].change(
        open_conv, c["open_id"], view_out, api_name="open_conversation", **quick
    ).then(follow, None, chat_out, api_name=False, **quick)
    c["query"].change(search, c["query"], conv_list, api_name="search", **quick)
    c["refresh_btn"].click(
        search, c["query"], conv_list, api_name=False, **quick
    )  # chats from other tabs


def _wire_management(ctx: ChatContext, c: dict, view_out: list) -> None:
    """Rename and delete (asked first, naming the chat and what goes with it)."""

    def rename(title, request: gr.Request):
        return side.rename(ctx, title, request)

    def delete(request: gr.Request):
        return side.delete(ctx, request) + (gr.Group(visible=False),)

    def ask_delete(request: gr.Request):
        question = confirm.delete_question(ctx, request)
        return (
            gr.Group(visible=question is not None),
            question or "",
            confirm.current_title(ctx, request),
        )

    def fill_title(request: gr.Request):
        return confirm.current_title(ctx, request)

    quick = dict(concurrency_limit=None, show_progress="hidden")
    c["rename_btn"].click(rename, c["title"], c["conv_list"], api_name="rename", **quick)
    # Delete asks first, naming the chat and what goes with it; only "Yes, delete" deletes.
    c["delete_btn"].click(
        ask_delete,
        None,
        [c["delete_confirm"], c["delete_question"], c["title"]],
        api_name=False,
        **quick,
    )
    c["manage"].expand(
        fill_title, None, c["title"], api_name=False, **quick
    )  # rename acts on the chat on screen
    c["delete_no"].click(
        lambda: gr.Group(visible=False), None, c["delete_confirm"], api_name=False, **quick
    )
    c["delete_yes"].click(
        delete, None, view_out + [c["delete_confirm"]], api_name="delete", **quick
    ).then(
        lambda: "", None, c["export_file"], api_name=False, **quick
    )  # no download link of a deleted chat
    _wire_exports_and_prompts(ctx, c, view_out, quick)


def _wire_exports_and_prompts(ctx: ChatContext, c: dict, view_out: list, quick: dict) -> None:
    """Export (JSON, Markdown), import, the shared prompt and the override, and the close_tab API."""

    def export_json(request: gr.Request):
        return side.export(ctx, "json", request)

    def export_md(request: gr.Request):
        return side.export(ctx, "md", request)

    def import_json(file, request: gr.Request):
        return side.import_json(ctx, file, request)

    def save_prompt(text, request: gr.Request):
        return side.save_shared_prompt(ctx, text, request)

    def use_override(text, request: gr.Request):
        return side.set_override(ctx, text, request)

    def reset_override(request: gr.Request):
        return side.set_override(ctx, None, request)

    def close_tab(request: gr.Request) -> str:
        return side.close_tab(ctx, request)

    prompt_out = [c["override"], c["prompt_line"], c["conv_list"]]
    # one click: the file downloads at once (the link stays, for its owner, for 15 minutes)
    for btn, fn, name in (
        (c["export_json_btn"], export_json, "export_json"),
        (c["export_md_btn"], export_md, "export_markdown"),
    ):
        btn.click(fn, None, c["export_file"], api_name=name, **quick).then(
            None, None, None, js=DOWNLOAD_JS
        )
    c["import_file"].upload(
        import_json, c["import_file"], view_out, api_name="import_json", **quick
    )
    c["save_prompt_btn"].click(
        save_prompt,
        c["shared_prompt"],
        [c["shared_prompt"], c["prompt_line"]],
        api_name="set_shared_prompt",
        **quick,
    ).then(
        lambda: "", None, c["preset_info"], api_name=False, **quick
    )  # the "press Save" hint is done
    c["override_btn"].click(
        use_override, c["override"], prompt_out, api_name="set_override", **quick
    )
    c["reset_btn"].click(reset_override, None, prompt_out, api_name="reset_override", **quick)
    gr.api(close_tab, api_name="close_tab")
