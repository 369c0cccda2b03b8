"""The "who is served" panel's names: by name without --auth, only the viewer by name with it."""

from engine.core.tenancy import TenantStats
from ui.dashboard.who import Namer, event_lines, who_html
from engine.core.tenancy import FairnessEvent


def _row(name, **kw):
    return TenantStats(name, 1.0, kw.pop("counter", 5.0), **kw)


ROWS = [
    _row("user:alice", decode_tokens=3, running=1),
    _row("user:bob", decode_tokens=9),
    _row("nightly", waiting=4, prefill_tokens=50),
    _row("local", prefill_tokens=30),
    _row("demo-user-3", decode_tokens=1),
    _row("idle-key"),
]


def test_under_auth_only_the_viewer_is_named():
    html = who_html(ROWS, "user:bob", auth=True)
    assert "you (bob)" in html and "alice" not in html and "nightly" not in html
    assert "another user (1)" in html and "an API client (1)" in html and "demo user 3" in html
    assert "idle-key" not in html and "an API client (2)" not in html  # never served: no row


def test_without_auth_every_tenant_by_name():
    html = who_html(ROWS, "local", auth=False)
    assert (
        "you (this machine)" in html and "API key &#x27;nightly&#x27;" in html and "alice" in html
    )


def test_feed_lines_use_the_viewers_names_and_only_new_events():
    ev = [
        FairnessEvent(10.0, "fair_preempt", "nightly", "user:alice", ""),
        FairnessEvent(11.0, "held_back", "user:alice", "user:bob", ""),
    ]
    lines, last = event_lines(ev, 10.0, "user:bob", True, [r.tenant for r in ROWS])
    assert last == 11.0 and lines == [
        "scheduler held another user (1) back to serve you (bob) "
        "(fair share: another user (1) had received more)"
    ]
    assert Namer(["user:alice"], "user:bob", True)("user:alice") == "another user (1)"


def test_a_starvation_preemption_has_its_feed_line():
    ev = [FairnessEvent(5.0, "starvation_preempt", "user:alice", "nightly", "")]
    lines, _ = event_lines(ev, 0.0, "user:alice", True, [r.tenant for r in ROWS])
    assert lines == [
        "scheduler paused a reply of you (alice) so an API client (2), "
        "waiting past the time bound, could start"
    ]
