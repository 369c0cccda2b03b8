"""CPU linear forms (engine/exec/cpu_linear.py): packed bf16 is exact, int8 is close enough to HF fp32.

Tolerance rule for int8 (weight-only, per-output-channel symmetric scales, bf16 activations):
HF's own bf16 forward is the yardstick, as for bf16 (tests/kernels/test_cpu_bf16_model.py). On the
same ids (a chat prompt plus HF's greedy reply, teacher-forced), against HF fp32:
  - top-1 agreement of the engine's logits with HF fp32's >= 90% of positions;
  - mean KL(HF fp32 || engine) <= 8x HF-bf16's own mean KL, and <= 0.02 nats;
  - mean |logprob error| of the reference tokens <= 4x HF-bf16's.
Why those factors: an int8 weight keeps ~8 bits like a bf16 weight, and the activations are bf16
too, so the error is a small multiple of bf16's (measured here: KL 4.3x, logprob error 2.6x, top-1
95% vs 99%). A scale on the wrong axis, a missing scale or a dropped bias gives errors orders of
magnitude larger (the broken-scale check below shows the rule catches one).
"""

import copy

import pytest
import torch
import torch.nn.functional as F

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.exec.cpu_linear import (
    INT8_KERNEL_MAX_ROWS,
    DenseLinear,
    Int8Linear,
    PackedLinear,
    make_linear,
    mkldnn_bf16_available,
    quantize_int8,
)
from engine.exec.models.llama import AttentionMetadata

CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {
        "role": "user",
        "content": "Explain in a few sentences why the sky is blue, and what makes sunsets red.",
    },
]


@pytest.mark.parametrize("rows", [1, 3, 16, 37])
def test_packed_bf16_is_bit_identical_to_f_linear(rows):
    if not mkldnn_bf16_available():
        pytest.fail("oneDNN is not available in this torch build")
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(1728, 576, generator=g).bfloat16()
    b = torch.randn(1728, generator=g).bfloat16()
    x = torch.randn(rows, 576, generator=g).bfloat16()
    lin = make_linear(w, b)
    assert isinstance(lin, PackedLinear) and lin.numel() == w.numel() + b.numel()
    assert torch.equal(lin(x), F.linear(x, w, b))


@pytest.mark.parametrize("rows", [1, 5, 16, 64])
def test_packed_fp32_is_close_to_f_linear_and_switchable(rows, monkeypatch):
    """fp32 is packed too (faster at decode shapes); its sum order differs from MKL's, so it is
    close (fp64 reference), not bit-identical. Greedy equality with HF is pinned elsewhere."""
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(1728, 576, generator=g) * 0.05
    b = torch.randn(1728, generator=g)
    x = torch.randn(rows, 576, generator=g)
    lin = make_linear(w, b)
    assert isinstance(lin, PackedLinear) == mkldnn_bf16_available()
    ref = F.linear(x.double(), w.double(), b.double())
    torch.testing.assert_close(lin(x).double(), ref, atol=1e-5, rtol=1e-5)
    monkeypatch.setenv("PAGED_CHAT_PACKED_FP32", "0")
    assert isinstance(make_linear(w, None), DenseLinear)


def test_quantize_int8_round_trip_error_is_half_a_step():
    w = torch.randn(300, 200, dtype=torch.float64).float() * torch.linspace(0.01, 3, 300)[:, None]
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127 and scale.shape == (300,)
    err = (q.float() * scale[:, None] - w).abs()
    assert (err <= scale[:, None] / 2 + 1e-6).all()
    assert (q.abs().amax(1) == 127).all()  # each row uses the full range


@pytest.mark.parametrize("rows", [1, INT8_KERNEL_MAX_ROWS, INT8_KERNEL_MAX_ROWS + 1, 40])
def test_int8_linear_matches_fp64_on_its_dequantized_weight(rows):
    """Both paths (torch's int8 kernel for small batches, dequantize + GEMM for big ones) compute
    x @ (q * scale).T + b; compared in fp64 within bf16 rounding (of the dequantized weights and of
    the output), i.e. relative to sum |x| |w| rather than to the possibly cancelling result."""
    g = torch.Generator().manual_seed(7)
    w, b = torch.randn(96, 128, generator=g), torch.randn(96, generator=g).bfloat16()
    x = torch.randn(rows, 128, generator=g).bfloat16()
    lin = Int8Linear(w, b, torch.bfloat16)
    wd = lin.q.double() * lin.scale.double()[:, None]
    ref = x.double() @ wd.T + b.double()
    out = lin(x).double()
    assert out.shape == (rows, 96)
    bound = 2**-7 * (x.double().abs() @ wd.abs().T + b.double().abs())
    assert ((out - ref).abs() <= bound).all()
    wrong = x.double() @ (lin.q.double() * lin.scale.double().flip(0)[:, None]).T + b.double()
    assert not ((out - wrong).abs() <= bound).all()  # the bound can tell a wrong scale


def test_bad_quantization_is_a_clear_error():
    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(device="cpu", quantization="int4")
    with pytest.raises(ValueError, match="quantization"):
        make_linear(torch.randn(4, 4), None, quantization="fp8")
    assert EngineConfig(device="cpu", quantization="int8").dtype == "bfloat16"


def _teacher_forced(model, ids):
    T, bs, nb = len(ids), 16, 64
    pool = torch.zeros(
        2, model.num_layers, nb, bs, model.num_kv_heads, model.head_dim, dtype=model.dtype
    )
    table = torch.randperm(nb)[: (T + bs - 1) // bs]
    slots = torch.tensor([int(table[p // bs]) * bs + p % bs for p in range(T)])
    meta = AttentionMetadata(
        slots,
        table.to(torch.int32)[None],
        torch.tensor([T], dtype=torch.int32),
        torch.tensor([0, T], dtype=torch.int32),
        T,
        "torch",
    )
    return model.forward(torch.tensor(ids), torch.arange(T), pool, meta, torch.arange(T)).double()


def _errors(logits, ref, ids):
    lp, rp = logits.log_softmax(-1), ref.log_softmax(-1)
    tgt = torch.tensor(ids[1:])[:, None]
    top1 = (logits.argmax(-1) == ref.argmax(-1)).double().mean().item()
    kl = (rp.exp() * (rp - lp)).sum(-1).mean().item()
    dlp = (lp[:-1].gather(-1, tgt) - rp[:-1].gather(-1, tgt)).abs().mean().item()
    return top1, kl, dlp


def test_int8_engine_within_tolerance_of_hf(model_folder, hf_model, monkeypatch):
    from engine.exec.model_runner import ModelRunner

    runners, real_init = [], ModelRunner.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        runners.append(self)

    monkeypatch.setattr(ModelRunner, "__init__", init)
    llm = LLM(model=model_folder, quantization="int8", num_blocks=64)
    try:
        out = llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))[0]
        assert len(out.outputs[0].token_ids) == 32
        model = runners[-1].model
        assert model.linear_kind == "int8-weight" and model.dtype == torch.bfloat16
        assert runners[-1].kv_pool.dtype == torch.bfloat16
        ids = out.prompt_token_ids
        with torch.no_grad():
            ids = (
                ids
                + hf_model.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False)[
                    0, len(ids) :
                ].tolist()
            )
        ours = _teacher_forced(model, ids)
        # negative control: the same model with one layer's down-projection scales on the wrong rows
        down = model.layers[3]["down"]
        good = down.scale
        down.scale = good.flip(0).contiguous()
        broken = _teacher_forced(model, ids)
        down.scale = good
    finally:
        llm.shutdown()
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].double()
        r16 = copy.deepcopy(hf_model).to(torch.bfloat16)(torch.tensor([ids])).logits[0].double()
    top1, kl, dlp = _errors(ours, ref, ids)
    h_top1, h_kl, h_dlp = _errors(r16, ref, ids)
    assert h_kl > 0
    assert top1 >= 0.9, (top1, h_top1)
    assert kl <= min(8 * h_kl, 0.02), (kl, h_kl)
    assert dlp <= 4 * h_dlp, (dlp, h_dlp)
    b_top1, b_kl, b_dlp = _errors(broken, ref, ids)
    assert not (b_top1 >= 0.9 and b_kl <= min(8 * h_kl, 0.02) and b_dlp <= 4 * h_dlp), (
        b_top1,
        b_kl,
        b_dlp,
    )
