"""app.py's small helpers: flags, --auth parsing, what counts as a local bind, progress bar."""

import pytest

import app


def test_defaults_bind_locally_without_share_or_auth():
    a = app.parse_args([])
    assert (a.host, a.port, a.block_size, a.db, a.share, a.auth) == (
        "127.0.0.1",
        7860,
        16,
        "data/chat.db",
        False,
        None,
    )
    assert a.num_blocks is None and a.kv_cache_gib is None and a.max_num_seqs == 64


def test_pool_size_flags_are_mutually_exclusive():
    assert app.parse_args(["--num-blocks", "512"]).num_blocks == 512
    assert app.parse_args(["--kv-cache-gib", "0.5"]).kv_cache_gib == 0.5
    with pytest.raises(SystemExit):
        app.parse_args(["--num-blocks", "512", "--kv-cache-gib", "1"])


def test_kv_cache_dtype_flag_defaults_to_auto_and_takes_vllms_values():
    assert app.parse_args([]).kv_cache_dtype == "auto"
    for v in ("float32", "bfloat16", "float16", "int8", "fp8"):
        assert app.parse_args(["--kv-cache-dtype", v]).kv_cache_dtype == v
    with pytest.raises(SystemExit):
        app.parse_args(["--kv-cache-dtype", "int4"])


def test_max_num_batched_tokens_flag_defaults_to_the_engines_choice():
    assert app.parse_args([]).max_num_batched_tokens is None  # engine/config.py: 512 CPU, 8192 CUDA
    assert app.parse_args(["--max-num-batched-tokens", "8192"]).max_num_batched_tokens == 8192


def test_kv_cache_rotation_flag():
    assert app.parse_args([]).kv_cache_rotation == "auto"
    assert app.parse_args(["--kv-cache-rotation", "none"]).kv_cache_rotation == "none"
    with pytest.raises(SystemExit):
        app.parse_args(["--kv-cache-rotation", "random"])


def test_auth_pairs():
    assert app.parse_auth(None) is None
    assert app.parse_auth(["alice:pw", "bob:a:b"]) == [("alice", "pw"), ("bob", "a:b")]
    for bad in (["alice"], [":pw"], ["alice:"]):
        with pytest.raises(SystemExit):
            app.parse_auth(bad)


def test_local_hosts():
    assert app.is_local("127.0.0.1") and app.is_local("localhost") and app.is_local("::1")
    assert (
        not app.is_local("0.0.0.0")
        and not app.is_local("192.168.1.5")
        and not app.is_local("example.org")
    )


def test_non_local_host_without_auth_warns(monkeypatch, capsys):
    class Stop(Exception):
        pass

    def no_engine(*a, **k):
        raise Stop

    monkeypatch.setattr("engine.front.model_host.ModelHost", no_engine)
    monkeypatch.setattr(app.signal, "signal", lambda *a: None)  # leave pytest's handlers alone
    with pytest.raises(Stop):
        app.main(["--host", "0.0.0.0"])
    assert "WARNING" in capsys.readouterr().err


def test_progress_bar(capsys):
    app.terminal_progress(0.5, "reading weights")
    app.terminal_progress(1.0, "loaded")
    err = capsys.readouterr().err
    assert "[###############...............]  50%  reading weights" in err and err.endswith("\n")
