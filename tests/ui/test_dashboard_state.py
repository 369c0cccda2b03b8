"""What is not KV on the Memory tab (ui/dashboard/state_view.py and its wiring in page.py /
panels.py), from REAL engines: a tiny random-weight Qwen3.5 (three linear-attention layers, one
attention layer) and a tiny Qwen3-MoE (8 experts, 2 per token), shrunk from the shipped configs as
tests/engine/hybrid_helpers.py builds them. Every number the section shows is read back from its
data-v and compared with the engine's snapshot / ModelInfo or with the shipped configs' own fields,
never with a constant; the section is absent for a plain model; nothing a user typed is markup."""

import dataclasses
import re
import time
from html import unescape

import pytest

from engine import SamplingParams
from engine.exec import dummy_weights as dw
from engine.front.request_stream import collect
from engine.observe.viewer_scope import scope_snapshot
from tests.engine.exec import hybrid_helpers as HH
from ui.dashboard import page as D
from ui.dashboard import state_view as S
from ui.dashboard.history import History
from ui.dashboard.kv_math import fmt_bytes, shape_of

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
LONG = SamplingParams(temperature=0.0, max_tokens=300, ignore_eos=True)
EVIL = '<img src=x onerror="alert(1)">'


def _snap(llm):
    return llm.run_on_engine(lambda eng: eng.kv_snapshot().to_json())  # what /api/kv serves


def _values(html: str) -> dict:
    return {k: v for k, v in re.findall(r'data-k="([^"]+)" data-v="([^"]*)"', html)}


@pytest.fixture(scope="module")
def hybrid():
    """One Qwen3.5 engine: a chat parked between turns (session id with markup in it), a second
    prompt on the same 32-token prefix (a checkpoint hit), and a snapshot taken while a third
    request runs."""
    llm = HH.make_llm("qwen3_5", num_blocks=40)
    try:
        a = HH.prompt(1, 40)
        collect(llm.submit({"prompt_token_ids": a}, GREEDY, session_id="chat<b>1"), GREEDY)
        collect(llm.submit({"prompt_token_ids": a[:32] + HH.prompt(2, 5)}, GREEDY), GREEDY)
        stream = llm.submit({"prompt_token_ids": HH.prompt(3, 20)}, LONG)
        snap = _snap(llm)
        deadline = time.monotonic() + 60
        while not any(s["state"] == "running" for s in snap["sequences"]):
            assert time.monotonic() < deadline, "the long request never ran"
            snap = _snap(llm)
        stream.abort()
        yield llm, snap, llm.model_info()
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def moe():
    llm = HH.make_llm("qwen3_moe", num_blocks=24)
    try:
        collect(llm.submit({"prompt_token_ids": HH.prompt(4, 20)}, GREEDY, session_id="m"), GREEDY)
        yield llm, _snap(llm), llm.model_info()
    finally:
        llm.shutdown()


def test_state_slots_holders_and_checkpoints_equal_the_snapshot(hybrid):
    _, snap, info = hybrid
    sg, slots = snap["stats"]["state_groups"], snap["state_slots"]
    html = S.state_html(snap, info, shape_of(info), 44)
    v = _values(html)
    assert v["state_slots_used"] == str(sg["state_slots_used"]) == str(len(slots))
    assert v["state_slots_total"] == str(sg["state_slots_total"])
    assert int(v["state_bytes_used"]) == sum(s["bytes"] for s in slots)
    assert {s["bytes"] for s in slots} == {info.state_bytes_per_slot}
    assert fmt_bytes(info.state_bytes_per_slot) in html  # one slot's size, in a unit that fits
    running = {s["seq_id"] for s in snap["sequences"] if s["state"] == "running"}
    parked = {s["session_id"] for s in snap["sequences"] if s["state"] == "idle_session"}
    held = [h for s in slots for h in s["holders"]]
    assert int(v["state_running"]) == sum(h in running for h in held) >= 1
    assert int(v["state_between_turns"]) == sum(h in parked for h in held) >= 1
    checkpoints = [s for s in slots if s["holders"] == ["checkpoint"]]
    assert int(v["state_checkpoints"]) == len(checkpoints) >= 1
    assert int(v["state_checkpoint_uses"]) == sum(s["checkpoint_uses"] for s in checkpoints)
    assert int(v["state_checkpoint_hits"]) == sg["state_checkpoint_hits"] >= 1
    for s in slots:  # one row per held slot, its tokens and bytes
        row = re.search(rf'<tr data-k="state_slot_{s["slot"]}">(.*?)</tr>', html).group(1)
        assert f"<td>{s['tokens']:,}</td>" in row and fmt_bytes(s["bytes"]) in row


def test_the_arithmetic_is_the_live_models_and_the_shipped_configs(hybrid):
    _, snap, info = hybrid
    html = unescape(S.state_html(snap, info, shape_of(info), 44))
    att, lin = info.layer_mixers.count("attention"), info.layer_mixers.count("linear")
    assert (att, lin) == (1, 3)
    live = re.search(r'data-k="state_arith_live">(.*?)</li>', html).group(1)
    # the pool's KV per token (attention layers only) x the chat, and one slot for the linear ones
    kv = fmt_bytes(info.kv_bytes_per_token * 44)
    assert f"{att} attention layer keeps all 44 tokens ({kv})" in live
    assert f"{lin} linear-attention layers keep a fixed state" in live
    assert f"({fmt_bytes(info.state_bytes_per_slot)})" in live
    every = (att + lin) * 44 * info.kv_bytes_per_token // att
    assert f"instead of {fmt_bytes(every)} with attention in every layer" in live
    # Qwen3.5-0.8B vs Qwen3-0.6B at 32,768 tokens, from the configs' own fields (bf16)
    q35, q3 = dw.load_config("qwen3.5-0.8b"), dw.load_config("qwen3-0.6b")
    kinds = q35.layer_types
    n_att, n_lin = kinds.count("full_attention"), kinds.count("linear_attention")
    kv35 = n_att * 32768 * 2 * q35.num_key_value_heads * q35.head_dim * 2
    conv = 2 * q35.linear_num_key_heads * q35.linear_key_head_dim
    conv += q35.linear_num_value_heads * q35.linear_value_head_dim
    state = n_lin * (
        q35.linear_num_value_heads * q35.linear_key_head_dim * q35.linear_value_head_dim * 4
        + conv * (q35.linear_conv_kernel_dim - 1) * 2
    )
    peer = q3.num_hidden_layers * 32768 * 2 * q3.num_key_value_heads * q3.head_dim * 2
    ref = re.search(r'data-k="state_arith_ref">(.*?)</li>', html).group(1)
    assert ref.startswith(f"Qwen3.5-0.8B, a 32,768-token chat: {n_att} attention layers keep")
    assert f"{(kv35 + state) / 2**20:,.0f} MiB instead of" in ref
    assert f"Qwen3-0.6B, about the same size with attention in all {q3.num_hidden_layers}" in ref
    assert f"holds {peer / 2**20:,.0f} MiB" in ref
    assert f"{peer / (kv35 + state):.1f}x more" in ref


def test_moe_line_and_absent_sections(moe, hybrid):
    _, snap, info = moe
    assert snap["stats"]["state_groups"] == {}
    html = S.state_html(snap, info, shape_of(info))
    assert "kvstate" not in html and "Linear-attention" not in html  # no state groups
    line = re.search(r'<p data-k="moe_line" data-read="(\d+)" data-held="(\d+)">(.*?)</p>', html)
    assert (int(line.group(1)), int(line.group(2))) == (
        info.weights_read_per_token_bytes,
        info.weights_bytes,
    )
    e, k = info.experts
    assert f"({k} of {e} experts per layer" in line.group(3)
    assert fmt_bytes(info.weights_read_per_token_bytes) in line.group(3)
    # a plain model (no experts, no state groups): nothing at all; the hybrid has no MoE line
    assert S.state_html(snap, dataclasses.replace(info, experts=()), shape_of(info)) == ""
    _, hsnap, hinfo = hybrid
    assert "moe_line" not in S.state_html(hsnap, hinfo, shape_of(hinfo))


def test_what_users_typed_is_text_and_others_chats_are_not_named(hybrid):
    _, snap, info = hybrid
    sid = next(s["session_id"] for s in snap["sequences"] if s["state"] == "idle_session")
    scoped = scope_snapshot(snap, titles={sid: EVIL}, viewer=None)
    html = S.state_html(scoped, info, shape_of(info))
    assert "<img" not in html and "&lt;img" in html
    assert "<b>1" not in S.state_html(snap, info, shape_of(info))  # the id itself, escaped
    # --auth, a viewer owning none of these chats: holders are "another chat", never an id
    theirs = scope_snapshot(snap, titles={}, viewer="eve", auth=True)
    ids = {str(s[k]) for s in snap["sequences"] for k in ("seq_id", "session_id") if s[k]}
    held = {str(h) for v in theirs["state_slots"] for h in v["holders"]}
    assert ids and not ids & held and held <= {"checkpoint", "another chat"}  # /api/kv's too
    html = S.state_html(theirs, info, shape_of(info))
    assert "another chat" in html and "chat&lt;b&gt;1" not in html and "req-" not in html
    assert int(_values(html)["state_running"]) == int(_values(html)["state_between_turns"]) == 0


def test_the_memory_tab_shows_it_in_the_headline_and_the_chat_row(hybrid):
    llm, snap, info = hybrid
    state = D.DashboardState(llm)
    assert state.info == info
    base = D.render_base(snap, History(), state.shape, None, state.info)
    assert 'class="kvd kvstate"' in base["headline"]
    key = next(s["session_id"] for s in snap["sequences"] if s["state"] == "idle_session")
    out = state.view(snap, key, None)
    note = f"+ 1 state slot ({fmt_bytes(info.state_bytes_per_slot)})"
    assert note in out["tables"]
