"""--share: a public Gradio share link to *this* app, with every guard of the local one.

Why not `demo.launch(share=True)`: Gradio's launcher serves its own app, without ours around it,
so a share link used to skip the Host check, the login throttle, the cancel owner check, the
owner-only export route and the viewer-scoped /api/kv (it even served the unscoped one). Here
the app is served as always and only the tunnel is Gradio's: `open_share_link` asks Gradio's share
server for a tunnel to the local port, and the link's host name is added to the Host guard's
allowed names before the link is printed, so the guard stays on for every other name.
"""

from __future__ import annotations

import secrets
from typing import Callable
from urllib.parse import urlparse

Tunnel = Callable[[str, int], str]  # (local host, local port) -> public URL


def gradio_tunnel(local_host: str, local_port: int) -> str:
    """A tunnel through Gradio's share server (needs internet; raises RuntimeError without)."""
    from gradio import networking

    url = networking.setup_tunnel(
        local_host=local_host,
        local_port=local_port,
        share_token=secrets.token_urlsafe(32),
        share_server_address=None,
        share_server_tls_certificate=None,
    )
    return "https://" + urlparse(url if "://" in url else f"//{url}").netloc


def open_share_link(
    local_host: str, port: int, share_hosts: set, tunnel: Tunnel = gradio_tunnel
) -> str:
    """Open the tunnel to local_host:port, allow its host name in `share_hosts` (the live set the
    Host guard reads), and return the public URL."""
    url = tunnel(local_host, port)
    host = urlparse(url).hostname
    if not host:
        raise RuntimeError(f"the share server returned no usable link ({url!r})")
    share_hosts.add(host.lower().rstrip("."))
    return url
