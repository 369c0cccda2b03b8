"""Per-tenant lines for /metrics: tokens served, queue time, counters, preemptions (fair scheduler).

The label set is bounded: the first `max_labels` tenants seen keep their own `tenant` label for
the life of the process, every later one is summed into tenant="other", so a server with many
users or keys cannot blow up a Prometheus database, and counters never go backwards (a tenant
never moves between labels). Names are what the scheduler uses: the API key's name, api, local,
demo-user-K; never a key itself. /metrics needs no login, so logged-in users (user:NAME under
--auth) are labelled "user-<k>" (numbered as first seen), never by name (docs/SECURITY.md).
"""

from __future__ import annotations

import threading

from engine.core.tenancy import TenantStats
from engine.protocol import ServesTenants

OTHER = "other"
USER_PREFIX = "user:"
MAX_LABELS = 16


# (metric, type, help, value of a row); summed over the tenants that share a label
_SERIES = (
    (
        "paged_chat_tenant_prompt_tokens_total",
        "counter",
        "Prompt tokens computed for the tenant (prefix-cache hits excluded).",
        lambda r: r.prefill_tokens,
    ),
    (
        "paged_chat_tenant_generation_tokens_total",
        "counter",
        "Decode tokens computed for the tenant.",
        lambda r: r.decode_tokens,
    ),
    (
        "paged_chat_tenant_preemptions_total",
        "counter",
        "Preemptions the tenant's sequences suffered.",
        lambda r: r.preemptions,
    ),
    (
        "paged_chat_tenant_requests_running",
        "gauge",
        "Running sequences of the tenant.",
        lambda r: r.running,
    ),
    (
        "paged_chat_tenant_requests_waiting",
        "gauge",
        "Waiting sequences of the tenant.",
        lambda r: r.waiting,
    ),
    (
        "paged_chat_tenant_virtual_counter",
        "gauge",
        "The tenant's virtual token counter (weighted service received; engine/core/fairness.py).",
        lambda r: r.counter,
    ),
)


def _num(v) -> str:
    return str(v) if isinstance(v, int) else repr(float(v))


def _label(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class TenantLabels:
    """First come, first labelled; the rest are "other". Thread-safe."""

    def __init__(self, max_labels: int = MAX_LABELS, anonymous_users: bool = False):
        self.max_labels, self.anonymous_users = max_labels, anonymous_users
        self._named: dict[str, str] = {}
        self._users = 0
        self._lock = threading.Lock()

    def __call__(self, tenant: str) -> str:
        with self._lock:
            if tenant in self._named:
                return self._named[tenant]
            if len(self._named) >= self.max_labels:
                return OTHER
            label = tenant
            if self.anonymous_users and tenant.startswith(USER_PREFIX):
                self._users += 1
                label = f"user-{self._users}"
            self._named[tenant] = label
            return label


def tenant_prometheus_text(rows: list[TenantStats], labels: TenantLabels) -> str:
    grouped: dict[str, list[TenantStats]] = {}
    for r in rows:
        grouped.setdefault(labels(r.tenant), []).append(r)
    if not grouped:
        return ""
    lines = []
    for name, kind, help_, fn in _SERIES:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        for label, rs in grouped.items():
            vals = [fn(r) for r in rs]
            v = max(vals) if name == "paged_chat_tenant_virtual_counter" else sum(vals)
            lines.append(f'{name}{{tenant="{_label(label)}"}} {_num(v)}')
    q = "paged_chat_tenant_queue_time_seconds"
    lines += [
        f"# HELP {q} Seconds the tenant's requests waited from arrival to first admission.",
        f"# TYPE {q} summary",
    ]
    for label, rs in grouped.items():
        lines.append(
            f'{q}_sum{{tenant="{_label(label)}"}} {_num(float(sum(r.queue_time_s_total for r in rs)))}'
        )
        lines.append(
            f'{q}_count{{tenant="{_label(label)}"}} {_num(sum(r.queue_time_count for r in rs))}'
        )
    return "\n".join(lines) + "\n"


def tenant_metrics_source(llm, max_labels: int = MAX_LABELS, anonymous_users: bool = False):
    """A callable for app.state.extra_metrics, or None when the engine reports no tenants."""
    if not isinstance(llm, ServesTenants):
        return None
    labels = TenantLabels(max_labels, anonymous_users)
    return lambda: tenant_prometheus_text(llm.tenant_stats(), labels)
