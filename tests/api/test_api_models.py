"""/v1/models on an app with several models (issue 45 item 5), through the official `openai` client:
the served model first, the others listed as loadable; after a switch the API serves the new one
under its name and refuses the old name with a 404 that says which model is served."""

import openai
import pytest

from engine import SamplingParams
from engine.config import EngineConfig
from engine.front.model_host import ModelHost, model_catalog
from tests.api.conftest import LiveServer, build_server_app
from tests.tiny_models import hf_greedy, save_tiny_llama


@pytest.fixture(scope="module")
def host(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("api-models")
    refs = {
        name: save_tiny_llama(root / name, tokenizer, kv_heads=k, seed=k)
        for name, k in (("alpha", 2), ("beta", 4))
    }
    h = ModelHost(
        model_catalog([str(root / "alpha"), str(root / "beta")]),
        EngineConfig(num_blocks=64, device="cpu", dtype="float32"),
    )
    server = LiveServer(build_server_app(h))
    yield h, openai.OpenAI(base_url=server.url + "v1", api_key="none"), refs
    server.stop()
    h.shutdown()


def test_models_lists_the_loadable_ones_and_follows_a_switch(host):
    h, client, refs = host
    listed = client.models.list().data
    assert [m.id for m in listed] == ["alpha", "beta"]
    assert [m.model_extra["loaded"] for m in listed] == [True, False]
    prompt = list(range(5, 25))
    out = client.completions.create(model="alpha", prompt=prompt, max_tokens=6, temperature=0)
    assert out.model == "alpha" and out.usage.completion_tokens == 6
    h.switch_model("beta")
    assert [m.id for m in client.models.list().data] == ["beta", "alpha"]
    with pytest.raises(openai.NotFoundError, match="serves 'beta'"):
        client.completions.create(model="alpha", prompt=prompt, max_tokens=6, temperature=0)
    out = client.completions.create(model="beta", prompt=prompt, max_tokens=6, temperature=0)
    direct = h.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=6))[
        0
    ]
    assert direct.outputs[0].token_ids == hf_greedy(refs["beta"], prompt, 6)  # beta's own weights
    assert out.choices[0].text == direct.outputs[0].text
