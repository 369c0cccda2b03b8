"""Switching the served model at run time (engine/front/model_host.py; issue 45 item 5): two tiny
random-weight checkpoints of different shapes, the real engine on each, HF as the reference."""

import os

import pytest
from engine import SamplingParams
from engine.config import EngineConfig
from engine.exec.loader import ModelLoadError
from engine.front.model_host import ModelChoice, ModelHost, model_catalog
from engine.protocol import ChatEngine, PinsPrompts, ServesCompletions, SwitchesModels
from tests.tiny_models import hf_greedy, save_tiny_llama

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def two_models(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("models")
    a = save_tiny_llama(root / "alpha", tokenizer, kv_heads=2, seed=1)
    b = save_tiny_llama(root / "beta", tokenizer, kv_heads=4, seed=2)
    bad = root / "broken"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "no-such-architecture"}')
    return root, a, b


def test_switch_serves_the_new_model_and_keeps_serving_after_a_refused_one(two_models):
    root, hf_a, hf_b = two_models
    catalog = model_catalog([str(root / "alpha"), str(root / "beta"), str(root / "broken")])
    assert [c.name for c in catalog] == ["alpha", "beta", "broken"]
    host = ModelHost(catalog, EngineConfig(num_blocks=64, device="cpu", dtype="float32"))
    seen = []
    host.on_switch(seen.append)
    try:
        for proto in (ChatEngine, PinsPrompts, ServesCompletions, SwitchesModels):
            assert isinstance(host, proto)
        prompt = list(range(3, 30))
        assert host.generate({"prompt_token_ids": prompt}, GREEDY)[0].outputs[
            0
        ].token_ids == hf_greedy(hf_a, prompt)
        per_token_a = host.stats()["kv_bytes_per_token"]
        stream = host.submit(
            {"prompt_token_ids": prompt},  # in flight on alpha when we switch
            SamplingParams(temperature=0, max_tokens=200, ignore_eos=True),
        )
        line = host.switch_model("beta")
        assert host.current_model() == "beta" and line.startswith("now serving beta")
        assert "64 blocks" in line and len(seen) == 1
        last = list(stream)[-1]
        assert last.finished  # closed, not left hanging
        assert host.stats()["kv_bytes_per_token"] == 2 * per_token_a  # 4 KV heads instead of 2
        assert host.generate({"prompt_token_ids": prompt}, GREEDY)[0].outputs[
            0
        ].token_ids == hf_greedy(hf_b, prompt)
        with pytest.raises(ModelLoadError, match="cannot read config"):
            host.switch_model("broken")
        assert host.current_model() == "beta" and len(seen) == 1  # still serving, nothing fired
        assert host.generate({"prompt_token_ids": prompt}, GREEDY)[0].outputs[
            0
        ].token_ids == hf_greedy(hf_b, prompt)
        with pytest.raises(ValueError, match="not one of this app's models"):
            host.switch_model("gamma")
    finally:
        host.shutdown()


def test_catalog_of_a_folder_of_ggufs_and_of_nothing(tmp_path):
    d = tmp_path / "ggufs"
    d.mkdir()
    for name in ("b.gguf", "a.gguf"):
        (d / name).write_bytes(b"GGUF")
    assert [c.name for c in model_catalog([str(d)])] == ["a.gguf", "b.gguf"]
    assert model_catalog(None) == [ModelChoice("SmolLM2-135M-Instruct (bundled)", None)]
    other = tmp_path / "x"
    other.mkdir()
    (other / "a.gguf").write_bytes(b"GGUF")
    names = [c.name for c in model_catalog([str(d), str(other)])]
    assert (
        len(set(names)) == 3 and os.path.join(str(other), "a.gguf") in names
    )  # same name: the path
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        model_catalog([str(tmp_path / "empty")])
