"""The page's own CSS and scripts, and the chat list's refresh periods (ui/layout.py and ui/events.py use them).

Why a module: they are long strings that change for look-and-feel reasons, apart from the wiring
in ui/layout.py, which stays readable in one sitting without them.
"""

from __future__ import annotations

from ui.chat import view

CSS = (
    """
.reply-stats { font-size: 0.78em; opacity: 0.65; }
.branch-nav { font-size: 0.85em; opacity: 0.8; user-select: none; white-space: nowrap; }
.branch-nav a { text-decoration: none; padding: 0.15em 0.6em; font-weight: bold; font-size: 1.25em;
  display: inline-block; min-width: 1.6em; text-align: center; border-radius: 6px; }
.branch-nav a:hover { background: var(--background-fill-secondary, #f3f4f6); }
#chatbot textarea { width: 100% !important; min-width: min(100%, 640px); }
#chatbot .message-wrap .edit-container, #chatbot .message.user:has(textarea) { width: 100% !important; max-width: 100% !important; }
/* a message being edited: its row (and the boxes inside it) take the chat's width, up to Gradio's
   row max-width; otherwise the row keeps the width of the short message and the box is ~200 px */
#chatbot .message-row:has(textarea), #chatbot .message-row:has(textarea) .role,
#chatbot .message-row:has(textarea) .message { width: 100% !important; }
#conv-list .wrap { flex-direction: column; align-items: stretch; gap: 2px; }
#conv-list label { width: 100%; }
#chat-status { min-height: 1.4em; font-size: 0.85em; opacity: 0.8; }
#model-line { font-size: 0.8em; opacity: 0.75; }
.offscreen { position: absolute !important; left: -10000px !important; width: 1px !important;
             height: 1px !important; overflow: hidden !important; }
#composer { flex-wrap: nowrap !important; align-items: flex-end; }
/* icons drawn from SVG masks in the text colour: no emoji or symbol font needed (issue 47: the
   paperclip was a tofu box); the words stay for screen readers, the page's script adds tooltips */
#attach, #refresh-list { font-size: 0 !important; }
#attach::before, #refresh-list::before { content: ""; display: inline-block; width: 18px; height: 18px;
  vertical-align: middle; background-color: currentColor; -webkit-mask: var(--ico) center / contain no-repeat;
  mask: var(--ico) center / contain no-repeat; }
#attach { --ico: url("data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 24 24' fill='none' stroke='black' stroke-width='2' stroke-linecap='round' stroke-linejoin='round'%3E%3Cpath d='M21 11.5l-8.6 8.6a5.2 5.2 0 0 1-7.4-7.4l8.6-8.6a3.5 3.5 0 0 1 4.9 4.9l-8.6 8.6a1.7 1.7 0 0 1-2.5-2.5l7.9-7.9'/%3E%3C/svg%3E"); }
#refresh-list { --ico: url("data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 24 24' fill='none' stroke='black' stroke-width='2' stroke-linecap='round' stroke-linejoin='round'%3E%3Cpath d='M20 11a8 8 0 1 0-2.3 5.7'/%3E%3Cpath d='M20 4v7h-7'/%3E%3C/svg%3E"); }
body.drop-files #chatbot { outline: 3px dashed var(--color-accent, #f97316); outline-offset: -3px; }
#delete-confirm { padding: 10px 12px !important; gap: 8px; }
#signed-in .signed-in { font-size: 0.85em; opacity: 0.85; margin: -4px 0 6px; }
#alt-row .alternative { max-height: 420px; overflow-y: auto; }
@media (max-width: 640px) {
  #composer { position: sticky; bottom: 0; z-index: 5; background: var(--body-background-fill); }
  #composer #send, #composer #stop { min-width: 64px !important; flex-grow: 0 !important; }
  #chatbot { height: 50vh !important; }          /* room for the context meter above the composer */
  #ctx-row { gap: 4px !important; } #ctx-meter { font-size: 0.9em; }
  #alt-row { flex-direction: column; }
}
/* The Memory tab on a phone (issue 26.6): bars get the full width under their labels, tiles two
   per row, tables scroll inside their panel, the demo strip wraps with buttons in proportion. */
#kv-dashboard { max-width: 100%; overflow-x: hidden; }
#kv-dashboard .kvd code { white-space: normal; word-break: break-all; }
/* "who is served" and the KV tier side by side where they fit, one above the other on a phone */
#kv-who-tier { flex-wrap: wrap !important; }
#kv-who { flex: 3 1 700px !important; min-width: min(100%, 320px) !important; }
#kv-tier { flex: 2 1 300px !important; min-width: min(100%, 300px) !important; }
#kv-dashboard .kvd table, #kv-dashboard .kv-tier table { border: none !important; }
#kv-demo-n { padding: 2px 8px !important; }
/* Start / Stop as buttons, not as tall as the number box's whole block (equal_height stretches them) */
#kv-demo-strip button { height: 36px !important; align-self: center !important; }
@media (max-width: 640px) {
  #kv-dashboard .kvb-row { grid-template-columns: 1fr auto; row-gap: 1px; }
  #kv-dashboard .kvb-l { grid-column: 1 / -1; font-size: 12px; }
  #kv-dashboard .kvb-t { min-width: 0; }
  #kv-dashboard .kvb-v { font-size: 12px; white-space: nowrap; }
  #kv-dashboard .kvn { grid-template-columns: repeat(2, minmax(0, 1fr)); }
  #kv-dashboard .kvn .v { font-size: 15px; overflow-wrap: anywhere; }
  #kv-dashboard .kvs .kvs-1 { font-size: 16px; }
  #kv-demo-strip { flex-wrap: wrap !important; gap: 6px !important; }
  #kv-demo-strip > * { flex: 0 1 auto !important; min-width: 0 !important; }
  #kv-demo-strip { align-items: center !important; }
  #kv-demo-strip button { min-width: 56px !important; padding: 2px 10px !important; font-size: 13px !important;
    height: 36px !important; align-self: center !important; }
  #kv-demo-status { flex: 1 1 100% !important; word-break: normal; overflow-wrap: normal; }
  #kv-dashboard .kvl { gap: 8px; font-size: 12px; }
  #kv-dashboard .gr-row, #kv-dashboard .row { flex-wrap: wrap; }
  #kv-dashboard .row:has(#kv-select) { flex-direction: column !important; }
  /* tables wrap their text first; what still does not fit scrolls, with a shadow saying so */
  #kv-dashboard .kvd th, #kv-dashboard .kvd td { white-space: normal; padding: 2px 5px; }
  #kv-dashboard .kvd td:first-child { min-width: 7em; }
}
"""
    + view.BUTTONS_CSS
)

# The page's script, installed once on load: (1) the `< k/n >` links in messages switch versions
# through a hidden textbox + button (Gradio cannot bind events to HTML inside a message);
# (2) Esc stops the reply and Enter sends an edited message (Shift+Enter: new line); (3) the
# chatbot's copy buttons copy the reply's stored Markdown (no stats line, no arrows, never HTML;
# Gradio's own copy would copy our footer's HTML too); (4) on a phone the sidebar drawer closes
# once a chat is picked.
PAGE_JS = """() => {
  if (window.__pagedChat) { return; }
  window.__pagedChat = true;
  const clickHidden = (boxId, btnId, value) => {
    const box = document.querySelector(`#${boxId} textarea, #${boxId} input`);
    const btn = document.querySelector(`#${btnId}`);
    if (!box || !btn) { return; }
    box.value = value;
    box.dispatchEvent(new Event("input", { bubbles: true }));
    setTimeout(() => btn.click(), 30);
  };
  // A message's Markdown source: a stored reply carries it exactly (ui/chat/view.source_mark,
  // base64 of UTF-8); a reply still streaming is rebuilt from the page as far as it can be: code
  // blocks keep their fences (and language), inline code its backticks; no stats line, no arrows,
  // never HTML (issue 26.7).
  // `msg`: a message's bubble or anything in it; a reply's bubble has parts (its text, then our
  // footer with the stats and the source mark: ui/chat/view.row_content), each a .message-content.
  window.__pagedChatMarkdownOf = (msg) => {
    const bubble = (msg.closest && msg.closest(".message.bot, .message.user"))
      || (msg.querySelector && msg.querySelector(".message.bot, .message.user")) || msg;
    const src = bubble.querySelector(".md-src[title]");
    if (src) {
      try {
        const bytes = Uint8Array.from(atob(src.getAttribute("title")), (c) => c.charCodeAt(0));
        return new TextDecoder().decode(bytes);
      } catch (err) { /* a damaged mark: rebuild from the page below */ }
    }
    const body = (bubble.querySelector(".message-content") || bubble).cloneNode(true);
    body.querySelectorAll(".reply-stats, .md-src, .branch-nav, button, svg").forEach((n) => n.remove());
    body.querySelectorAll("pre").forEach((pre) => {
      const code = pre.querySelector("code") || pre;
      const lang = ((code.className || "").match(/language-([\\w+-]+)/) || [])[1] || "";
      pre.replaceWith(document.createTextNode("\\n```" + lang + "\\n" + code.innerText.replace(/\\n$/, "") + "\\n```\\n"));
    });
    body.querySelectorAll("code").forEach((c) => c.replaceWith(document.createTextNode("`" + c.innerText + "`")));
    return body.innerText.replace(/\\n{3,}/g, "\\n\\n").trim();
  };
  document.addEventListener("click", (e) => {
    const a = e.target.closest && e.target.closest('a[href*="#branch-"]');
    if (a) {
      e.preventDefault(); e.stopPropagation();
      const id = a.getAttribute("href").split("#branch-")[1];
      clickHidden("branch-cmd", "branch-go", `${id}:${Date.now()}`);
      return;
    }
    const copy = e.target.closest && e.target.closest('#chatbot button');
    if (copy && /copy/i.test((copy.getAttribute("title") || "") + (copy.getAttribute("aria-label") || ""))) {
      let row = copy.closest(".message-buttons") || copy;      // the buttons follow their message's row
      while (row && !(row.classList && row.classList.contains("message-row"))) {
        row = row.previousElementSibling || null;
      }
      const msg = (row || copy.closest(".message-row"))?.querySelector(".message.bot, .message.user");
      if (!msg) { return; }
      e.preventDefault(); e.stopPropagation();
      const text = window.__pagedChatMarkdownOf(msg);
      window.__lastCopied = text;
      if (navigator.clipboard) { navigator.clipboard.writeText(text).catch(() => {}); }
      return;
    }
    const pickedChat = e.target.closest && e.target.closest("#conv-list label");
    if (pickedChat && window.innerWidth <= 640) {
      setTimeout(() => {
        const side = document.querySelector(".sidebar.open > .toggle-button");
        if (side) { side.click(); }
      }, 50);
    }
  }, true);
  // (5) tooltips and labels of the icon buttons; (6) files dropped on the chat are attached, as
  // if picked with the attach button (several at once)
  const label = (sel, text) => {
    const el = document.querySelector(sel);
    if (el) { el.title = text; el.setAttribute("aria-label", text); }
  };
  label("#attach", "Attach files (text, Markdown, code, PDF) to your next message; you can also drop them on the chat");
  label("#refresh-list", "Refresh the list (chats made in your other tabs)");
  const dropZone = (e) => e.target && e.target.closest && e.target.closest("#chatbot, #composer, #doc-chips");
  const withFiles = (e) => e.dataTransfer && [...(e.dataTransfer.types || [])].includes("Files");
  document.addEventListener("dragover", (e) => {
    if (withFiles(e) && dropZone(e)) { e.preventDefault(); document.body.classList.add("drop-files"); }
  });
  document.addEventListener("dragleave", (e) => {
    if (!e.relatedTarget || !dropZone({ target: e.relatedTarget })) { document.body.classList.remove("drop-files"); }
  });
  document.addEventListener("drop", (e) => {
    document.body.classList.remove("drop-files");
    const files = e.dataTransfer && e.dataTransfer.files;
    if (!files || !files.length || !dropZone(e)) { return; }
    const input = document.querySelector("#attach input[type=file]")
      || document.querySelector("#attach")?.parentElement?.querySelector("input[type=file]");
    if (!input) { return; }
    e.preventDefault();
    const dt = new DataTransfer();
    for (const f of files) { dt.items.add(f); }
    input.files = dt.files;
    input.dispatchEvent(new Event("change", { bubbles: true }));
  });
  if (window.innerWidth <= 640) {       // a phone opens on the chat; the list is a drawer
    setTimeout(() => document.querySelector(".sidebar.open > .toggle-button")?.click(), 300);
  }
  document.addEventListener("keydown", (e) => {
    const edit = e.target.closest && e.target.closest("#chatbot textarea");
    if (edit && e.key === "Enter" && !e.shiftKey && !e.isComposing) {    // edit box: Enter sends
      const submit = document.querySelector("#chatbot button[title='Submit'], #chatbot button[aria-label='Submit']");
      if (submit) { e.preventDefault(); e.stopPropagation(); submit.click(); }
      return;
    }
    if (e.key !== "Escape") { return; }
    const stop = document.querySelector("#stop");
    if (stop && stop.offsetParent !== null) { e.preventDefault(); stop.click(); }
  }, true);
}"""


# First in the page's <head> (server/page_head.py), before Gradio's own scripts. Gradio's status tracker counts a
# pending event's elapsed time in a requestAnimationFrame loop that runs until the event ends. The
# page-wide "Loading…" tracker starts one and is removed from the page while still pending, so its
# loop never ends: every open tab drew 60 frames a second, ~14% of a core in Chromium (measured with
# the tab idle, 2-core box). The counter shows tenths of a second, so the tracker's frames are now
# spaced 250 ms apart, as timeouts; every other animation frame is untouched. If a Gradio version
# names its scripts differently, nothing matches and nothing changes.
HEAD = """<script>
(() => {
  const raf = window.requestAnimationFrame.bind(window);
  const caf = window.cancelAnimationFrame.bind(window);
  const SPACING_MS = 250;
  window.requestAnimationFrame = (cb) => {
    if (!(new Error().stack || "").includes("/statustracker")) { return raf(cb); }
    return -setTimeout(() => cb(performance.now()), SPACING_MS);   // negative: one of ours
  };
  window.cancelAnimationFrame = (id) => (id < 0 ? clearTimeout(-id) : caf(id));
})();
</script>"""

LIST_REFRESH_S = 2.0
LIST_REFRESH_MEMORY_TAB_S = 6.0
URL_JS = """(c) => {
  const u = new URL(window.location.href);
  if (c) { u.searchParams.set("c", c); } else { u.searchParams.delete("c"); }
  if (u.href !== window.location.href) { window.history.replaceState(null, "", u.href); }
}"""
