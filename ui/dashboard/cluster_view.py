"""The cluster Memory tab's words and HTML, from backends.kv_cluster.ClusterNumbers (pure: strings
only, no Gradio, no sockets; tests/ui/test_cluster_view.py checks the sentences and arithmetic).

Vocabulary, one word per thing, shared with the local tab where the thing is the same:
  cached         a block holding a reusable prefix, as the replica's KV events announced it
                 (the local tab's "cached"; whether a request is using it now, events do not say)
  copied         a cached block that another replica caches too: the same prefix prefilled and
                 stored twice, what a prefix-aware router would have avoided
  not announced  the rest of the pool: free and empty blocks, and blocks a request is still filling
                 (only full blocks are hashed and announced)
The headline has the local tab's form: one plain sentence with numbers that carry their raw
values (data-k / data-v) for the browser test.
"""

from __future__ import annotations

from html import escape

from ui.dashboard.kv_math import fmt_bytes

GRID_CELLS = 512  # at most this many cells per replica; more blocks share a cell
LABEL_WORDS = 9
CLUSTER_CSS = """
.kvcl .kvcg { display: grid; grid-template-columns: repeat(auto-fill, 11px); gap: 2px;
  margin: 4px 0 2px; }
.kvcl .kvcg i { width: 11px; height: 11px; border-radius: 2px; display: block; }
.kvcl i.cc { background: var(--kv-cached); } .kvcl i.cp { background: #f59e0b; }
.kvcl i.cn { background: var(--kv-free); } .kvcl i.t0 { margin-left: 5px; }
.kvcl .kvcr { border: 1px solid var(--border-color-primary, #e5e7eb); border-radius: 6px;
  padding: 6px 8px; margin: 6px 0; }
.kvcl .kvcr h4 { margin: 0 0 2px; }
.kvcl .legend b { display: inline-block; width: 12px; height: 12px; border-radius: 2px;
  vertical-align: -2px; margin: 0 4px 0 10px; }
"""
BLIND = (
    (
        "How many requests use a cached block right now: engines do not publish reference counts, "
        "so a cached block may be in use or free and reusable (the replica's own KV usage below "
        "counts the blocks running requests hold)."
    ),
    "Which request's block table points at which block: block tables are not published.",
    "Blocks a request is still filling: only full blocks are hashed and announced.",
    (
        "Blocks cached before this app started listening, when the replica's replay buffer no "
        "longer has their events (each replica's line says if it joined late)."
    ),
)


def _n(key: str, value, text: str) -> str:
    return f'<b data-k="{key}" data-v="{value}">{escape(text)}</b>'


def _count(key: str, value: int) -> str:
    return _n(key, value, format(value, ","))


def visible(salt: tuple, viewer_salt: str | None, auth: bool) -> bool:
    """May this viewer read a prefix's words? Without --auth: yes. With it: only a prefix salted
    with the viewer's own cache salt (this app salts every turn per user: engine/kv/salt_rule.py);
    anyone else's, and unsalted traffic from other clients, is shown by its hash only."""
    if not auth:
        return True
    return viewer_salt is not None and viewer_salt in salt


def label(
    label_ids, salt: tuple, root_h64: int, decode, viewer_salt: str | None, auth: bool
) -> str:
    """'"You are a careful assistant for a…"' from the prefix's first token ids, else its hash."""
    tag = f"prefix {root_h64 & 0xFFFFFFFF:08x}"
    if not visible(salt, viewer_salt, auth):
        return f"{tag} (another user's or client's; its words are not shown)"
    text = decode(label_ids) if (decode is not None and label_ids) else None
    if not text:
        return tag
    words = " ".join(text.split()).split(" ")
    short = " ".join(words[:LABEL_WORDS]) + ("…" if len(words) > LABEL_WORDS else "")
    return f"“{short}”"


def headline_numbers(num) -> dict:
    """The numbers of the headline sentence (data-k names), from ClusterNumbers."""
    reps = [r for r in num.replicas if r.has_events]
    bpb = [r.block_bytes for r in reps if r.block_bytes]
    top = num.shared[0] if num.shared else None
    return {
        "replicas": len(num.replicas),
        "with_events": len(reps),
        "held_blocks": num.held_blocks,
        "unique_blocks": num.unique_blocks,
        "avoidable_blocks": num.avoidable_blocks,
        "avoidable_bytes": num.avoidable_blocks * (sum(bpb) / len(bpb)) if bpb else None,
        "top_tokens": top.tokens_on_all if top else 0,
        "top_copies": top.copies if top else 0,
        "top_blocks": top.blocks_on_all if top else 0,
        "events_per_s": sum(r.events_per_s for r in reps),
    }


def headline_sentence(num, name_of) -> str:
    """'One 512-token prefix (“…”) is held by all 3 replicas: 3 copies, 2 of them a router
    could avoid. The 3 replicas cache …' (HTML). name_of(shared_prefix) -> its label."""
    n = headline_numbers(num)
    if not n["with_events"]:
        return (
            "No KV events yet: start each replica with KV events on and give this app "
            "--backend-kv-events for it (docs/SCALE_OUT.md); until then only /metrics is shown."
        )
    held = (
        f"The {n['with_events']} replica{'s' if n['with_events'] != 1 else ''} cache "
        f"{_count('held_blocks', n['held_blocks'])} blocks"
    )
    if not n["avoidable_blocks"]:
        if n["with_events"] == 1:
            return f"{held}. With one replica listened to, nothing can be cached twice."
        return (
            f"{held}, none of them on more than one replica: a prefix-aware router would "
            "save nothing now."
        )
    top = num.shared[0]
    everyone = top.copies == n["with_events"]
    who = (
        ("both" if top.copies == 2 else f"all {top.copies}")
        if everyone
        else f"{top.copies} of the {n['with_events']}"
    )
    s = (
        f"One {_count('top_tokens', n['top_tokens'])}-token prefix "
        f"({escape(name_of(top))}) is held by {_n('top_copies', top.copies, who)} replicas: "
        f"{top.copies} copies, {_count('top_avoidable', top.copies - 1)} of them a "
        f"router could avoid. "
    )
    gib = (
        f" ({_n('avoidable_bytes', int(n['avoidable_bytes']), fmt_bytes(n['avoidable_bytes']))})"
        if n["avoidable_bytes"] is not None
        else ""
    )
    s += (
        f"{held}; {_count('avoidable_blocks', n['avoidable_blocks'])}"
        f"{gib} of them are copies of a block another replica already holds, which a prefix-aware "
        f"router would not have made."
    )
    return s


def tiles_html(num) -> str:
    n = headline_numbers(num)
    gib = fmt_bytes(n["avoidable_bytes"]) if n["avoidable_bytes"] is not None else "size unknown"
    items = [
        ("replicas", "Replicas", f"{n['replicas']}", f"{n['with_events']} with KV events"),
        ("held", "Cached blocks", f"{n['held_blocks']:,}", "summed over replicas"),
        ("distinct", "Distinct blocks", f"{n['unique_blocks']:,}", "cached somewhere"),
        ("copies", "Copies a router could avoid", f"{n['avoidable_blocks']:,}", gib),
        ("eps", "Events per second", f"{n['events_per_s']:,.1f}", "all replicas, last 10 s"),
    ]
    return "".join(
        f'<div data-k="{k}"><div class="l">{escape(lab)}</div><div class="v">{escape(v)}</div>'
        f'<div class="s">{escape(sub)}</div></div>'
        for k, lab, v, sub in items
    )


def _cells(r, name_of_root) -> list[tuple[str, int, str]]:
    """Runs (class, blocks, title) of one replica's grid: its largest prefix trees first (copied
    blocks, then those cached only here), the other trees, then the blocks not announced."""
    runs = []
    seen_b = seen_c = 0
    for k, root in enumerate(
        sorted(r.roots, key=lambda x: (-x.copied, -x.blocks))
    ):  # copied trees first
        t0 = " t0" if k else ""
        title = name_of_root(root)
        if root.copied:
            runs.append(("cp" + t0, root.copied, f"copied: {title}"))
            t0 = ""
        if root.blocks - root.copied:
            runs.append(("cc" + t0, root.blocks - root.copied, f"cached here only: {title}"))
        seen_b, seen_c = seen_b + root.blocks, seen_c + root.copied
    rest_c, rest = r.copied_blocks - seen_c, r.blocks - seen_b
    if rest_c > 0:
        runs.append(("cp t0", rest_c, "copied: smaller prefix trees"))
    if rest - rest_c > 0:
        runs.append(("cc t0", rest - rest_c, "cached here only: smaller prefix trees"))
    if r.pool_blocks and r.pool_blocks > r.blocks:
        runs.append(("cn t0", r.pool_blocks - r.blocks, "not announced: free, or being filled"))
    return runs


def grid_html(r, name_of_root) -> str:
    runs = _cells(r, name_of_root)
    total = sum(n for _, n, _ in runs)
    per = max(1, -(-total // GRID_CELLS))
    out = []
    for cls, n, title in runs:
        cells = max(1, round(n / per))
        t = escape(f"{title} ({n:,} block{'s' if n != 1 else ''})", quote=True)
        out.append(
            f'<i class="{cls}" title="{t}"></i>'
            + f'<i class="{cls.split()[0]}" title="{t}"></i>' * (cells - 1)
        )
    note = f" (one cell = {per:,} blocks)" if per > 1 else " (one cell = one block)"
    return (
        f'<div class="kvcg" data-per="{per}">{"".join(out)}</div>'
        f'<div class="muted">{escape(note.strip())}</div>'
    )


def replica_html(r, name_of_root) -> str:
    pool = (
        f"{_count('pool_blocks', r.pool_blocks)} blocks in its pool"
        if r.pool_blocks
        else "pool size not in its /metrics"
    )
    usage = "KV usage (its /metrics): " + (
        _n("kv_usage", r.kv_usage, f"{100 * r.kv_usage:.1f} %")
        + (
            f" = {r.kv_usage * r.pool_blocks:,.0f} blocks held by running requests"
            if r.pool_blocks
            else ""
        )
        if r.kv_usage is not None
        else "not exposed"
    )
    hit = f"; prefix-cache hit rate {100 * r.hit_rate:.1f} %" if r.hit_rate is not None else ""
    head = f"<h4>{escape(r.name)}</h4>"
    name = escape(r.name, quote=True)
    if not r.has_events:
        return (
            f'<div class="kvcr" data-replica="{name}">{head}<div>{usage}{hit}. '
            f"No KV events for this replica (give --backend-kv-events for it).</div></div>"
        )
    size = f", {r.block_size} tokens each" if r.block_size else ""
    bpb = f" ({fmt_bytes(r.blocks * r.block_bytes)})" if r.block_bytes else ""
    media = ", ".join(f"{m} {n:,}" for m, n in r.by_medium.items())
    kinds = (
        "; by layer-group kind: " + ", ".join(f"{k} {n:,}" for k, n in r.kinds.items())
        if r.kinds
        else ""
    )
    salted = f"; {r.salted_blocks:,} under a cache salt" if r.salted_blocks else ""
    last = (
        f", the last {r.last_event_age_s:,.0f} s ago"
        if r.last_event_age_s is not None
        else ", none yet"
    )
    c = r.counts
    state = []
    if r.error:
        state.append(f"listener: {r.error}")
    if r.joined_late:
        state.append(
            "joined late: blocks cached before the replay buffer's first batch are not shown"
        )
    for k, one, many in (
        ("gaps", "sequence gap", "sequence gaps"),
        ("lost_batches", "batch lost", "batches lost"),
        ("restarts", "engine restart", "engine restarts"),
        ("malformed", "malformed message skipped", "malformed messages skipped"),
        ("bad_events", "unreadable event skipped", "unreadable events skipped"),
        ("unknown", "event of an unknown kind skipped", "events of an unknown kind skipped"),
        ("cleared", "clear-all event", "clear-all events"),
        ("removed_unknown", "removal of a block never seen", "removals of blocks never seen"),
        ("dropped_over_limit", "block over the model's limit", "blocks over the model's limit"),
    ):
        if c.get(k):
            state.append(f"{c[k]:,} {one if c[k] == 1 else many}")
    return (
        f'<div class="kvcr" data-replica="{name}" data-blocks="{r.blocks}">{head}'
        f"<div>{_count('replica_blocks', r.blocks)} cached blocks{size}{bpb} of {pool}; "
        f"{r.copied_blocks:,} of them copied on another replica. "
        f"By medium: {escape(media or 'none')}{kinds}{salted}. "
        f"{usage}{hit}. {r.events_per_s:,.1f} events/s{last}.</div>{grid_html(r, name_of_root)}"
        + (f'<div class="muted">{escape("; ".join(state))}.</div>' if state else "")
        + "</div>"
    )


def legend_html() -> str:
    return (
        '<div class="legend muted"><b style="background:#f59e0b"></b>copied (also cached on '
        'another replica)<b style="background:var(--kv-cached)"></b>cached here only'
        '<b style="background:var(--kv-free)"></b>not announced (free, or a block still being '
        "filled) · a gap starts another prefix tree; hover a cell for its prefix</div>"
    )


def shared_table(num, name_of) -> str:
    if not num.shared:
        return '<div class="muted">No prefix is cached on more than one replica.</div>'
    rows = "".join(
        f"<tr><td>{escape(name_of(g))}</td><td>{escape(', '.join(g.holders))}</td>"
        f"<td>{g.copies}</td><td>{g.blocks_on_all:,}</td><td>{g.tokens_on_all:,}</td>"
        f"<td>{g.avoidable_blocks:,}</td></tr>"
        for g in num.shared
    )
    return (
        '<h4>Prefixes cached on several replicas</h4><div class="scroll"><table><tr>'
        "<th>prefix (first words)</th><th>held by</th><th>copies</th><th>blocks each</th>"
        f"<th>tokens each</th><th>avoidable blocks</th></tr>{rows}</table></div>"
        '<div class="muted">avoidable blocks: the copies beyond the first, which a prefix-aware '
        "router would not have made.</div>"
    )


def _or(value, missing: str) -> str:
    return missing if value is None else f"{value:,}"


def landings_table(
    landings: list[dict], viewer_salt: str | None, auth: bool, limit: int = 8
) -> str:
    """Where the latest chat turns landed (under --auth: the viewer's own turns only)."""
    mine = [
        x
        for x in landings
        if not auth or (viewer_salt is not None and x.get("salt") == viewer_salt)
    ]
    if not mine:
        return '<div class="muted">No chat turn has finished on the cluster yet.</div>'
    rows = "".join(
        f"<tr><td>{escape(str(x['replica']))}</td><td>{_or(x['prompt_tokens'], '?')}</td>"
        f"<td>{_or(x['cached_tokens'], 'not reported')}</td></tr>"
        for x in list(mine)[-limit:][::-1]
    )
    return (
        "<h4>Where your latest turns landed</h4><table><tr><th>replica</th><th>prompt tokens</th>"
        f"<th>of them cached there</th></tr>{rows}</table>"
    )


def blind_html() -> str:
    items = "".join(f"<li>{escape(b)}</li>" for b in BLIND)
    return f'<div class="muted"><b>What KV events cannot say:</b><ul>{items}</ul></div>'
