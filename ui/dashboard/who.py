"""The Memory tab's "who is served" panel: per tenant, what runs and waits, its share of the
tokens computed in the last minute, its virtual counter and the preemptions it suffered, from the
fair scheduler's rows (engine/core/tenancy.py TenantStats, published by the engine every 0.5 s).

Names follow the dashboard's privacy rules (engine/observe/viewer_scope.py): without --auth every tenant
is shown by name (demo users as "demo user K", "local" as this machine's user, API keys by their
name); with --auth a viewer sees their own row by name and every other user or key only as
"another user (k)" / "an API client (k)" (users and clients numbered separately, in name order),
and the server's own work (pinning the shared prompt) as "the server".
"""

from __future__ import annotations

from html import escape

USER_PREFIX = "user:"


def viewer_tenant(username: str | None, auth: bool) -> str:
    """The tenant a dashboard viewer's own chats run as (ui/chat/context.ChatContext.tenant)."""
    return f"{USER_PREFIX}{username}" if auth and username else "local"


class Namer:
    """Display names for one viewer, stable within one render."""

    def __init__(self, tenants, viewer: str, auth: bool):
        self.viewer, self.auth = viewer, auth
        others = sorted(
            t for t in tenants if t != viewer and not t.startswith("demo-user-") and t != "local"
        )
        users = [t for t in others if t.startswith(USER_PREFIX)]
        clients = [t for t in others if not t.startswith(USER_PREFIX)]
        self._anon = {t: k + 1 for group in (users, clients) for k, t in enumerate(group)}

    def __call__(self, tenant: str) -> str:
        if tenant.startswith("demo-user-"):
            return f"demo user {tenant.rsplit('-', 1)[-1]}"
        if tenant == self.viewer:
            return (
                f"you ({tenant[len(USER_PREFIX) :]})"
                if tenant.startswith(USER_PREFIX)
                else "you (this machine)"
            )
        if self.auth:
            if tenant == "local":
                return "the server (shared prompts)"
            kind = "another user" if tenant.startswith(USER_PREFIX) else "an API client"
            return f"{kind} ({self._anon.get(tenant, 0)})"
        if tenant == "api":
            return "API (no key)"
        if tenant == "local":
            return "this machine"
        return (
            tenant[len(USER_PREFIX) :] if tenant.startswith(USER_PREFIX) else f"API key '{tenant}'"
        )


# each column's one-line explanation, on hover (issue 47: "counter", "held back" were unexplained)
HEADERS = (
    ("who", "Whose requests: you, other users (numbered), API clients, demo users"),
    ("running", "Requests of theirs in the batch now"),
    ("waiting", "Requests of theirs waiting for a slot"),
    ("share (1 min)", "Their part of the tokens computed in the last minute"),
    (
        "counter",
        "Tokens served to them so far, weighted (prefill and decode); the fair scheduler admits "
        "the waiting request of whoever has the smallest counter",
    ),
    ("weight", "Their weight (--tenant-weight): a weight of 2 gets twice the share"),
    ("preempted", "How often their replies were paused to free memory for others"),
    (
        "held back",
        "How often a request of theirs waited so that someone below their fair share went first",
    ),
    ("mean wait", "Mean time their requests waited before starting"),
)


def served(rows) -> list:
    """The rows worth a line: tenants that run, wait or were ever served (the same set names the
    feed's tenants, so "another user (2)" is the same person in both)."""
    return [r for r in rows if r.running or r.waiting or r.prefill_tokens or r.decode_tokens]


def who_html(rows, viewer: str, auth: bool, policy: str = "fair") -> str:
    if policy != "fair":
        return (
            '<div class="kvd"><h4>Who is served</h4><div class="muted">First-come first-served '
            '(--scheduling-policy fcfs): no per-user accounting.</div></div>'
        )
    active = served(rows)
    if not active:
        return (
            '<div class="kvd"><h4>Who is served</h4><div class="muted">Nobody has been served '
            'yet.</div></div>'
        )
    name = Namer([r.tenant for r in active], viewer, auth)
    head = (
        "<tr>"
        + "".join(f'<th title="{escape(tip, quote=True)}">{name}</th>' for name, tip in HEADERS)
        + "</tr>"
    )
    body = []
    for r in sorted(active, key=lambda r: (-r.share_last_minute, -r.counter)):
        wait = f"{r.queue_time_s_total / r.queue_time_count:.2f} s" if r.queue_time_count else "–"
        cur = ' class="cur"' if r.tenant == viewer else ""
        body.append(
            f'<tr{cur} data-tenant="{escape(name(r.tenant))}"><td>{escape(name(r.tenant))}</td>'
            f'<td data-v="{r.running}">{r.running}</td><td data-v="{r.waiting}">{r.waiting}</td>'
            f'<td data-v="{r.share_last_minute:.4f}">{r.share_last_minute * 100:.0f}%</td>'
            f'<td data-v="{r.counter:.1f}">{r.counter:,.0f}</td><td>{r.weight:g}</td>'
            f'<td data-v="{r.preemptions}">{r.preemptions}</td><td data-v="{r.held_back}">{r.held_back}</td>'
            f"<td>{wait}</td></tr>"
        )
    return (
        '<div class="kvd kvwho"><h4>Who is served</h4><div class="scroll"><table>'
        + head
        + "".join(body)
        + '</table></div><div class="muted">Fair scheduling: waiting requests are admitted from the '
        "user with the smallest counter (tokens served, weighted); a user above their fair share "
        "of slots or memory yields to one below it.</div></div>"
    )


def event_lines(events, since: float, viewer: str, auth: bool, tenants) -> tuple[list[str], float]:
    """Feed lines for the scheduler's decisions newer than `since`, in this viewer's names."""
    name = Namer(list(tenants), viewer, auth)
    lines, last = [], since
    for e in events:
        if e.t <= since:
            continue
        last = max(last, e.t)
        if e.kind == "held_back":
            lines.append(
                f"scheduler held {name(e.tenant)} back to serve {name(e.favoured)} "
                f"(fair share: {name(e.tenant)} had received more)"
            )
        elif e.kind == "fair_preempt":
            lines.append(
                f"scheduler paused a reply of {name(e.tenant)} (above its fair share) "
                f"so {name(e.favoured)} could start"
            )
        elif e.kind == "starvation_preempt":
            lines.append(
                f"scheduler paused a reply of {name(e.tenant)} so {name(e.favoured)}, "
                "waiting past the time bound, could start"
            )
    return lines, last
