"""The lean one-sequence CPU step (kernels/cpu_lean_step.py) against the model's loop.

Same dummy weights, same prompt: a prefill through the loop, a 5-token step (a speculative
verification: every row's logits), then four one-token steps, once with the lean step and once
without. Logits must agree to float rounding (fp32) or a few bf16 / int8 steps
(its matrix-vector products sum in another order than oneDNN), the greedy token must be the same,
and the K/V it wrote into the pool must be the loop's. Families with and without q/k/v biases and
with GQA groups of 3 and 4. The real model's greedy equality with HF runs on this step too
(tests/engine/exec/test_generation_vs_hf.py: one sequence decoding takes it by default).
"""

import pytest
import torch

from engine.exec import dummy_weights as dw
from engine.exec.models.llama import AttentionMetadata, LlamaModel
from kernels import cpu_lean_step, kv_quant, lean_products

SMALL = {"num_hidden_layers": 2, "vocab_size": 4096}
pytestmark = pytest.mark.skipif(
    not cpu_lean_step.available(torch.float32),
    reason=f"no C++ compiler: {cpu_lean_step.active_path()}",
)


def run_steps(
    model: LlamaModel, ids: list[int], decode: int, bs: int = 16, chunk: int = 0, int8: bool = False
):
    """Prefill ids[:-decode - chunk] in one step, then `chunk` tokens in one step (all their logits),
    then one token per step; returns (logits per step, pool). int8: an int8 pool (kernels/kv_quant.py
    rows), zeros where nothing was written."""
    nb = -(-(len(ids) + 1) // bs) + 1
    shape = (2, model.num_layers, nb, bs, model.num_kv_heads, model.head_dim)
    pool = (
        torch.zeros(*shape[:-1], kv_quant.row_width(model.head_dim, torch.int8), dtype=torch.int8)
        if int8
        else torch.full(shape, float("nan"), dtype=model.dtype)
    )
    table = torch.arange(1, nb, dtype=torch.int32).flip(0)[
        None
    ]  # block 0 never used, order scrambled
    slots = lambda a, b: torch.tensor([int(table[0, p // bs]) * bs + p % bs for p in range(a, b)])
    T = len(ids)
    first = T - decode - chunk
    chunks = (
        [(0, ids[:first])]
        + ([(first, ids[first : first + chunk])] if chunk else [])
        + [(p, ids[p : p + 1]) for p in range(T - decode, T)]
    )
    outs = []
    for start, toks in chunks:
        n, end = len(toks), start + len(toks)
        meta = AttentionMetadata(
            slot_mapping=slots(start, end),
            block_tables=table,
            seq_lens=torch.tensor([end], dtype=torch.int32),
            cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32),
            max_seqlen_q=n,
            backend="torch",
        )
        rows = torch.arange(n) if chunk and start == first else torch.tensor([n - 1])
        outs.append(model.forward(torch.tensor(toks), torch.arange(start, end), pool, meta, rows))
    return outs, pool


CASES = [
    ("smollm2-135m", torch.float32, None),
    ("qwen2.5-0.5b", torch.float32, None),
    ("smollm2-135m", torch.bfloat16, None),
    ("llama-3.2-1b", torch.float32, None),
    ("smollm2-135m", torch.bfloat16, "int8"),
    ("qwen2.5-0.5b", torch.float32, "int8"),
]


@pytest.mark.parametrize("name,dtype,quant", CASES)
def test_lean_step_matches_the_loop(name, dtype, quant):
    cfg = dw.load_config(name, SMALL)
    w = dw.random_weights(cfg, seed=3)
    ids = [
        (7 * i + 3) % cfg.vocab_size for i in range(46)
    ]  # 37 prefilled across block edges, 5 + 4
    loop = LlamaModel(
        cfg, dict(w), dtype, "cpu", max_positions=64, quantization=quant, lean_step="off"
    )
    lean = LlamaModel(
        cfg, dict(w), dtype, "cpu", max_positions=64, quantization=quant, lean_step="on"
    )
    assert loop.lean is None and lean.lean is not None, lean.cpu_path
    want, want_pool = run_steps(loop, ids, 4, chunk=5)
    got, got_pool = run_steps(lean, ids, 4, chunk=5)
    assert torch.equal(got[0], want[0])  # the prefill ran the same loop in both
    eps = torch.finfo(dtype).eps * (1 if quant is None else 4)
    for step, (g, e) in enumerate(zip(got[1:], want[1:])):
        assert (
            g.shape == e.shape == (5 if step == 0 else 1, cfg.vocab_size)
            and g.dtype == torch.float32
        )
        scale = e.abs().max().item()
        tol = (2e-5 if dtype == torch.float32 and quant is None else 8 * eps) * scale
        err = (g - e).abs().max().item()
        assert err <= tol, (
            f"step {step}: max logit difference {err:.3g} > {tol:.3g} (scale {scale:.3g})"
        )
        assert torch.equal(g.argmax(-1), e.argmax(-1))
    written = ~want_pool.isnan()
    assert torch.equal(written, ~got_pool.isnan())  # the same slots, and nothing else
    kv_tol = 1e-5 if dtype == torch.float32 and quant is None else 8 * eps
    torch.testing.assert_close(
        got_pool[written].float(), want_pool[written].float(), atol=kv_tol, rtol=kv_tol
    )


@pytest.mark.parametrize(
    "dtype,quant", [(torch.float32, None), (torch.bfloat16, None), (torch.bfloat16, "int8")]
)
def test_a_multi_token_step_is_bit_identical_to_one_token_steps(dtype, quant):
    """Batch invariance: a speculative step's k+1 rows get the logits (and K/V) the one-token steps
    would have given, bit for bit, so greedy with speculation equals greedy without it exactly."""
    cfg = dw.load_config("qwen2.5-0.5b", SMALL)  # with q/k/v biases
    m = LlamaModel(
        cfg,
        dw.random_weights(cfg, seed=7),
        dtype,
        "cpu",
        max_positions=64,
        quantization=quant,
        lean_step="on",
    )
    ids = [(13 * i + 1) % cfg.vocab_size for i in range(40)]
    multi, multi_pool = run_steps(m, ids, 0, chunk=6)
    single, single_pool = run_steps(m, ids, 6)
    assert torch.equal(multi[1], torch.cat(single[1:]))
    assert torch.equal(multi_pool.nan_to_num(7.0), single_pool.nan_to_num(7.0))


@pytest.mark.parametrize(
    "dtype,rotated", [(torch.float32, True), (torch.float32, False), (torch.bfloat16, True)]
)
def test_an_int8_pool_is_written_and_read_like_the_loop(dtype, rotated, monkeypatch):
    """--kv-cache-dtype int8 (rotated by the Hadamard R by default): the step quantizes each new k/v
    row on store and reads int8 rows, as the loop's store_kv and decode kernel do. Its products sum
    in another order than oneDNN's and torch's matmul, so a code may round the other way where a
    value sits within an ulp of a half: codes within one step, scales to rounding, logits close."""
    cfg = dw.load_config("smollm2-135m", SMALL)
    w = dw.random_weights(cfg, seed=5)
    ids = [(11 * i + 5) % cfg.vocab_size for i in range(46)]
    runs, calls = [], []
    real = cpu_lean_step.LeanStep.__call__
    monkeypatch.setattr(
        cpu_lean_step.LeanStep,
        "__call__",
        lambda self, tokens, *a, **kw: calls.append(len(tokens)) or real(self, tokens, *a, **kw),
    )
    for mode in ("off", "on"):
        m = LlamaModel(cfg, dict(w), dtype, "cpu", max_positions=64, lean_step=mode)
        m.kv_rotation = kv_quant.hadamard(m.head_dim) if rotated else None  # as ModelRunner sets it
        runs.append(run_steps(m, ids, 4, chunk=5, int8=True))
    (want, want_pool), (got, got_pool) = runs
    assert calls == [5, 1, 1, 1, 1]  # the lean step ran (the loop's model took none)
    assert torch.equal(got[0], want[0])  # the prefill ran the same loop in both
    codes_w, scales_w = kv_quant.split(want_pool)
    codes_g, scales_g = kv_quant.split(got_pool)
    written = scales_w != 0
    assert (
        torch.equal(written, scales_g != 0)
        and int(written.sum()) == 2 * cfg.num_hidden_layers * 46 * 3
    )
    assert int((codes_g.int() - codes_w.int()).abs().max()) <= 1
    assert float((codes_g != codes_w).float().mean()) < 0.002
    # the step's k/v differ from the loop's by rounding, carried through the layers: 2e-4 measured
    # (fp32); in bf16 a row's largest value may round one bf16 step the other way (1.1e-3 measured,
    # one step is 2^-8..2^-7); one code step is 1/127 of the scale, a row stored unrotated is off by
    # tens of percent
    rtol = 1e-3 if dtype == torch.float32 else 2.0**-7
    torch.testing.assert_close(scales_g, scales_w, rtol=rtol, atol=0)
    for step, (g, e) in enumerate(zip(got[1:], want[1:])):
        err, scale = (g - e).abs().max().item(), e.abs().max().item()
        assert err <= 0.02 * scale, (
            f"step {step}: max logit difference {err:.3g} (scale {scale:.3g})"
        )
        assert torch.equal(g.argmax(-1), e.argmax(-1))


def _batch_step(model, seqs, pool, bs=16):
    """One decode step of several sequences: seqs = [(ids, table)]; each decodes ids[-1] at len(ids) - 1."""
    toks = [ids[-1] for ids, _ in seqs]
    pos = [len(ids) - 1 for ids, _ in seqs]
    slots = [int(tab[p // bs]) * bs + p % bs for (ids, tab), p in zip(seqs, pos)]
    W = max(len(tab) for _, tab in seqs)
    tables = torch.zeros(len(seqs), W, dtype=torch.int32)
    for r, (_, tab) in enumerate(seqs):
        tables[r, : len(tab)] = torch.tensor(tab, dtype=torch.int32)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_tables=tables,
        seq_lens=torch.tensor([p + 1 for p in pos], dtype=torch.int32),
        cu_seqlens_q=torch.arange(len(seqs) + 1, dtype=torch.int32),
        max_seqlen_q=1,
        backend="torch",
    )
    return model.forward(torch.tensor(toks), torch.tensor(pos), pool, meta, torch.arange(len(seqs)))


def _cached_pool(loop, model, seqs, num_blocks, bs=16):
    """A pool of `model`'s shape holding, for each (ids, table) of seqs, the K/V of every token
    but the last, written by the loop's prefill (identically for every model that reads it)."""
    pool = torch.zeros(
        2, model.num_layers, num_blocks, bs, model.num_kv_heads, model.head_dim, dtype=model.dtype
    )
    for ids, tab in seqs:
        n = len(ids) - 1
        meta = AttentionMetadata(
            slot_mapping=torch.tensor([tab[p // bs] * bs + p % bs for p in range(n)]),
            block_tables=torch.tensor([tab], dtype=torch.int32),
            seq_lens=torch.tensor([n], dtype=torch.int32),
            cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32),
            max_seqlen_q=n,
            backend="torch",
        )
        loop.forward(torch.tensor(ids[:-1]), torch.arange(n), pool, meta, torch.tensor([n - 1]))
    return pool


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_small_batch_decodes_like_the_loop_and_like_each_sequence_alone(dtype):
    """Three sequences of different lengths decoding in one lean step: close to the loop's logits
    (same argmax in fp32), and bit-identical to each sequence's own one-sequence step."""
    cfg = dw.load_config("smollm2-135m", SMALL)
    w = dw.random_weights(cfg, seed=9)
    lean = LlamaModel(cfg, dict(w), dtype, "cpu", max_positions=64, lean_step="on")
    loop = LlamaModel(cfg, dict(w), dtype, "cpu", max_positions=64, lean_step="off")
    seqs = [
        ([(5 * i + 2 + s) % cfg.vocab_size for i in n], tab)
        for s, (n, tab) in enumerate([(range(20), [3, 1]), (range(7), [5]), (range(33), [2, 6, 4])])
    ]

    def fresh_pool(model):  # every prefix but the last token cached by the loop, identically
        return _cached_pool(loop, model, seqs, 8)

    together = _batch_step(lean, seqs, fresh_pool(lean))
    want = _batch_step(loop, seqs, fresh_pool(loop))
    pool = fresh_pool(lean)
    alone = torch.cat([_batch_step(lean, [sq], pool) for sq in seqs])
    assert torch.equal(together, alone)
    scale = want.abs().max().item()
    tol = (2e-5 if dtype == torch.float32 else 8 * torch.finfo(dtype).eps) * scale
    assert (together - want).abs().max().item() <= tol
    if dtype == torch.float32:
        assert torch.equal(together.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_batch_on_a_shared_prompt_decodes_like_each_sequence_alone(dtype):
    """Ten chats whose tables start with the same two blocks (a cached system prompt) decode in one
    lean step, which reads that prefix as two small products per KV head for all of them
    (paged_decode.h decode_shared_rows): the logits match each chat's own one-sequence step (which
    walks its blocks) to float rounding, and the loop's batch, with the same greedy tokens in fp32."""
    cfg = dw.load_config("smollm2-135m", SMALL)
    w = dw.random_weights(cfg, seed=12)
    lean = LlamaModel(cfg, dict(w), dtype, "cpu", max_positions=96, lean_step="on")
    loop = LlamaModel(cfg, dict(w), dtype, "cpu", max_positions=96, lean_step="off")
    prompt = [(7 * i + 3) % cfg.vocab_size for i in range(32)]  # two whole blocks, shared
    seqs = [
        (prompt + [(11 * i + 5 * s + 1) % cfg.vocab_size for i in range(3 + s)], [1, 2, 3 + s])
        for s in range(10)
    ]

    def fresh_pool(model):
        return _cached_pool(loop, model, seqs, 14)

    calls = []
    real = cpu_lean_step.LeanStep.__call__
    cpu_lean_step.LeanStep.__call__ = lambda self, t, *a, **kw: (
        calls.append(len(t)) or real(self, t, *a, **kw)
    )
    try:
        together = _batch_step(lean, seqs, fresh_pool(lean))
        pool = fresh_pool(lean)
        alone = torch.cat([_batch_step(lean, [sq], pool) for sq in seqs])
    finally:
        cpu_lean_step.LeanStep.__call__ = real
    assert calls == [10] + [1] * 10  # the batch was the lean step's
    want = _batch_step(loop, seqs, fresh_pool(loop))
    scale = want.abs().max().item()
    tight = (1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps) * scale
    assert (together - alone).abs().max().item() <= tight
    tol = (2e-5 if dtype == torch.float32 else 8 * torch.finfo(dtype).eps) * scale
    assert (together - want).abs().max().item() <= tol
    if dtype == torch.float32:
        assert torch.equal(together.argmax(-1), want.argmax(-1))
        assert torch.equal(together.argmax(-1), alone.argmax(-1))


@pytest.mark.parametrize(
    "name,dtype", [("smollm2-135m", torch.float32), ("qwen2.5-0.5b", torch.bfloat16)]
)
def test_the_tiled_layout_matches_row_major(name, dtype):
    """The layer weights in tile_rows' column-block layout (what a model with packed linears keeps
    for the lean step) give the row-major step's logits and K/V up to summation order (the blocks
    sum each output over k in order, the row-major kernel in 16 lanes and a tree), the same greedy
    tokens, and the layout round-trips."""
    from engine.exec.models.llama import make_lean_step
    from engine.exec.models.llama_weights import LINEAR_NAMES, _prepare

    cfg = dw.load_config(name, SMALL)
    w = dw.random_weights(cfg, seed=9)
    m = LlamaModel(cfg, dict(w), dtype, "cpu", max_positions=64, lean_step="on")
    from engine.exec.cpu_linear import PackedLinear

    assert m.lean.tiled == isinstance(
        m.layers[0]["qkv"], PackedLinear
    )  # the default keeps it tiled
    rows = [
        {
            k: (lean_products.untile_rows(v) if v is not None and v.dim() > 2 else v)
            for k, v in P.items()
        }
        for P in _prepare(cfg, dict(w), dtype, "cpu", None).plain
    ]
    tiles = [
        {k: (lean_products.tile_rows(v) if k in LINEAR_NAMES else v) for k, v in P.items()}
        for P in rows
    ]
    assert all(lean_products.untile_rows(t["qkv"]).equal(r["qkv"]) for t, r in zip(tiles, rows))
    ids = [(11 * i + 5) % cfg.vocab_size for i in range(41)]
    results = []
    for plain in (rows, tiles):
        m.lean, _, why = make_lean_step(m, plain, "on")
        assert m.lean is not None and m.lean.tiled == (plain is tiles), why
        results.append(run_steps(m, ids, 5, chunk=4))
    (a, a_pool), (b, b_pool) = results
    eps = 2e-5 if dtype == torch.float32 else 8 * torch.finfo(dtype).eps
    for x, y in zip(a[1:], b[1:]):
        assert (x - y).abs().max().item() <= eps * y.abs().max().item()
        assert torch.equal(x.argmax(-1), y.argmax(-1))
    written = ~a_pool.isnan()
    assert torch.equal(written, ~b_pool.isnan())
    assert (a_pool[written].float() - b_pool[written].float()).abs().max().item() <= eps * float(
        b_pool[written].float().abs().max()
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_column_block_products_against_fp64(dtype):
    """lean_gemm.h's column-block kernels alone: every block count at a thread's tail (3, 2, 1) and
    every row count a pass takes (1..17: whole passes of 8 and each tail), with and without a bias,
    against an fp64 product; the row-major kernel beside them agrees too; a row's result does not
    depend on the rows beside it (batch-invariant, bit for bit)."""
    if not lean_products.can_tile(torch.zeros(16, 16, dtype=dtype)):
        pytest.skip("this CPU has no column-block kernel for this dtype (needs AVX-512 / -BF16)")
    g = torch.Generator().manual_seed(1)
    tol = 4e-6 if dtype == torch.float32 else 2.0**-7  # fp32 sums; bf16: one output rounding
    for n, k in ((80, 64), (64, 96), (48, 32)):  # 3+2, 3+1, 3 blocks of 16 outputs
        w = (torch.randn(n, k, generator=g) * 0.1).to(dtype)
        bias = (torch.randn(n, generator=g) * 0.1).to(dtype)
        x = torch.randn(17, k, generator=g).to(dtype)
        tiled = lean_products.tile_rows(w)
        for rows in range(1, 18):
            for b in (None, bias):
                want = x[:rows].double() @ w.double().T + (0 if b is None else b.double())
                scale = want.abs().max().item()
                got = lean_products.linear_rows(tiled, x[:rows], b, n)
                plain = lean_products.linear_rows(w, x[:rows], b, n)
                assert got.dtype == dtype and got.shape == (rows, n)
                assert (got.double() - want).abs().max().item() <= tol * scale, (n, rows)
                assert (plain.double() - want).abs().max().item() <= tol * scale, (n, rows)
                assert torch.equal(
                    got[-1], lean_products.linear_rows(tiled, x[rows - 1 : rows], b, n)[0]
                )


def test_a_copy_over_the_auto_limit_is_not_tiled(monkeypatch):
    """Tiling is done only where "auto" keeps the copy: past the limit ("on" keeps it anyway) the
    copy stays row-major, and the step still runs and matches the loop."""
    from engine.exec.models import llama

    monkeypatch.setattr(llama, "LEAN_AUTO_MAX_EXTRA_BYTES", 1000)
    cfg = dw.load_config("smollm2-135m", SMALL)
    w = dw.random_weights(cfg, seed=8)
    on = LlamaModel(cfg, dict(w), torch.float32, "cpu", max_positions=64, lean_step="on")
    loop = LlamaModel(cfg, dict(w), torch.float32, "cpu", max_positions=64, lean_step="off")
    assert on.lean is not None and not on.lean.tiled
    ids = [(5 * i + 2) % cfg.vocab_size for i in range(30)]
    got, want = run_steps(on, ids, 3)[0], run_steps(loop, ids, 3)[0]
    assert all(torch.equal(g.argmax(-1), e.argmax(-1)) for g, e in zip(got, want))


def test_the_tiled_layout_takes_only_shapes_it_can_hold():
    assert lean_products.can_tile(torch.zeros(16, 32)) and lean_products.can_tile(
        torch.zeros(32, 32), 2
    )
    assert not lean_products.can_tile(torch.zeros(24, 32), 2)  # gate/up: each half a multiple of 16
    assert not lean_products.can_tile(torch.zeros(8, 32))  # rows: a multiple of 16
    assert not lean_products.can_tile(torch.zeros(16, 24))  # columns: a multiple of 16
    assert not lean_products.can_tile(torch.zeros(16, 32, dtype=torch.int8))
    cfg = dw.load_config("smollm2-135m", SMALL)
    m = LlamaModel(
        cfg, dw.random_weights(cfg, seed=4), torch.float32, "cpu", max_positions=64, lean_step="on"
    )
    layers = [
        {k: torch.zeros(4, 4) for k in ("qkv", "o", "gate_up", "down")}
        | {"ln1": L["ln1"], "ln2": L["ln2"]}
        for L in m.layers
    ]
    with pytest.raises(ValueError, match="tiled"):
        cpu_lean_step.LeanStep(
            layers=layers,
            embed=m.embed,
            norm=m.norm,
            lm_head=m.lm_head,
            lm_scale=None,
            cos=m.cos,
            sin=m.sin,
            num_heads=m.num_heads,
            num_kv_heads=m.num_kv_heads,
            head_dim=m.head_dim,
            intermediate=cfg.intermediate_size,
            eps=m.eps,
            dtype=torch.float32,
            tiled=True,
        )


def test_lean_step_is_only_taken_where_it_applies(monkeypatch):
    """At most max_tokens tokens: the lean step; a longer prefill, or a pool of another dtype: the loop."""
    cfg = dw.load_config("smollm2-135m", SMALL)
    lean = LlamaModel(
        cfg, dw.random_weights(cfg, seed=4), torch.float32, "cpu", max_positions=64, lean_step="on"
    )
    sizes = []
    real = cpu_lean_step.LeanStep.__call__
    monkeypatch.setattr(
        cpu_lean_step.LeanStep,
        "__call__",
        lambda self, tokens, *a, **kw: sizes.append(len(tokens)) or real(self, tokens, *a, **kw),
    )
    run_steps(lean, list(range(30)), 2, chunk=3)
    assert sizes == [3, 1, 1]  # not the 25-token prefill
    assert lean.lean.max_tokens == 17
    assert lean.lean.takes(17, 1) and not lean.lean.takes(18, 1)  # one sequence: a draft of 16
    assert lean.lean.tiled  # packed linears beside it: its copy is tiled
    assert lean.lean.takes(17, 17) and not lean.lean.takes(18, 18)  # a batch over tiled weights
    lean.lean.tiled = False  # (what it would say over row-major weights: oneDNN wins above 8)
    assert lean.lean.takes(8, 8) and not lean.lean.takes(9, 9)
    lean.lean.tiled = True
    assert lean.lean.takes(17, 17, quantized_pool=True) and not lean.lean.takes(
        18, 18, quantized_pool=True
    )
    assert lean.lean.can_run(torch.zeros(2, 2, 4, 16, 3, 64))
    assert not lean.lean.can_run(torch.zeros(2, 2, 4, 16, 3, 64, dtype=torch.bfloat16))
    assert lean.lean.can_run(torch.zeros(2, 2, 4, 16, 3, 68, dtype=torch.int8))  # int8 rows
    assert lean.lean.can_run(
        torch.zeros(2, 2, 4, 16, 3, 68, dtype=torch.int8), kv_quant.hadamard(64)
    )
    assert not lean.lean.can_run(
        torch.zeros(2, 2, 4, 16, 3, 68, dtype=torch.float8_e4m3fn)
    )  # fp8: the loop
    assert not lean.lean.can_run(
        torch.zeros(2, 2, 4, 16, 3, 64), kv_quant.hadamard(64)
    )  # never stored rotated
    assert not lean.lean.can_run(
        torch.zeros(2, 2, 4, 16, 3, 68, dtype=torch.int8), kv_quant.hadamard(32)
    )


def test_auto_keeps_no_second_copy_of_big_packed_weights(monkeypatch):
    from engine.exec.models import llama

    cfg = dw.load_config("smollm2-135m", SMALL)
    w = dw.random_weights(cfg, seed=5)
    monkeypatch.setattr(llama, "LEAN_AUTO_MAX_EXTRA_BYTES", 1000)
    m = LlamaModel(cfg, dict(w), torch.float32, "cpu", max_positions=64, lean_step="auto")
    assert m.lean is None and "--lean-step on" in m.cpu_path
    m = LlamaModel(
        cfg, dict(w), torch.bfloat16, "cpu", max_positions=64, quantization="int8", lean_step="auto"
    )
    assert m.lean is not None and m.lean_extra_bytes == 0  # int8 codes are shared, not copied


def test_bad_inputs_are_clear_errors():
    cfg = dw.load_config("smollm2-135m", SMALL)
    m = LlamaModel(
        cfg, dw.random_weights(cfg, seed=6), torch.float32, "cpu", max_positions=64, lean_step="on"
    )
    pool = torch.full((2, 2, 4, 16, 3, 64), 5.0)
    table = torch.tensor([[1, 2]], dtype=torch.int32)
    i64 = lambda *v: torch.tensor(v, dtype=torch.int64)
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32)

    def call(tok=1, pos=3, slot=3, seq_len=4, rows=(0,), tab=table, cu=(0, 1)):
        return m.lean(
            i64(tok), i64(pos), i64(slot), tab, i32(seq_len), i32(*cu), pool, m.scale, i64(*rows)
        )

    assert call().shape == (1, cfg.vocab_size)
    before = pool.clone()
    assert call(slot=-1).shape == (
        1,
        cfg.vocab_size,
    )  # a padded row (decode graphs): stores nothing
    assert torch.equal(pool, before)
    for kw, match in [
        ({"pos": 64}, "RoPE table"),
        ({"slot": 64}, "beyond the pool"),
        ({"slot": -2}, "beyond the pool"),
        ({"tok": cfg.vocab_size}, "vocabulary"),
        ({"tok": -1}, "vocabulary"),
        ({"seq_len": 40, "pos": 39}, "block table"),
        ({"tab": torch.tensor([[1, 9]], dtype=torch.int32), "seq_len": 20}, "block table"),
        ({"rows": (1,)}, "logits row"),
        ({"seq_len": 0}, "token count"),
        ({"cu": (0, 2)}, "token count"),
        ({"cu": (1, 1)}, "token count"),
    ]:
        before = pool.clone()
        with pytest.raises(ValueError, match=match):
            call(**kw)
        assert torch.equal(pool, before)  # nothing was written
    with pytest.raises(ValueError, match="int64"):
        m.lean(i32(1), i64(3), i64(3), table, i32(4), i32(0, 1), pool, m.scale, i64(0))
    with pytest.raises(ValueError, match="same sequences"):
        m.lean(i64(1), i64(3), i64(3), table, i32(4, 4), i32(0, 1, 1), pool, m.scale, i64(0))
    with pytest.raises(ValueError, match="lean_step"):
        LlamaModel(
            cfg,
            dw.random_weights(cfg, seed=6),
            torch.float32,
            "cpu",
            max_positions=64,
            lean_step="yes",
        )


def test_a_step_that_cannot_start_falls_back_to_the_loop(monkeypatch):
    """Memory or threads refused (C++ returns before writing anything): the model turns the lean step
    off and the loop serves that step, with the loop's logits."""
    cfg = dw.load_config("smollm2-135m", SMALL)
    w = dw.random_weights(cfg, seed=8)
    lean = LlamaModel(cfg, dict(w), torch.float32, "cpu", max_positions=64, lean_step="on")
    loop = LlamaModel(cfg, dict(w), torch.float32, "cpu", max_positions=64, lean_step="off")

    def refuse(self, *a, **kw):
        raise cpu_lean_step.LeanStepFailed("no threads")

    monkeypatch.setattr(cpu_lean_step.LeanStep, "__call__", refuse)
    got, _ = run_steps(lean, list(range(24)), 2)
    want, _ = run_steps(loop, list(range(24)), 2)
    assert lean.lean is None
    for g, e in zip(got, want):
        assert torch.equal(g, e)


def test_first_use_in_a_fresh_process_loads_or_declines_without_hanging():
    """The library loads lazily under a lock; first use must answer (on, and off by env), not wait
    on its own lock (a log line once re-entered it)."""
    import os
    import subprocess
    import sys

    code = "from kernels import cpu_lean_step as c; import torch; print(c.available(torch.float32), c.active_path())"
    for env, want in (("1", "True cpp:"), ("0", "False off: disabled")):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PAGED_CHAT_LEAN_STEP": env},
        )
        assert out.stdout.startswith(want), out.stdout + out.stderr
