"""Pinned system prompts on the real engine: greedy output with a pinned prefix equals HF, chats
attach to the pinned blocks and compute only their own tokens, and the pin outlives them."""

from engine import SamplingParams
from engine.text.chat_tokens import encode_chat
from storage.presets import DEFAULT_SYSTEM_PROMPT


def test_greedy_with_pinned_prefix_matches_hf_and_pin_outlives_chats(make_llm, hf_greedy):
    llm = make_llm(num_blocks=400)
    info = llm.pin_system_prompt("default", DEFAULT_SYSTEM_PROMPT)
    prefix = llm.system_prefix_ids(DEFAULT_SYSTEM_PROMPT)
    assert info.num_blocks == len(prefix) // 16 >= 30
    st = llm.stats()
    assert st["pinned_blocks"] == info.num_blocks == st["used_blocks"]
    computed_before = st["prompt_tokens_computed_total"]
    chats = [
        [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": q}]
        for q in ("What is a hash table?", "Write a haiku about memory.")
    ]
    outs = llm.chat(chats, SamplingParams(temperature=0.0, max_tokens=12))
    for conv, out in zip(chats, outs):
        ids = encode_chat(llm.tokenizer, conv)
        assert out.prompt_token_ids[: len(prefix)] == prefix
        assert out.outputs[0].token_ids == hf_greedy(ids, 12, draft=out.outputs[0].token_ids)
        assert len(out.prompt_token_ids) > info.num_tokens
    st = llm.stats()
    own = sum(len(o.prompt_token_ids) - info.num_tokens for o in outs)
    assert st["prompt_tokens_computed_total"] - computed_before == own  # only their own tokens
    snap = llm.snapshot()
    assert [snap["blocks"]["state"][b] for b in info.block_ids] == ["pinned"] * info.num_blocks
    assert all(snap["blocks"]["ref_count"][b] == 1 for b in info.block_ids)  # chats gone, pin stays
    assert llm.unpin("default")
    assert llm.stats()["pinned_blocks"] == 0


def test_saving_a_prompt_past_the_cap_or_too_long_is_refused_before_any_prefill(make_llm, tmp_path):
    import pytest

    from engine.kv.pinning import PinCapError
    from storage import Storage
    from ui.chat.prompt_pins import PromptPins

    llm = make_llm(num_blocks=100, max_model_len=1024)  # cap: 10 blocks; prompt limit: 256 tokens
    pins = PromptPins(llm, Storage(tmp_path / "chat.db"))
    with pytest.raises(ValueError, match="at most 256"):
        pins.check(None, DEFAULT_SYSTEM_PROMPT)  # ~550 tokens
    medium = "Be brief. " * 60  # ~180 tokens: 11 blocks > 10
    with pytest.raises(PinCapError, match="pin cap"):
        pins.check(None, medium)
    with pytest.raises(PinCapError):
        llm.pin_system_prompt("shared", medium)
    assert llm.stats()["prompt_tokens_computed_total"] == 0  # refused before prefilling anything
    ntok, nblocks = pins.check("alice", "Be brief. " * 20)
    pins.pin("alice", "Be brief. " * 20)
    assert llm.stats()["pinned_blocks"] == nblocks == ntok // 16
    assert llm.unpin("user:alice")


def test_start_up_re_pins_every_users_own_prompt_newest_first_within_the_cap(
    make_llm, tmp_path, capsys
):
    """Under --auth each user's saved prompt has its own pin; after a restart those pins come back
    (not only when a prompt is saved again), newest first while the pin cap allows."""
    from storage import Storage
    from ui.chat.prompt_pins import PromptPins

    db = tmp_path / "chat.db"
    first = Storage(db)
    first.set_system_prompt("You are short. " * 3)  # the app's: about one block
    first.set_system_prompt("Carol's rules: be kind. " * 12, owner="carol")  # oldest
    first.set_system_prompt("Alice wants pirate talk. " * 12, owner="alice")
    first.set_system_prompt("Bob likes haiku answers. " * 12, owner="bob")  # newest
    first.close()
    llm = make_llm(num_blocks=100, max_model_len=1024)  # pin cap: 10 blocks
    PromptPins(llm, Storage(db)).pin_startup().join(timeout=120)
    names = {p.name: p.num_blocks for p in llm.pins()}
    assert "user:bob" in names and "user:alice" in names  # the newest two fit (4 blocks each)
    assert "user:carol" not in names  # the cap is kept: the oldest waits
    assert sum(names.values()) <= 10
    assert "carol's shared prompt is not pinned" in capsys.readouterr().out
    for name in names:
        assert llm.unpin(name)


def test_a_prompt_shorter_than_a_block_pins_nothing_and_releases_the_old_pin(make_llm, tmp_path):
    """A 13-token system prompt has no full block to share: saving it is no error (no traceback,
    nothing in `errors`), and the previous prompt's pinned blocks are released, not held for a
    prompt no chat uses any more."""
    from storage import Storage
    from ui.chat.prompt_pins import PromptPins

    llm = make_llm(num_blocks=100, max_model_len=1024)
    pins = PromptPins(llm, Storage(tmp_path / "chat.db"))
    pins.pin(None, "Be brief. " * 20)
    assert llm.stats()["pinned_blocks"] > 0
    short = "Be brief."
    ntok, nblocks = pins.measure(short)
    assert nblocks == 0 and 0 < ntok < 16
    pins.pin_async(None, short).join(timeout=60)
    assert pins.errors == []
    assert llm.pins() == [] and llm.stats()["pinned_blocks"] == 0 == llm.stats()["used_blocks"]
    assert "shorter than one 16-token block: nothing to pin" in pins.events[-1]
