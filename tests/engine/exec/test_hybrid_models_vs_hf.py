"""The MoE and linear-attention families at the model level, against transformers' own modules in
fp32.

Per family (tests/engine/exec/hybrid_helpers.py shrinks the shipped config, keeping its layer kinds):
fp32 logits of a chunked prefill and decode steps within 1e-4 of HF's forward over the whole
sequence. Units: the grouped-per-expert MoE against HF's experts module on the same tensors, the
MXFP4 dequantization against transformers' converter, the chunked gated delta rule (with an
initial state, chunks that do not divide the length) against HF's token-by-token recurrence.
"""

import pytest
import torch

from engine.exec.models.linear_state import LinearState
from engine.exec.models.llama import AttentionMetadata, LlamaModel
from tests.engine.exec import hybrid_helpers as H


def _model(family, **kw):
    cfg = H.config(family)
    m = LlamaModel(cfg, H.weights(family, cfg), torch.float32, "cpu", max_positions=256, **kw)
    if m.spec.linear_layers:
        m.linear_state = LinearState(
            m.spec.linear, len(m.spec.linear_layers), 3, torch.float32, "cpu"
        )
    return m


def _steps(model, ids, chunks, slot=1):
    """Prefill then decode `ids` as one sequence in the given chunk sizes; logits of every token."""
    bs = 16
    pool = torch.full(
        (2, model.num_kv_layers, 12, bs, model.num_kv_heads, model.head_dim), float("nan")
    )
    table = torch.arange(1, 12, dtype=torch.int32).flip(0)[None]
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
            state_slots=torch.tensor([slot]),
        )
        out.append(
            model.forward(
                torch.tensor(ids[start:end]), torch.arange(start, end), pool, meta, torch.arange(n)
            )
        )
        start = end
    return torch.cat(out)


@pytest.mark.parametrize("family", list(H.FAMILIES))
def test_logits_within_1e4_of_hf(family):
    """A 70-token prefill in chunks of 40 and 20 (gpt-oss: past its 24-token window; Qwen3.5: a
    linear-attention state carried across chunks and the 64-token chunk of the delta rule), then
    decode steps. The model's CPU path says why it is the per-layer loop."""
    m = _model(family)
    ids = H.prompt(1, 74)
    ours = _steps(m, ids, [40, 30, 1, 1, 1, 1])
    ref = H.hf_logits(family, ids)
    assert (ours - ref).abs().max().item() < 1e-4
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    assert ref.std() > 0.3, "random weights too small to tell a wrong layer from a right one"
    assert "CPU path: per-layer loop" in m.cpu_path and m.lean is None, m.cpu_path


def test_gpt_oss_sinks_and_window_change_the_logits():
    """The reference test above could pass with sinks ignored or the window unused only if they
    did not matter: they do (a model without them is off by far more than the tolerance)."""
    ids = H.prompt(1, 60)
    ref = H.hf_logits("gpt_oss", ids)
    m = _model("gpt_oss")
    for L in m.layers:
        L.pop("sinks")
    assert (_steps(m, ids, [60]) - ref).abs().max().item() > 1e-2
    m = _model("gpt_oss")
    m.spec = type(m.spec)(
        **{
            **m.spec.__dict__,
            "layers": tuple(type(s)(**{**s.__dict__, "window": None}) for s in m.spec.layers),
        }
    )
    assert (_steps(m, ids, [60]) - ref).abs().max().item() > 1e-2


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss", "qwen3_5_moe"])
def test_grouped_experts_equal_hf_experts(family):
    """One GEMM pair per active expert over its group of rows gives HF's eager experts' sums."""
    from engine.exec.models.moe import moe_forward

    m = _model(family)
    i = 0
    layer = H.hf_model(family).model.layers[i].mlp
    x = torch.randn(37, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = layer(x[None])
        ref = ref[0] if isinstance(ref, tuple) else ref
    ours = moe_forward(x, m.layers[i], m.spec.layers[i].moe)
    assert (ours - ref[0]).abs().max().item() < 1e-6


def test_mxfp4_dequantization_matches_transformers():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from engine.exec.models.moe import dequantize_mxfp4

    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 8, 2, 16), generator=g, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(120, 134, (3, 8, 2), generator=g, dtype=torch.int32).to(torch.uint8)
    ref = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # HF's [E, in, out]
    assert torch.equal(dequantize_mxfp4(blocks, scales), ref.transpose(1, 2))


def test_chunked_delta_rule_equals_the_recurrence():
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    from engine.exec.models.gated_deltanet import chunked_delta_rule, l2norm

    g = torch.Generator().manual_seed(0)
    n, Hh, dk, dv = 150, 3, 8, 6
    q, k = torch.randn(n, Hh, dk, generator=g), torch.randn(n, Hh, dk, generator=g)
    v = torch.randn(n, Hh, dv, generator=g)
    gate = -torch.rand(n, Hh, generator=g) * 2
    beta = torch.rand(n, Hh, generator=g)
    S0 = torch.randn(Hh, dk, dv, generator=g)
    ref, ref_S = torch_recurrent_gated_delta_rule(
        q[None],
        k[None],
        v[None],
        gate[None],
        beta[None],
        initial_state=S0[None],
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    qn, kn = l2norm(q) * dk**-0.5, l2norm(k)
    for chunk in (64, 7):
        o, S = chunked_delta_rule(qn, kn, v, gate, beta, S0, chunk=chunk)
        assert (o - ref[0]).abs().max().item() < 1e-4
        assert (S - ref_S[0]).abs().max().item() < 1e-4
