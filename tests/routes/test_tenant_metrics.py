"""/metrics per-tenant lines: parsed back with prometheus_client's own text parser; the label set
stays bounded (first 16 tenants by name, the rest summed into "other")."""

import pytest

from engine.core.tenancy import TenantStats
from routes.tenant_metrics import OTHER, TenantLabels, tenant_prometheus_text

parser = pytest.importorskip("prometheus_client.parser")


def _row(name, **kw):
    return TenantStats(name, 1.0, kw.pop("counter", 10.0), **kw)


def _samples(text):
    out = {}
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, s.labels.get("tenant"))] = s.value
    return out


def test_tokens_and_queue_time_per_tenant_parse_back():
    rows = [
        _row(
            "user:alice",
            prefill_tokens=120,
            decode_tokens=64,
            queue_time_s_total=1.5,
            queue_time_count=3,
        ),
        _row(
            "batch-key",
            prefill_tokens=9000,
            decode_tokens=4000,
            preemptions=2,
            running=8,
            waiting=40,
        ),
    ]
    s = _samples(tenant_prometheus_text(rows, TenantLabels()))
    assert s[("paged_chat_tenant_prompt_tokens_total", "user:alice")] == 120
    assert s[("paged_chat_tenant_generation_tokens_total", "batch-key")] == 4000
    assert s[("paged_chat_tenant_queue_time_seconds_sum", "user:alice")] == 1.5
    assert s[("paged_chat_tenant_queue_time_seconds_count", "user:alice")] == 3
    assert s[("paged_chat_tenant_preemptions_total", "batch-key")] == 2
    assert s[("paged_chat_tenant_requests_waiting", "batch-key")] == 40


def test_label_set_is_bounded_and_stable():
    labels = TenantLabels(max_labels=3)
    rows = [_row(f"t{k}", decode_tokens=k) for k in range(10)]
    s = _samples(tenant_prometheus_text(rows, labels))
    tenants = {t for (_, t) in s}
    assert tenants == {"t0", "t1", "t2", OTHER}
    assert s[("paged_chat_tenant_generation_tokens_total", OTHER)] == sum(range(3, 10))
    again = _samples(tenant_prometheus_text(list(reversed(rows)), labels))  # order changes nothing
    assert {t for (_, t) in again} == tenants
    assert again[("paged_chat_tenant_generation_tokens_total", "t2")] == 2


def test_logged_in_users_are_numbered_not_named_when_anonymous():
    labels = TenantLabels(anonymous_users=True)
    rows = [
        _row("user:alice", decode_tokens=5),
        _row("nightly", decode_tokens=7),
        _row("user:bob", decode_tokens=1),
    ]
    text = tenant_prometheus_text(rows, labels)
    assert "alice" not in text and "bob" not in text
    s = _samples(text)
    assert s[("paged_chat_tenant_generation_tokens_total", "user-1")] == 5
    assert s[("paged_chat_tenant_generation_tokens_total", "user-2")] == 1
    assert (
        s[("paged_chat_tenant_generation_tokens_total", "nightly")] == 7
    )  # key names are the operator's
