"""Issue 48.1: an API key's priority class is the operator's (`--api-priority`, or
`--api-key NAME:KEY:PRIORITY`); a call may lower its own priority, never rise above that class.
The `[NAME:]KEY` forms keep working. Pure functions: the flood itself is
tests/api/test_api_tenants.py::test_a_key_claiming_priority_minus_1000_cannot_starve_a_chat_user."""

import pytest

from routes.openai.keys import ApiAccess, effective_priority, parse_key, split_named_key


def test_key_forms_old_and_new():
    assert parse_key("sk-plain", 1) == ("api-key-1", "sk-plain", None)
    assert parse_key("batch:sk-b", 2) == ("batch", "sk-b", None)
    assert parse_key("batch:sk:with:colons", 2) == ("batch", "sk:with:colons", None)
    assert parse_key("vip:sk-v:0", 3) == ("vip", "sk-v", 0)
    assert parse_key("low:sk-l:-5", 4) == ("low", "sk-l", -5)
    assert parse_key("odd:7", 5) == ("odd", "7", None)  # no key before the number
    assert parse_key("not a name:sk:3", 6) == ("api-key-6", "not a name:sk:3", None)
    assert split_named_key("vip:sk-v:0", 3) == ("vip", "sk-v")
    with pytest.raises(ValueError, match="-1000..1000"):
        parse_key("vip:sk-v:5000", 1)


def test_a_call_may_lower_its_class_never_raise_it():
    access = ApiAccess(["batch:sk-b", "vip:sk-v:0", "sk-plain"], default_priority=1)
    assert [access.priority_class(t) for t in ("batch", "vip", "api-key-3")] == [1, 0, 1]
    assert access.keys == ["sk-b", "sk-v", "sk-plain"]
    assert effective_priority(None, 1) == 1
    assert effective_priority(-1000, 1) == 1  # the claimed class is ignored
    assert effective_priority(0, 1) == 1
    assert effective_priority(7, 1) == 7  # lowering itself is allowed
    assert effective_priority(-3, access.priority_class("vip")) == 0


def test_app_flags_carry_the_starvation_bound_and_refuse_a_bad_key_priority(monkeypatch):
    import signal

    import app

    args = app.parse_args(["--starvation-wait", "2.5", "--api-key", "vip:sk:0"])
    assert args.starvation_wait_s == 2.5 and app.parse_args([]).starvation_wait_s == 5.0
    monkeypatch.delenv("PAGED_CHAT_API_KEYS", raising=False)
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # main() must not rewire pytest's
    with pytest.raises(SystemExit, match="-1000..1000"):  # before any model is loaded
        app.main(["--api-key", "vip:sk:5000", "--model", "/nonexistent/model.gguf"])
