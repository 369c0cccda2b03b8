"""The screened LM head of greedy steps (kernels/greedy_head.py) against the whole head.

A screened step must give the argmax the whole head gives — ties included (the first index wins
in both) — computing only a small part of the vocabulary, and every logit it does compute must be
the whole head's, bit for bit. The heads here are made hard on purpose: rows that are exact
twins, and rows a relative 1e-4 apart (below what the int8 or bf16 copy can tell apart, above
fp32's rounding), so the winner is decided only by the exact weights.
"""

import pytest
import torch

from engine.exec import dummy_weights as dw
from engine.exec.models.llama import AttentionMetadata, LlamaModel
from kernels import cpu_lean_step, greedy_head

SMALL = {"num_hidden_layers": 2, "vocab_size": 4096}
pytestmark = pytest.mark.skipif(
    not cpu_lean_step.available(torch.float32),
    reason=f"no C++ compiler: {cpu_lean_step.active_path()}",
)


BROKEN_ROW = 4001  # "nan": this vocabulary row holds a NaN weight (no prompt here holds the token)


def _twin_rows(w: torch.Tensor, kind: str, seed: int) -> None:
    """In place: row 2k + 1 becomes row 2k (equal) or row 2k times (1 + 1e-4 noise) (near, nan);
    nan: BROKEN_ROW gets a NaN weight too."""
    g = torch.Generator().manual_seed(seed)
    twin = w[0::2].clone()
    if kind in ("near", "nan"):
        twin *= 1 + 1e-4 * torch.randn(twin.shape, generator=g)
    w[1::2] = twin
    if kind == "nan":
        w[BROKEN_ROW, 5] = float("nan")


def _model(dtype, kind, seed=5):
    cfg = dw.load_config("smollm2-135m", SMALL)  # tied embeddings: the head is the embedding
    w = dw.random_weights(cfg, seed=seed)
    _twin_rows(w["model.embed_tokens.weight"], kind, seed)
    return cfg, LlamaModel(cfg, w, dtype, "cpu", max_positions=96, lean_step="on")


def _meta(slots, tables, seq_lens, cu):
    width = max(len(t) for t in tables)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
        max_seqlen_q=max(b - a for a, b in zip(cu, cu[1:])),
        backend="torch",
    )


def _check(full: torch.Tensor, screened: torch.Tensor) -> int:
    """Same argmax, every computed logit the whole head's, every row tied with a row's maximum
    computed; returns how many logits were computed."""
    assert torch.equal(screened.argmax(-1), full.argmax(-1))
    kept = screened != float("-inf")
    torch.testing.assert_close(screened[kept], full[kept], rtol=0, atol=0, equal_nan=True)
    at_max = full == full.max(-1, keepdim=True).values
    assert bool(kept[at_max].all())
    return int(kept.sum())


@pytest.mark.parametrize(
    "dtype,kind,layout",
    [
        (dtype, kind, "blocks")
        for dtype in (torch.float32, torch.bfloat16)
        for kind in ("equal", "near", "nan")
    ]
    + [(torch.float32, "near", "rows"), (torch.bfloat16, "nan", "rows")],
)
def test_a_greedy_lean_step_computes_only_rows_that_can_win(dtype, kind, layout):
    """nan: a head row with a NaN weight is always computed, so the broken logit reaches the
    sampler (torch's argmax takes it) as it does without the screen. layout: the int8 copy in
    column blocks (a vocabulary of a multiple of 16 on an AVX-512 CPU) or row-major (otherwise)."""
    cfg, m = _model(dtype, kind)
    assert m.lean is not None and m.lean.screen is not None, m.cpu_path
    if layout == "rows":
        scr = m.lean.screen
        m.lean.screen = greedy_head.Int8Screen(scr.rows().contiguous(), scr.scale, scr.coef)
    assert m.lean.screen.blocked == (layout == "blocks" and greedy_head.column_blocks())
    V, bs = cfg.vocab_size, 16
    pool = torch.zeros(2, m.num_layers, 12, bs, m.num_kv_heads, m.head_dim, dtype=dtype)
    seqs = [
        ([(7 * i + 3 + s) % V for i in range(n)], tab)
        for s, (n, tab) in enumerate([(40, [3, 1, 9]), (21, [5, 2]), (33, [4, 6, 8])])
    ]
    assert all(BROKEN_ROW not in ids for ids, _ in seqs)
    for ids, tab in seqs:  # prompts but their last 6 tokens, cached by the loop
        n = len(ids) - 6
        m.lean, lean = None, m.lean
        m.forward(
            torch.tensor(ids[:n]),
            torch.arange(n),
            pool,
            _meta([tab[p // bs] * bs + p % bs for p in range(n)], [tab], [n], [0, n]),
            torch.tensor([n - 1]),
        )
        m.lean = lean
    computed = rows = 0

    def both(ids_t, pos, meta, rows_t):
        nonlocal computed, rows
        full = m.forward(ids_t, pos, pool.clone(), meta, rows_t)
        screened = m.forward(ids_t, pos, pool, meta, rows_t, argmax_only=True)
        computed += _check(full, screened)
        rows += full.shape[0]
        if kind == "nan":  # the broken row is computed: its NaN wins, as without the screen
            assert bool(screened[:, BROKEN_ROW].isnan().all())
            assert bool((full.argmax(-1) == BROKEN_ROW).all())

    ids, tab = seqs[0]  # a 5-token speculative step of one sequence: five logits rows
    n = len(ids) - 6
    both(
        torch.tensor(ids[n : n + 5]),
        torch.arange(n, n + 5),
        _meta([tab[p // bs] * bs + p % bs for p in range(n, n + 5)], [tab], [n + 5], [0, 5]),
        torch.arange(5),
    )
    for j in (1, 2, 3):  # then one-token steps of the other two, together (a small batch)
        pos = [len(ids) - 6 + j for ids, _ in seqs[1:]]
        both(
            torch.tensor([ids[p] for (ids, _), p in zip(seqs[1:], pos)]),
            torch.tensor(pos),
            _meta(
                [tab[p // bs] * bs + p % bs for (_, tab), p in zip(seqs[1:], pos)],
                [tab for _, tab in seqs[1:]],
                [p + 1 for p in pos],
                [0, 1, 2],
            ),
            torch.arange(2),
        )
    assert computed < rows * V // 8, (
        f"{computed} of {rows * V} logits computed: nothing was skipped"
    )


def test_the_loops_screen_finds_the_argmax_the_exact_weights_give():
    """The loop's bf16 screen over an fp32 head (cpu_greedy_head.cpp), K not a multiple of 16,
    activations with an outlier. Per row a target group holds the argmax: a winner whose weights
    are large but nearly orthogonal to x (so its logit is small and the bf16 copy's error large
    beside it), an exact twin after it (the first index must win), and rows whose weights differ
    from it by 1e-3 relative (logits apart by more than fp32 can blur, less than bf16 can tell);
    every other row points away from x."""
    if not greedy_head.Bf16Screen.available():
        pytest.skip(f"no oneDNN bf16 product or no compiler: {greedy_head.active_path()}")
    g = torch.Generator().manual_seed(11)
    V, K, M = 3000, 90, 12
    x = torch.randn(M, K, generator=g)
    x[0, 7] *= 30  # an outlier feature, as final norms have
    units = x / x.norm(dim=1, keepdim=True)
    basis = torch.linalg.qr(x.T).Q  # [K, M]: the span of the rows of x
    away = -units.sum(0) / units.sum(0).norm()
    w = 0.3 * away + 0.005 * torch.randn(V, K, generator=g)
    for r in range(M):
        o = torch.randn(K, generator=g)
        o = (o - basis @ (basis.T @ o)) * (5 / o.norm())  # large and orthogonal to every x
        base = 100 * r + 10
        w[base] = o + 0.01 * units[r]
        w[base + 1] = w[base]
        w[base + 2 : base + 40] = o * (1 + 1e-3 * torch.randn(38, K, generator=g)) + 0.01 * units[r]
    screen = greedy_head.Bf16Screen(w.contiguous())
    out = screen.logits(x, w)
    exact = x.double() @ w.double().T
    kept = out.isfinite()
    # the winners' large weights leave them a wide bound, so a fifth of the head is computed here
    assert screen.computed == int(kept.sum()) < M * V // 3
    torch.testing.assert_close(out[kept].double(), exact[kept], rtol=1e-5, atol=1e-5)
    for r in range(M):  # the group holds the argmax, and every row of it was computed
        assert 100 * r + 10 <= int(exact[r].argmax()) < 100 * r + 50
        assert bool(kept[r, 100 * r + 10 : 100 * r + 40].all())
    assert torch.equal(out.argmax(-1), exact.argmax(-1))


def test_the_loops_screen_accounts_for_activations_rounded_to_bf16():
    """oneDNN's bf16 product rounds x too. Row A = +1 on 64 features where x = 1 + 1.5 * 2^-9
    (bf16: 1) and -1 on 64 where x = 1: its exact logit is 0.1875, its bf16 one 0. Row B = 0.125
    on one feature where x = 1: 0.125 either way. A is the argmax only by the features' lost bits;
    the weights are exact in bf16, so only the activations' term of the bound keeps A."""
    if not greedy_head.Bf16Screen.available():
        pytest.skip(f"no oneDNN bf16 product or no compiler: {greedy_head.active_path()}")
    K, V, M = 144, 64, 9
    x = torch.ones(M, K)
    x[:, :64] = 1 + 1.5 * 2.0**-9
    w = torch.full((V, K), 0.0)
    w[:, 130] = -1.0  # every other row: logit -1
    w[5] = 0.0
    w[5, :64], w[5, 64:128] = 1.0, -1.0  # A
    w[9] = 0.0
    w[9, 128] = 0.125  # B
    out = greedy_head.Bf16Screen(w).logits(x, w)
    assert out.argmax(-1).tolist() == [5] * M
    assert torch.equal(out[:, 5], (x[:, :64].sum(-1) - x[:, 64:128].sum(-1)))


def test_the_bound_holds_for_every_row():
    """|exact - approximate| <= n1 * coef for every vocabulary row of an int8 copy (the lean
    step's): the premise the screen rests on, checked in float64 on a head with outlier rows."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(2048, 64, generator=g) * 0.05
    w[::97] *= 40  # rows whose scale is set by one large weight
    s = greedy_head.int8_screen(w)
    x = torch.randn(16, 64, generator=g) * torch.logspace(-2, 2, 64)
    exact = x.double() @ w.double().T
    approx = (x.double() @ s.rows().double().T) * s.scale.double()
    bound = x.double().abs().sum(-1, keepdim=True) * s.coef.double()
    assert bool(((exact - approx).abs() <= bound).all())
    assert bool((bound < 0.05 * exact.abs().max()).all())  # and is tight enough to screen
    # and the lean step's own products of the copy (column blocks and row-major, 1..16 rows) give
    # those approximations up to fp32 sums, well inside the bound's rounding terms
    from kernels import lean_products

    layouts = [s, greedy_head.Int8Screen(s.rows().contiguous(), s.scale, s.coef)]
    assert [t.blocked for t in layouts] == [int(greedy_head.column_blocks()), 0]
    for t in layouts:
        for rows in (1, 9, 16):
            got = lean_products.screen_rows(t, x[:rows]).double()
            err = (got - approx[:rows]).abs()
            assert bool((err <= 1e-5 * bound[:rows]).all()), (t.blocked, rows)


def test_a_cached_screen_does_not_keep_its_head_alive():
    """The screens are cached per head tensor (engine/exec/models/greedy_screens.py); a model
    dropped (an app's model switch) must take its head, and the cache entries, with it."""
    import gc
    import weakref

    from engine.exec.models import greedy_screens

    cfg = dw.load_config("smollm2-135m", SMALL)
    m = LlamaModel(cfg, dw.random_weights(cfg, seed=2), torch.float32, "cpu", max_positions=64)
    assert m.lean is not None and m.lean.screen is not None
    if greedy_head.Bf16Screen.available():
        assert m.greedy_screen is not None
    head = weakref.ref(m.lm_head)
    before = len(greedy_screens._CACHE)
    del m
    gc.collect()
    assert head() is None
    assert len(greedy_screens._CACHE) < before
