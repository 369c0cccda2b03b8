"""Every family we run, shrunk from its shipped config (engine/exec/configs/) to 2-4 layers that keep
its layer kinds, norms, RoPE kinds and windows, with seeded random weights: greedy through the whole
engine must be HF transformers' fp32 greedy, token for token, on each path.

One workload per engine (`_workload`): a 70-token prompt (longer than the 24-token windows) prefilled
in 32-token chunks, then a prompt sharing its first 64 tokens (a prefix hit reaching past the
window: the cached blocks outside the window are read, and masked, by the sliding layers), then a
burst of four on a pool that cannot hold them (preemption and recompute). Every reply is checked
against one HF forward over prompt + reply (each token must be HF's argmax after the ones before).
Paths: the default engine (lean C++ step for decode, C++ fused loop for prefill chunks), the loop
alone, the eager torch loop, speculative decoding, Triton kernels (interpreted), the KV tier, beam
search (against HF's beam search). int8 KV and the CUDA fused loop are checked at the model level.
"""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.exec import dummy_weights as dw
from engine.exec.models.llama import AttentionMetadata, LlamaModel
from tests.engine.exec.helpers import A, FAMILIES, SHRINK, random_prompt

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
BURST = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


B = A[:64] + random_prompt(2, 6)  # 4 full blocks in common with A
BURST_PROMPTS = [random_prompt(10 + i, 40) for i in range(4)]


_HF = {}


def hf_model(family):
    if family not in _HF:
        name, over = FAMILIES[family]
        cfg = dw.load_config(name, {**SHRINK, **over})
        _HF[family] = dw.hf_model_with_weights(cfg, dw.random_weights(cfg, seed=0))
    return _HF[family]


def assert_hf_greedy(family, prompt, tokens):
    """Each generated token is HF's argmax after the prompt and the tokens before it."""
    x = torch.tensor([list(prompt) + list(tokens[:-1])])
    with torch.no_grad():
        want = hf_model(family)(x).logits[0, len(prompt) - 1 :].argmax(-1).tolist()
    assert list(tokens) == want, f"{family}: engine {list(tokens)} != HF {want}"


# With KV cache groups (engine/kv/cache_spec.py) a block holds P layer slots, not every layer, and a
# sliding window's blocks go back to the pool: these pools (the bytes of 12 one-table blocks, or
# fewer where windows alone would hold the burst) keep the workload's shape: A fits alone, the
# burst does not.
POOL_BLOCKS = {"gemma3": 48, "qwen2-window": 36, "mistral": 6}


def make(family, **kw):
    name, over = FAMILIES[family]
    kw.setdefault("num_blocks", POOL_BLOCKS.get(family, 12))
    return LLM(
        model=name,
        load_format="dummy",
        hf_overrides={**SHRINK, **over},
        seed=0,
        device="cpu",
        block_size=16,
        max_num_batched_tokens=32,
        **kw,
    )


def _workload(family, llm):
    """The three steps of the module docstring; returns the stats after them."""
    for prompts, params in (([A], GREEDY), ([B], GREEDY), (BURST_PROMPTS, BURST)):
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        for p, o in zip(prompts, outs):
            assert_hf_greedy(family, p, o.outputs[0].token_ids)
    st = llm.stats()
    assert st["prefix_cache_hits"] >= 64, st
    assert st["num_preemptions"] > 0, st
    if (
        family in POOL_BLOCKS and llm.config.kv_cache_groups
    ):  # a window's blocks went back to the pool
        assert st["window_released_blocks"] > 0 and st["num_groups"] == len(st["kv_groups"]), st
    return st


def _lean_calls(llm, monkeypatch):
    model = llm.engine.runner.model
    calls = []
    if model.lean is not None:
        real = model.lean.__class__.__call__
        monkeypatch.setattr(
            model.lean.__class__,
            "__call__",
            lambda self, *a, **k: (calls.append(1), real(self, *a, **k))[1],
        )
    return calls


@pytest.mark.parametrize("family", list(FAMILIES))
def test_default_engine_matches_hf(family, monkeypatch):
    """Lean C++ step for the decode steps, the C++ fused loop for the prefill chunks and recomputes."""
    llm = make(family)
    try:
        calls = _lean_calls(llm, monkeypatch)
        assert "lean C++ step" in llm.model_info().compute_path, llm.model_info().compute_path
        _workload(family, llm)
        assert calls, "the lean step never ran"
    finally:
        llm.shutdown()


@pytest.mark.parametrize(
    "family,path",
    [
        ("gemma3", "loop"),
        ("smollm3", "loop"),
        ("gemma3", "eager"),
        ("phi4", "eager"),
        ("qwen2-window", "loop"),
        ("mistral", "eager"),
    ],
)
def test_loops_match_hf(family, path):
    """The C++ fused loop for every step (lean off), and the eager torch loop."""
    llm = make(family, lean_step="off")
    try:
        if path == "eager":
            llm.engine.runner.model.use_cpu_fused = False
        _workload(family, llm)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("family", ["gemma3", "smollm3", "mistral"])
def test_speculative_matches_hf(family):
    """ngram drafts on every step: verification chunks of k + 1 tokens over windowed layers."""
    llm = make(family, speculative="ngram", speculative_adaptive=False, num_blocks=24)
    try:
        rep = random_prompt(5, 12) * 5  # repeats: the proposer finds drafts
        for p in (rep, A):
            out = llm.generate(
                [{"prompt_token_ids": p}],
                SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),
            )[0]
            assert_hf_greedy(family, p, out.outputs[0].token_ids)
        assert llm.stats()["spec_draft_tokens"] > 0, llm.stats()
    finally:
        llm.shutdown()


def test_triton_kernels_match_hf():
    """Triton attention and KV store (interpreted on CPU) under the eager loop, Gemma 3's window mix."""
    llm = make("gemma3", attention_backend="triton", num_blocks=24)
    try:
        outs = [
            llm.generate(
                [{"prompt_token_ids": p}],
                SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
            )[0]
            for p in (A, B)
        ]
        assert llm.stats()["prefix_cache_hits"] >= 64
        for p, o in zip((A, B), outs):
            assert_hf_greedy("gemma3", p, o.outputs[0].token_ids)
    finally:
        llm.shutdown()


def test_kv_tier_matches_hf(tmp_path):
    """Blocks written back to the second tier and loaded again hold a window model's KV exactly."""
    llm = make("gemma3", kv_offload_gib=0.05, kv_offload_dir=str(tmp_path))
    try:
        st = _workload("gemma3", llm)
        out = llm.generate([{"prompt_token_ids": A + [7, 8]}], GREEDY)[
            0
        ]  # A's blocks: from the tier
        assert_hf_greedy("gemma3", A + [7, 8], out.outputs[0].token_ids)
        st = llm.stats()
        assert st["tier_hits_blocks"] > 0, st
    finally:
        llm.shutdown()


def test_beam_search_matches_hf():
    from engine.core.beam_search import BeamSearchParams

    llm = make("gemma3", num_blocks=32)
    try:
        out = llm.beam_search(
            [{"prompt_token_ids": A}], BeamSearchParams(beam_width=2, max_tokens=8, ignore_eos=True)
        )[0]
        with torch.no_grad():
            r = hf_model("gemma3").generate(
                torch.tensor([A]),
                attention_mask=torch.ones(1, len(A), dtype=torch.long),
                max_new_tokens=8,
                num_beams=2,
                num_return_sequences=2,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        assert [list(s.token_ids) for s in out.sequences] == [
            r[i, len(A) :].tolist() for i in range(2)
        ]
    finally:
        llm.shutdown()


def _model(family, **kw):
    name, over = FAMILIES[family]
    cfg = dw.load_config(name, {**SHRINK, **over})
    return cfg, LlamaModel(
        cfg,
        dw.random_weights(cfg, seed=0),
        kw.pop("dtype", torch.float32),
        "cpu",
        max_positions=128,
        **kw,
    )


def _steps(model, ids, chunks, pool):
    """Prefill then decode `ids` as one sequence in the given chunk sizes; logits of every token."""
    bs = pool.shape[3]
    table = torch.arange(1, pool.shape[2], dtype=torch.int32).flip(0)[None]
    out, start = [], 0
    for n in chunks:
        end = start + n
        slots = torch.tensor([int(table[0, p // bs]) * bs + p % bs for p in range(start, end)])
        meta = AttentionMetadata(
            slots,
            table,
            torch.tensor([end], dtype=torch.int32),
            torch.tensor([0, n], dtype=torch.int32),
            n,
            "torch",
        )
        out.append(
            model.forward(
                torch.tensor(ids[start:end]), torch.arange(start, end), pool, meta, torch.arange(n)
            )
        )
        start = end
    return torch.cat(out)


@pytest.mark.parametrize("family,n", [("gemma3", 50), ("phi4", 28)])
def test_logits_within_1e4_of_hf_and_phi_short_factors(family, n):
    """fp32 logits of an n-token prefill and three decode steps within 1e-4 of HF's. Phi: an engine
    that holds at most the original 32 positions must use the short LongRoPE factors (as HF does for
    any sequence within the original context), not the long ones the engine tests exercise (there
    every prompt is longer than 32, and HF too switches to the long factors)."""
    _, m = _model(family, rope_context=32 if family == "phi4" else None)
    ids = A[: n + 3]
    pool = torch.full((2, m.num_layers, 6, 16, m.num_kv_heads, m.head_dim), float("nan"))
    ours = _steps(m, ids, [n, 1, 1, 1], pool)
    with torch.no_grad():
        ref = hf_model(family)(torch.tensor([ids])).logits[0]
    assert (ours - ref).abs().max().item() < 1e-4
    assert ref.std() > 0.05


def test_int8_kv_lean_step_reads_and_writes_like_the_loop():
    """An int8 pool (rotated) under Gemma 3's window mix: the lean step's logits stay close to the
    loop's and pick the same tokens (codes may differ by one step, as for Llama; see
    tests/kernels/test_cpu_lean_step.py)."""
    from kernels import kv_quant

    ids = A[:60]
    res = []
    for lean in ("off", "on"):
        _, m = _model("gemma3", lean_step=lean)
        m.kv_rotation = kv_quant.hadamard(m.head_dim)
        pool = torch.zeros(
            2,
            m.num_layers,
            6,
            16,
            m.num_kv_heads,
            kv_quant.row_width(m.head_dim, torch.int8),
            dtype=torch.int8,
        )
        res.append(_steps(m, ids, [40, 8, 1, 1, 1, 9], pool))
    loop, lean = res
    assert (loop - lean).abs().max().item() < 1e-3 * loop.abs().max().item()
    assert torch.equal(loop.argmax(-1), lean.argmax(-1))


def test_cuda_fused_loop_matches_eager(family="gemma3"):
    """The CUDA loop (fused Triton layer ops: norms, sandwich norms, RoPE+store on two per-layer
    tables, GELU) run in the interpreter, against the eager loop: a prefill across the window, then
    a decode step (a no-RoPE layer is the same kernel on attention_block's identity table)."""
    ids = A[:31]
    res = []
    for fused in (False, True):
        _, m = _model(family)
        m.use_fused, m.use_cpu_fused = fused, False
        pool = torch.full((2, m.num_layers, 3, 16, m.num_kv_heads, m.head_dim), float("nan"))
        res.append(_steps(m, ids, [30, 1], pool))
    assert (res[0] - res[1]).abs().max().item() < 1e-5 * res[0].abs().max().item()


def test_decode_graph_buckets_match_hf():
    """What the decode CUDA graphs compute (engine/exec/cuda_graphs.py emulates a replay on CPU over
    the same static buffers: padded rows, fixed-width tables) on Gemma 3's window mix: each layer's
    window is part of the captured forward."""
    from engine.exec.cuda_graphs import DecodeGraphs

    llm = make("gemma3", num_blocks=128, max_num_seqs=6, max_model_len=160)  # 32 one-table blocks
    try:
        runner = llm.engine.runner
        graphs = DecodeGraphs(runner.model, runner.kv_pool, 16, 6, 160, runner.backend)
        graphs.capture()
        calls = []
        real = graphs.run
        graphs.run = lambda plan: calls.append(len(plan)) or real(plan)
        runner.graphs = graphs
        prompts = BURST_PROMPTS[:3] + [A]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], BURST)
        for p, o in zip(prompts, outs):
            assert_hf_greedy("gemma3", p, o.outputs[0].token_ids)
        assert 4 in calls  # 4 rows padded to bucket 4 (... 6)
    finally:
        llm.shutdown()


def test_gemma_bf16_norms_round_as_transformers():
    """Gemma's RMSNorm multiplies by (1 + w) in fp32 and rounds once; the engine keeps those weights
    in fp32 for a 16-bit model (the eager loop and the Triton norm; the C++ ops and lean step stand
    aside, as the CPU path line says). bf16 logits: within twice HF bf16's own error against HF fp32
    (the repo's bf16 rule), same argmax (Llama-style rounding of these norms flipped 10% of them)."""
    name, over = FAMILIES["gemma3"]
    cfg = dw.load_config(name, {**SHRINK, **over})
    w = dw.random_weights(cfg, seed=0)
    m = LlamaModel(cfg, w, torch.bfloat16, "cpu", max_positions=128)
    assert "Gemma's fp32 norm weights" in m.cpu_path and not m.use_cpu_fused
    pool = torch.full(
        (2, m.num_layers, 6, 16, m.num_kv_heads, m.head_dim), float("nan"), dtype=torch.bfloat16
    )
    ours = _steps(m, A[:60], [57, 1, 1, 1], pool)
    x = torch.tensor([A[:60]])
    with torch.no_grad():
        ref = hf_model("gemma3")(x).logits[0]
        hf16 = dw.hf_model_with_weights(cfg, w, dtype=torch.bfloat16)(x).logits[0].float()
    assert (ours - ref).abs().max() <= 2 * (hf16 - ref).abs().max()
    assert torch.equal(ours.argmax(-1), hf16.argmax(-1))
