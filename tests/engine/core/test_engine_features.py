"""Engine behaviour on the real model: n>1 copy-on-write, sessions, abort, streaming, bad input."""

import asyncio

import pytest

from engine import SamplingParams
from engine.core.sequence import Request

CHAT = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Name three colours of the rainbow."},
]


def _prompt(llm_or_engine, chat=CHAT):
    from engine.text.session_prompt import continue_session_prompt

    return continue_session_prompt(llm_or_engine.tokenizer, chat, None)


def _engine(num_blocks):
    """A bare synchronous LLMEngine (no thread, no LLM front): the test steps it by hand."""
    from engine.config import EngineConfig
    from engine.core.llm_engine import LLMEngine
    from engine.exec.loader import load_model

    return LLMEngine(EngineConfig(num_blocks=num_blocks), load_model(None))


def test_n_greater_than_one_shares_prompt_blocks_copy_on_write(hf_greedy):
    e = _engine(128)
    ids = _prompt(e)
    n = 3
    e.add_request(Request("fork", ids, SamplingParams(n=n, temperature=0, max_tokens=12)))
    # step until the fork happened, then look at the block tables
    while not e.requests["fork"].forked:
        e.step()
    snap, parent_table = e.snapshot(), list(e.kv.block_table("fork#0"))
    tables = {s["seq_id"]: s["block_table"] for s in snap["sequences"]}
    assert len([k for k in tables if k and k.startswith("fork#")]) == n
    refs = snap["blocks"]["ref_count"]
    full_prompt_blocks = len(ids) // 16
    for b in parent_table[:full_prompt_blocks]:
        assert refs[b] == n, "prompt blocks must be shared by all n children, not copied"
    # let it finish: every block comes back
    while e.has_unfinished():
        e.step()
    assert e.stats()["used_blocks"] == 0


def test_n_children_collect_through_generate(make_llm, hf_greedy):
    llm = make_llm(num_blocks=128)
    out = llm.chat(CHAT, SamplingParams(n=2, temperature=0, max_tokens=12))[0]
    ref = hf_greedy(out.prompt_token_ids, 12, draft=out.outputs[0].token_ids)
    assert [o.token_ids for o in out.outputs] == [ref, ref]
    sampled = llm.chat(CHAT, SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12))[0]
    assert len({tuple(o.token_ids) for o in sampled.outputs}) > 1, (
        "children must sample independently"
    )


def test_seeded_sampling_is_reproducible_whatever_the_batch(make_llm):
    llm = make_llm(num_blocks=256)
    p = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=16)
    alone = llm.chat(CHAT, p)[0].outputs[0].token_ids
    others = [[{"role": "user", "content": f"Tell me about the number {i}."}] for i in range(4)]
    batch = llm.chat(others + [CHAT], [SamplingParams(temperature=1.0, max_tokens=20)] * 4 + [p])
    assert batch[-1].outputs[0].token_ids == alone


def test_session_reuses_previous_turn_and_matches_hf(make_llm, hf_greedy):
    llm = make_llm(num_blocks=256)
    p = SamplingParams(temperature=0, max_tokens=16)
    s1 = llm.submit_chat(CHAT, p, session_id="conv")
    d1 = list(s1)
    reply = "".join(d.text for d in d1)
    turn1_ids = s1.prompt_ids + [t for d in d1 for t in d.token_ids]
    chat2 = CHAT + [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And two more?"},
    ]
    s2 = llm.submit_chat(chat2, p, session_id="conv")
    d2 = list(s2)
    assert s2.prompt_ids[: len(turn1_ids)] == turn1_ids, "turn 2 must start with turn 1's exact ids"
    cached = d2[-1].metrics["cached_tokens"]
    assert cached == len(turn1_ids) - 1, (
        "only the new turn is prefilled (plus the last sampled token)"
    )
    got = [t for d in d2 for t in d.token_ids]
    assert got == hf_greedy(s2.prompt_ids, 16, draft=got)
    assert llm.stats()["used_blocks"] > 0  # the idle conversation holds its blocks
    assert llm.end_session("conv")
    assert llm.stats()["used_blocks"] == 0


def test_abort_releases_blocks_and_others_continue(make_llm):
    llm = make_llm(num_blocks=256)
    long = llm.submit_chat(CHAT, SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
    short = llm.submit_chat(CHAT, SamplingParams(temperature=0, max_tokens=8))
    it = iter(long)
    for _ in range(3):
        next(it)
    long.abort()
    rest = list(it)
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    short_out = list(short)
    assert short_out[-1].finish_reason in ("stop", "length")
    assert llm.stats()["used_blocks"] == 0


def test_async_streaming(make_llm):
    llm = make_llm(num_blocks=256)

    async def go():
        async def one(i):
            s = llm.submit_chat(CHAT, SamplingParams(temperature=0, max_tokens=6))
            return [d async for d in s]

        return await asyncio.gather(*(one(i) for i in range(3)))

    results = asyncio.run(go())
    texts = {"".join(d.text for d in r) for r in results}
    assert len(texts) == 1 and all(r[-1].finished for r in results)


def test_bad_input_fails_that_request_only(make_llm):
    llm = make_llm(num_blocks=64, max_model_len=256)
    ok = llm.submit_chat(CHAT, SamplingParams(temperature=0, max_tokens=8))
    with pytest.raises(ValueError, match="empty"):
        llm.generate("", SamplingParams())
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate({"prompt_token_ids": [42] * 300}, SamplingParams())
    with pytest.raises(ValueError, match="vocabulary"):
        llm.generate({"prompt_token_ids": [10**7]}, SamplingParams())
    for bad in (
        {"temperature": -1},
        {"top_p": 0},
        {"top_k": 0},
        {"max_tokens": 0},
        {"n": 0},
        {"min_p": 2},
        {"repetition_penalty": 0},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)
    assert list(ok)[-1].finish_reason in ("stop", "length")
    assert llm.stats()["used_blocks"] == 0


def test_generation_stops_at_max_model_len(make_llm):
    llm = make_llm(num_blocks=64, max_model_len=48)
    out = llm.generate(
        {"prompt_token_ids": _prompt(llm)[:40]},
        SamplingParams(temperature=0, max_tokens=100, ignore_eos=True),
    )[0]
    assert out.outputs[0].finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 48


def test_unknown_model_path_and_architecture(tmp_path):
    from engine import ServingLLM
    from engine.exec.loader import ModelLoadError

    with pytest.raises(ModelLoadError, match="not found"):
        ServingLLM(model=str(tmp_path / "nope"))
    (tmp_path / "config.json").write_text(
        '{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}'
    )
    with pytest.raises(ModelLoadError, match="GPT2LMHeadModel"):
        ServingLLM(model=str(tmp_path))


def test_engines_of_one_process_share_a_tokenizer_until_its_files_change(model_folder, tmp_path):
    """engine/exec/loader.py reads a folder's tokenizer once per process; a changed file reads anew."""
    import json
    import os
    import shutil
    from engine.exec.loader import load_model

    folder = tmp_path / "m"
    shutil.copytree(model_folder, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    os.symlink(os.path.join(model_folder, "model.safetensors"), folder / "model.safetensors")
    first, second = load_model(str(folder)), load_model(str(folder))
    assert second.tokenizer is first.tokenizer
    assert second.weights is not first.weights  # weights are the engine's own
    cfg = folder / "tokenizer_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "model_max_length": 4096}))
    third = load_model(str(folder))
    assert third.tokenizer is not first.tokenizer and third.tokenizer.model_max_length == 4096
    assert third.tokenizer.encode("Hello, world") == first.tokenizer.encode("Hello, world")


def test_engines_of_one_checkpoint_share_prepared_weights_not_state(make_llm, hf_greedy):
    """engine/exec/models/llama_weights.py: a second engine of the same checkpoint and form reuses
    the packed linears (no second reorder); its layer dicts, lean step and pool are its own, and
    another form (int8) is prepared anew. Both engines still answer exactly as HF."""
    a, b = make_llm(num_blocks=64), make_llm(num_blocks=64)
    ma, mb = a.engine.runner.model, b.engine.runner.model
    assert ma.layers[0]["qkv"] is mb.layers[0]["qkv"] and ma.lm_head_linear is mb.lm_head_linear
    assert ma.layers is not mb.layers and ma.layers[0] is not mb.layers[0]
    assert ma.lean is not mb.lean and a.engine.runner.kv_pool is not b.engine.runner.kv_pool
    ids = _prompt(a)[:24]
    for llm in (a, b):
        out = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=8))[
            0
        ]
        assert out.outputs[0].token_ids == hf_greedy(ids, 8, draft=out.outputs[0].token_ids)
    c = make_llm(num_blocks=64, quantization="int8")
    assert c.engine.runner.model.layers[0]["qkv"] is not ma.layers[0]["qkv"]


def test_engine_error_fails_running_requests_without_leaking(make_llm, hf_greedy):
    """Fault injection: one forward raises; its requests end with an error, blocks come back,
    and the engine keeps serving new requests."""
    from engine.exec.model_runner import ModelRunner

    llm = make_llm(num_blocks=128)
    real_run = ModelRunner.run_on_device
    calls = {"n": 0}

    def flaky(self, plan):  # patched on the class: no reach into the LLM
        reqs = {row.seq.request.request_id for row in plan.rows}
        if len(reqs) == 2 and not calls["n"]:  # both requests in one step, before the n=2 fork
            calls["n"] += 1
            raise RuntimeError("injected failure")
        return real_run(self, plan)

    ModelRunner.run_on_device = flaky
    try:
        streams = [
            llm.submit_chat(CHAT, SamplingParams(temperature=0, max_tokens=20, n=n)) for n in (1, 2)
        ]
        finals = [[d for d in s if d.finished] for s in streams]
    finally:
        ModelRunner.run_on_device = real_run
    assert [len(f) for f in finals] == [1, 2], "every one of the n outputs must be closed"
    assert all(d.finish_reason == "error" and "injected" in d.error for f in finals for d in f), (
        finals
    )
    assert llm.stats()["used_blocks"] == 0 and llm.stats()["running"] == 0
    # the failed step's blocks were hashed when scheduled but never written: no stale prefix hits
    again = llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=8))[0]
    assert again.outputs[0].token_ids == hf_greedy(
        again.prompt_token_ids, 8, draft=again.outputs[0].token_ids
    )


def test_generate_admits_a_whole_batch_in_one_step(make_llm):
    llm = make_llm(num_blocks=256, max_num_seqs=16)
    prompts = [{"prompt_token_ids": [1, 100 + i, 200 + i, 300 + i]} for i in range(12)]
    before = llm.stats()["steps"]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    st = llm.stats()
    assert st["peak_running"] == 12
    assert st["steps"] - before == 3  # one prefill step that also samples, then 2 decodes


def test_shutdown_closes_streams_in_flight_and_refuses_new_work(make_llm):
    from engine import ServingLLM

    llm = ServingLLM(num_blocks=64)
    stream = llm.submit_chat(CHAT, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    llm.shutdown()
    last = list(stream)[-1]  # must end, not block forever
    assert last.finished and last.finish_reason in ("error", "length", "stop")
    with pytest.raises(RuntimeError, match="shut down"):
        llm.submit_chat(CHAT, SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="shut down"):
        llm.stats()


def test_a_vanished_async_consumer_does_not_hurt_other_requests(make_llm):
    llm = make_llm(num_blocks=128)

    async def leave_early():
        s = llm.submit_chat(CHAT, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
        async for _ in s:
            break  # the event loop closes with the request running

    other = llm.submit_chat(CHAT, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    asyncio.run(leave_early())
    deltas = list(other)
    assert deltas[-1].finish_reason == "length" and deltas[-1].error is None
    st = llm.stats()
    assert st["running"] == 0 and st["waiting"] == 0 and st["used_blocks"] == 0


def test_end_session_during_a_turn_frees_instead_of_parking(make_llm):
    llm = make_llm(num_blocks=128)
    s = llm.submit_chat(
        CHAT, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True), session_id="tab"
    )
    it = iter(s)
    first = next(it)
    llm.end_session("tab")
    rest = list(it)
    assert llm.stats()["num_idle_sessions"] == 0 and llm.stats()["used_blocks"] == 0
    # released, not forgotten: the session keeps the turn's exact ids (prompt + reply)
    assert llm.session_token_ids("tab") == s.prompt_ids + [
        t for d in [first, *rest] for t in d.token_ids
    ]
    assert llm.close_session("tab") is False and llm.session_token_ids("tab") is None


def test_n_children_count_against_max_num_seqs(make_llm):
    llm = make_llm(num_blocks=256, max_num_seqs=4)
    outs = llm.chat([CHAT] * 3, SamplingParams(n=2, temperature=0.7, seed=3, max_tokens=6))
    assert all(len(o.outputs) == 2 for o in outs)
    assert llm.stats()["peak_running"] <= 4


def test_two_engines_in_one_process_step_concurrently(make_llm, hf_greedy):
    """Each engine thread keeps its own kernel scratch state: concurrent steps must not mix."""
    import threading

    a, b = make_llm(num_blocks=128), make_llm(num_blocks=96)
    chats = {
        "a": [{"role": "user", "content": "Count from one to ten."}],
        "b": [{"role": "user", "content": "Name a famous painter."}],
    }
    out = {}

    def go(name, llm):
        out[name] = llm.chat(
            [chats[name]] * 3, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
        )

    threads = [threading.Thread(target=go, args=(k, v)) for k, v in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in ("a", "b"):
        for o in out[name]:
            assert o.outputs[0].token_ids == hf_greedy(
                o.prompt_token_ids, 16, stop_at_eos=False, draft=o.outputs[0].token_ids
            )
