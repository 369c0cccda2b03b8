"""The UI's one fake and the real engine implement the same declared faces (engine/protocol.py):
a member the UI starts using must be added to a Protocol, the LLM and the fake together. Every
member of every Protocol is checked here, by name and by signature, on both."""

import inspect

import pytest

from engine import LLM, ServingLLM
from engine.front.model_host import ModelHost
from engine.protocol import (
    ABILITIES,
    PROTOCOLS,
    ChatEngine,
    RemoteBackend,
    ServesReplicas,
    SwitchesModels,
    protocol_members,
)
from tests.ui.fake_engine import FakeLLM

MEMBERS = sorted((p.__name__, m) for p in PROTOCOLS for m in protocol_members(p))


def _callable_member(proto, name) -> bool:
    member = inspect.getattr_static(proto, name, None)
    return callable(member) and not isinstance(member, property)


def _params(fn) -> dict:
    return {k: v for k, v in inspect.signature(fn).parameters.items() if k != "self"}


def test_every_protocol_is_runtime_checkable_and_the_fake_implements_them_all():
    fake = FakeLLM()
    for proto in PROTOCOLS:
        assert getattr(proto, "_is_runtime_protocol", False), (
            f"{proto.__name__} is not @runtime_checkable"
        )
        assert isinstance(fake, proto), f"FakeLLM does not implement {proto.__name__}"
    assert len(MEMBERS) >= 30  # the face is the whole seam, not a handful of calls


def test_the_real_llm_implements_every_ability_of_a_local_engine():
    for proto in (ChatEngine, *ABILITIES):
        if proto in (
            RemoteBackend,
            ServesReplicas,
            SwitchesModels,
        ):  # remote engines' / the model host's
            continue
        for name in protocol_members(proto):
            in_init = (
                name in ServingLLM.__init__.__code__.co_names
                or name in LLM.__init__.__code__.co_names
            )
            assert hasattr(ServingLLM, name) or in_init, (
                f"engine.ServingLLM lacks {proto.__name__}.{name}"
            )


@pytest.mark.parametrize("proto_name,name", MEMBERS)
def test_each_declared_member_has_a_compatible_signature(proto_name, name):
    proto = next(p for p in PROTOCOLS if p.__name__ == proto_name)
    impls = [FakeLLM] + (
        {RemoteBackend: [], ServesReplicas: [], SwitchesModels: [ModelHost]}.get(
            proto, [ServingLLM]
        )
    )
    for impl in impls:
        member = inspect.getattr_static(impl, name, None)
        if not _callable_member(proto, name):  # a property or a data member
            if member is None:  # set in __init__ (FakeLLM.config, LLM.admission)
                inits = {
                    n
                    for c in impl.__mro__
                    if c is not object and "__init__" in vars(c)
                    for n in c.__init__.__code__.co_names
                }
                assert name in inits, f"{impl.__name__} lacks {name}"
            continue
        assert callable(member), f"{impl.__name__}.{name} is not callable"
        want, have = _params(getattr(proto, name)), _params(getattr(impl, name))
        missing = [p for p in want if p not in have]
        assert not missing, f"{impl.__name__}.{name} lacks parameters {missing}"
        for p, spec in want.items():  # keyword-only stays keyword-only, defaults stay
            if spec.kind is inspect.Parameter.KEYWORD_ONLY:
                assert have[p].kind is inspect.Parameter.KEYWORD_ONLY, (
                    f"{impl.__name__}.{name}({p}=...)"
                )
            if spec.default is not inspect.Parameter.empty:
                assert have[p].default is not inspect.Parameter.empty, (
                    f"{impl.__name__}.{name}: {p} needs a default, as the Protocol's"
                )


def test_the_fake_answers_each_ability_consistently():
    snap = {"stats": {"used_blocks": 3}, "time": 1.0}
    fake = FakeLLM(snapshot=snap)
    assert fake.kind == "local" and fake.model_source == fake.info.source
    assert fake.stats() == snap["stats"]
    assert fake.kv_snapshot().to_json() == snap
    assert fake.latest_snapshot_bytes() == b'{"stats":{"used_blocks":3},"time":1.0}'
    fake.set_snapshot_wait(0.5)
    assert fake.snapshot_wait_s == 0.5
    assert fake.tenant_stats() == [] and fake.fairness_events() == []
    assert fake.queue_position("req-0") is None
    assert fake.config.block_size == fake.info.block_size
    fake.compile_structured("spec")
    assert fake.structured == ["spec"]
    assert fake.system_prefix_ids("a b c") == ["a", "b", "c"]
    assert fake.pin_system_prompt("shared", "a b").num_tokens == 2
    assert (
        [p.name for p in fake.pins()] == ["shared"] and fake.unpin("shared") and fake.pins() == []
    )
    with pytest.raises(ValueError):
        fake.check_pin("big", 10_000)
    assert fake.encode_prompt({"prompt_token_ids": [1, 2]}) == [1, 2]
    assert fake.admission.queued("api") == (0, 0)
    stream = fake.submit_continue([7, 8], None, [{"role": "user", "content": "hi"}], session_id="s")
    assert (
        fake.previous[-1] == [7, 8]
        and fake.submitted[-1][2] == "s"
        and stream.request_id == "req-0"
    )
    assert fake.metrics_text() is None
    fake.shutdown()
    assert fake.shut_down


def test_the_remote_engine_implements_the_chat_face_and_says_where_it_is():
    from backends.remote import RemoteEngine

    for proto in (ChatEngine, RemoteBackend):
        for name in protocol_members(proto):
            assert hasattr(RemoteEngine, name) or name in RemoteEngine.__init__.__code__.co_names, (
                f"backends.RemoteEngine lacks {proto.__name__}.{name}"
            )


def test_a_remote_backend_refuses_beam_search_json_and_continue_with_a_sentence(monkeypatch):
    """The remote engine has no beam search, grammar or in-place continue: the chat says so in
    words (gr.Error / a status line) instead of an AttributeError from deep inside a handler."""
    import asyncio

    import gradio as gr

    from backends.remote import RemoteEngine
    from ui import events
    from ui.chat import beam, handlers, reply_format
    from ui.chat.context import ChatContext

    remote = RemoteEngine.__new__(RemoteEngine)  # no server needed: only its abilities are asked
    ctx = ChatContext(llm=remote, storage=None, tabs=None)
    settings = events._settings(ctx)
    base = (0.0, 1.0, 0, 16, 1.0, -1, 1)
    with pytest.raises(gr.Error, match="Beam search runs only on the built-in engine"):
        settings(*base, beam.CHOICES[-1])
    with pytest.raises(gr.Error, match="JSON reply format runs only on the built-in engine"):
        settings(*base, beam.SAMPLE, reply_format.CHOICES[1], "")
    assert settings(*base, beam.SAMPLE)["max_tokens"] == 16  # plain sampling still goes through

    class Store:
        def get_messages(self, conv_id):
            return [
                {"role": "user", "id": 1, "token_ids": [1, 2]},
                {"role": "assistant", "id": 2, "token_ids": [3, 4]},
            ]

    ctx = ChatContext(llm=remote, storage=Store(), tabs=None)
    ctx.tab = lambda request: None
    monkeypatch.setattr(handlers, "_current_conversation", lambda ctx, request, tab: {"id": "c1"})

    async def first():
        return [out async for out in handlers.continue_reply(ctx, {}, None)]

    outs = asyncio.run(first())
    assert any(handlers.CONTINUE_UNSUPPORTED in str(o) for o in outs)
