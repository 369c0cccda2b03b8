"""Keyboard shortcuts that open-webui users know, and the `?` overlay that lists them (issue 26.8).

Why one list: the overlay, the page script and the docs must not drift apart, so the keys are
named once here (SHORTCUTS) and the overlay is rendered from that list. The script only clicks or
focuses elements the page already has (#new-chat, the sidebar's search box, #stop, #msg) and copies
the last reply through the page's own markdown-source copy (ui/page_assets.PAGE_JS), so a shortcut
can do nothing the mouse could not.
"""

from __future__ import annotations

from html import escape

# (keys as shown, what it does, the action name the script dispatches on)
SHORTCUTS = (
    ("Ctrl/⌘ + Shift + O", "New chat", "new"),
    ("Ctrl/⌘ + K", "Focus the chat search", "search"),
    ("Ctrl/⌘ + Shift + C", "Copy the last reply (its Markdown source)", "copy"),
    ("Esc", "Stop the reply being generated", "stop"),
    ("Shift + Esc", "Focus the message box", "focus"),
    ("?  or  Ctrl/⌘ + /", "Show or hide this list", "help"),
)


def overlay_html() -> str:
    rows = "".join(
        f'<tr><td><kbd>{escape(k)}</kbd></td><td>{escape(what)}</td></tr>'
        for k, what, _ in SHORTCUTS
    )
    return (
        f'<div id="shortcuts-overlay" role="dialog" aria-label="Keyboard shortcuts" hidden>'
        f'<div class="sc-box"><h3>Keyboard shortcuts</h3><table>{rows}</table>'
        f'<div class="sc-hint">Press Esc or ? to close.</div></div></div>'
    )


CSS = """
#shortcuts-overlay { position: fixed; inset: 0; z-index: 1000; background: rgba(0,0,0,.45);
  display: flex; align-items: center; justify-content: center; }
#shortcuts-overlay[hidden] { display: none; }
#shortcuts-overlay .sc-box { background: var(--background-fill-primary, #fff); color: var(--body-text-color, #111);
  border-radius: 10px; padding: 16px 20px; max-width: min(92vw, 460px); box-shadow: 0 10px 30px rgba(0,0,0,.3); }
#shortcuts-overlay h3 { margin: 0 0 8px; }
#shortcuts-overlay td { padding: 3px 10px 3px 0; vertical-align: top; }
#shortcuts-overlay kbd { font: 12px monospace; border: 1px solid var(--border-color-primary, #ccc);
  border-radius: 4px; padding: 1px 5px; white-space: nowrap; }
#shortcuts-overlay .sc-hint { font-size: 12px; opacity: .7; margin-top: 6px; }
"""

JS = """() => {
  if (window.__pagedChatShortcuts) { return; }
  window.__pagedChatShortcuts = true;
  const overlay = () => document.querySelector('#shortcuts-overlay');
  const typing = (t) => t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName));
  const act = {
    help: () => { const o = overlay(); if (o) { o.hidden = !o.hidden; } },
    new: () => document.querySelector('#new-chat')?.click(),
    search: () => {
      const side = document.querySelector('.sidebar:not(.open) > .toggle-button');
      if (side) { side.click(); }
      setTimeout(() => document.querySelector('#sidebar input[placeholder^="Search"], input[placeholder^="Search chats"]')?.focus(), side ? 250 : 0);
    },
    copy: () => {
      const bots = document.querySelectorAll('#chatbot .message.bot');
      const last = bots[bots.length - 1];
      if (!last || !window.__pagedChatMarkdownOf) { return; }
      const text = window.__pagedChatMarkdownOf(last);
      window.__lastCopied = text;
      if (navigator.clipboard) { navigator.clipboard.writeText(text).catch(() => {}); }
    },
    stop: () => { const s = document.querySelector('#stop'); if (s && s.offsetParent !== null) { s.click(); } },
    focus: () => document.querySelector('#msg textarea')?.focus(),
  };
  window.__pagedChatShortcut = (name) => act[name] && act[name]();
  document.addEventListener('keydown', (e) => {
    const mod = e.ctrlKey || e.metaKey, key = (e.key || '').toLowerCase();
    const o = overlay();
    let name = null;
    if (o && !o.hidden && (e.key === 'Escape' || e.key === '?')) { name = 'help'; }
    else if (mod && e.shiftKey && key === 'o') { name = 'new'; }
    else if (mod && !e.shiftKey && key === 'k') { name = 'search'; }
    else if (mod && e.shiftKey && key === 'c') { name = 'copy'; }
    else if (mod && key === '/') { name = 'help'; }
    else if (e.key === '?' && !mod && !typing(e.target)) { name = 'help'; }
    else if (e.key === 'Escape' && e.shiftKey) { name = 'focus'; }
    if (!name) { return; }
    e.preventDefault(); e.stopPropagation();
    act[name]();
  }, true);
}"""
