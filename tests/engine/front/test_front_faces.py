"""The engine's two faces stay narrow, and an engine option is one EngineConfig field (issue 46).

`LLM` is the vLLM-shaped batch API; `ServingLLM` adds what a chat server needs (sessions, pins,
snapshots, tenants). Each is a page a reader can hold in mind: at most 25 public members of its
own. An engine option is declared once, as an EngineConfig field: `LLM(field=...)` takes it and
app.py's command-line flags are made from the fields, so adding one touches engine/config.py only
(plus the docs)."""

import argparse
import dataclasses

import app
from engine.config import EngineConfig, add_arguments, from_args
from engine.front.llm import LLM
from engine.front.serving import ServingLLM

MAX_MEMBERS = 25


def _public(names) -> list[str]:
    return sorted(n for n in names if not n.startswith("_"))


def test_each_face_has_at_most_25_public_members_of_its_own():
    batch = _public(dir(LLM))
    serving = _public(vars(ServingLLM))
    assert len(batch) <= MAX_MEMBERS, batch
    assert len(serving) <= MAX_MEMBERS, serving
    assert {"generate", "chat", "beam_search", "submit", "abort"} <= set(batch)
    assert {"submit_chat", "pin_system_prompt", "latest_snapshot", "tenant_stats"} <= set(serving)
    assert not {"submit_chat", "pin_system_prompt", "latest_snapshot"} & set(batch)


def test_every_engine_option_is_a_flag_of_the_app_and_round_trips():
    args = app.parse_args([])
    flagged = [f for f in dataclasses.fields(EngineConfig) if f.metadata.get("flag")]
    assert len(flagged) >= 25
    missing = [f.name for f in flagged if not hasattr(args, f.name)]
    assert not missing, f"EngineConfig fields without an app flag: {missing}"
    cfg = from_args(
        app.parse_args(
            [
                "--num-blocks",
                "64",
                "--max-num-seqs",
                "3",
                "--tenant-weight",
                "a=2",
                "--no-enable-prefix-caching",
                "--speculative",
                "off",
                "--state-slots",
                "9",
            ]
        )
    )  # beside --num-blocks (issue 51)
    assert (cfg.num_blocks, cfg.max_num_seqs, cfg.tenant_weights) == (64, 3, {"a": 2.0})
    assert cfg.state_slots == 9
    assert cfg.enable_prefix_caching is False and cfg.speculative is None
    assert cfg.kv_offload_gib == "auto"  # the app's default differs from the library's (off)
    assert EngineConfig().kv_offload_gib is None


def test_a_new_field_becomes_a_flag_without_touching_the_app(monkeypatch):
    """The rule must be able to fail: a field added to the config is a flag at once."""
    from engine import config as config_module

    @dataclasses.dataclass
    class Extended(EngineConfig):
        brand_new_knob: int = config_module.opt(7, "a knob added later", type=int)

    monkeypatch.setattr(config_module, "EngineConfig", Extended)
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--brand-new-knob", "9", "--device", "cpu"])
    assert from_args(args).brand_new_knob == 9


def test_bad_flag_values_name_the_flag():
    import pytest

    with pytest.raises(ValueError, match="--kv-offload-gib"):
        from_args(app.parse_args(["--kv-offload-gib", "-1"]))
    with pytest.raises(ValueError, match="--tenant-weight"):
        from_args(app.parse_args(["--tenant-weight", "nobody"]))
