"""How the server learns that a tab went away, without a connection held open per tab (issue 47).

Why not Gradio's `demo.unload`: it needs the page to hold a "heartbeat" event stream for its
whole life (Gradio opens one for any page with a gr.State or an unload event), on top of the event
stream each page holds while something is pending. A browser allows 6 connections per host over
HTTP/1.1, shared by all its tabs: three tabs streaming replies held all six, and every other tab of
the app - a Memory tab, a new tab - waited, sending nothing, until a reply ended (measured:
`python -m loadgen.bench_tick_freshness`, 0 ticks applied in 60 s; without the heartbeat, a tick
every 2 s, at most 0.6 s behind /api/kv). The page now has no State and no unload event, so it
holds at most its event stream, and only while something is pending.

Instead:
- the page says goodbye when it goes away (`pagehide`: close, reload, navigation) with a beacon
  (POST `GOODBYE_PATH`, served by server/assembly.py), carrying its session and a secret only that
  page was given (`html`), so no one else can close it; under --auth the login must be the tab's
  owner's too. The chat is parked, as before, and released after the grace;
- a tab not heard from for `SILENT_S` (crashed, lost its network, frozen: no goodbye came) is swept
  (TabRegistry.sweep): its chat is released, but the tab stays known, so a tab that only slept
  (a background tab's timers are throttled to once a minute) continues its chat when it speaks.
  Every visible tab speaks every few seconds (the list's refresh).
"""

from __future__ import annotations

import threading
from html import escape

GOODBYE_PATH = "api/tab/goodbye"
SILENT_S = 180.0
SWEEP_EVERY_S = 30.0


def html(tab) -> str:
    """The hidden element the page's goodbye reads: this tab's session and its secret."""
    return (
        f'<span class="tab-goodbye" data-s="{escape(tab.session_hash, quote=True)}" '
        f'data-t="{escape(tab.goodbye, quote=True)}"></span>'
    )


def parse(body: bytes) -> tuple[str, str]:
    """(session hash, secret) from a goodbye's body "<session> <secret>" (anything else: empty)."""
    text = body[:512].decode("utf-8", "replace").strip()
    session, _, token = text.partition(" ")
    return session, token.strip()


# Installed once per page (ui/events.py). A beacon outlives the page; a page restored from the
# back/forward cache after saying goodbye has no server state any more, so it reloads.
JS = """() => {
  if (window.__pagedChatGoodbye) { return; }
  window.__pagedChatGoodbye = true;
  window.addEventListener("pagehide", () => {
    const id = document.querySelector("#tab-id .tab-goodbye");
    if (!id || !navigator.sendBeacon) { return; }
    const url = new URL("__PATH__", window.location.href.split(/[?#]/)[0]);
    const body = new Blob([`${id.dataset.s} ${id.dataset.t}`], { type: "text/plain" });
    navigator.sendBeacon(url, body);
    window.__pagedChatSaidGoodbye = true;
  });
  window.addEventListener("pageshow", (e) => {
    if (e.persisted && window.__pagedChatSaidGoodbye) { window.location.reload(); }
  });
}""".replace("__PATH__", GOODBYE_PATH)

CSS = "#tab-id { display: none !important; }"


def start_sweeper(
    tabs, silent_s: float = SILENT_S, every_s: float = SWEEP_EVERY_S
) -> threading.Event:
    """Sweep silent tabs every `every_s` (a daemon thread); set the returned event to stop it."""
    stop = threading.Event()

    def run():
        while not stop.wait(every_s):
            tabs.sweep(silent_s)

    threading.Thread(target=run, daemon=True, name="tab-sweep").start()
    return stop
