"""The Memory tab when the chat runs on several replicas with KV events (`app.py --backend URL ...
--backend-kv-events tcp://HOST:PORT ...`): each replica's cached blocks, what they cache twice,
where the chat's turns landed, and each replica's /metrics.

Why its own view: the local tab reads the engine's exact pool and the remote tab only /metrics;
here the block picture comes from the replicas' KV-event streams (backends/kv_cluster.py), and
the words come from ui/dashboard/cluster_view.py. This file only wires Gradio: one timer, one
paint function, the viewer's identity for what it may read under --auth.
"""

from __future__ import annotations

import threading
import time
from html import escape

import gradio as gr

from engine.kv.salt_rule import principal_salt
from ui.dashboard import cluster_view as V
from ui.dashboard import panels as H
from ui.dashboard.timers import DashboardTimers


class _Cached:
    """The cluster numbers at most every `every` seconds, however many tabs watch: with 10^6
    blocks per replica one computation takes a second or more (docs/BENCHMARKS.md), so the wait
    grows with what it costs (5x the last computation, at least one tick)."""

    def __init__(self, cluster, tick_s: float):
        self.cluster, self.tick_s = cluster, tick_s
        self.value, self.at, self.cost = None, 0.0, 0.0
        self.lock = threading.Lock()

    def get(self):
        with self.lock:
            if self.value is None or time.time() - self.at >= max(0.9 * self.tick_s, 5 * self.cost):
                t0 = time.perf_counter()
                self.value = self.cluster.numbers()
                self.cost, self.at = time.perf_counter() - t0, time.time()
            return self.value


def render(cached: _Cached, landings: list, auth: bool, request: gr.Request | None = None) -> list:
    """[headline, replicas, shared prefixes, landings] HTML for one viewer."""
    user = getattr(request, "username", None) or ""
    viewer_salt = principal_salt("user", user, multi_user=auth)
    num = cached.get()
    decode = cached.cluster.decode

    def name_of(g) -> str:
        return V.label(g.label_ids, g.salt, g.root_h64, decode, viewer_salt, auth)

    def name_of_root(r) -> str:
        return V.label(r.label_ids, r.salt, r.h64, decode, viewer_salt, auth)

    head = (
        '<div class="kvd kvcl" id="kv-cluster-headline">'
        f'<p class="kvs">{V.headline_sentence(num, name_of)}</p>'
        f'<div class="kvn">{V.tiles_html(num)}</div></div>'
    )
    reps = (
        f'<div class="kvd kvcl" id="kv-cluster-replicas">{V.legend_html()}'
        + "".join(V.replica_html(r, name_of_root) for r in num.replicas)
        + "</div>"
    )
    shared = f'<div class="kvd kvcl" id="kv-cluster-shared">{V.shared_table(num, name_of)}</div>'
    land = (
        '<div class="kvd kvcl" id="kv-cluster-landings">'
        f"{V.landings_table(landings, viewer_salt, auth)}"
        f"{V.blind_html()}</div>"
    )
    return [head, reps, shared, land]


def build_cluster_dashboard(llm, *, tick_s: float = 1.0, auth: bool = False) -> DashboardTimers:
    """The cluster Memory tab in the current Blocks (llm: an engine.protocol.ServesReplicas); its
    timer starts when the tab is shown."""
    cluster, routing = llm.cluster_view(), llm.routing
    cluster.start()
    cached = _Cached(cluster, tick_s)
    html = dict(css_template=H.CSS + V.CLUSTER_CSS, apply_default_css=True)
    names = ", ".join(r.name for r in cluster.replicas)
    with gr.Column(elem_id="kv-dashboard-cluster"):
        gr.Markdown(
            f"### Cluster memory, live\nThis app spreads the chat over **{escape(names)}** "
            f"(routing: {escape(routing)}). Each replica's cached blocks come from its KV-event "
            "stream; usage and hit rate from its /metrics. Refreshed every second while shown."
        )
        head = gr.HTML(**html, elem_id="kv-cluster-head")
        reps = gr.HTML(**html, elem_id="kv-cluster-reps")
        shared = gr.HTML(**html, elem_id="kv-cluster-prefixes")
        land = gr.HTML(**html, elem_id="kv-cluster-land")
    outputs = [head, reps, shared, land]
    timer = gr.Timer(tick_s, active=False)

    def paint(request: gr.Request):
        return render(cached, llm.recent_landings(), auth, request)

    kw = dict(
        fn=paint,
        outputs=outputs,
        concurrency_limit=None,
        show_progress="hidden",
        api_visibility="private",
    )
    timer.tick(**kw)
    return DashboardTimers([timer], kw, tick_fns={"paint": paint})
