"""The CUDA start-up warm-up, run on CPU with interpreted Triton so its code runs in CI: it must
drive every split count a table width allows through the decode kernel and leave a usable pool.
(On CUDA it also compiles; here only the calls and shapes are checked.)"""

import torch

from engine.exec import dummy_weights as dw
from engine.exec.models.llama import LlamaModel
from engine.exec.warmup import warm_up


def test_warm_up_covers_split_counts_and_widths(monkeypatch):
    from kernels import triton_attention

    seen = []
    real = triton_attention.paged_attention

    def spy(*a, **kw):
        if kw.get("num_splits"):
            seen.append((a[3].shape[1], kw["num_splits"]))
        return real(*a, **kw)

    monkeypatch.setattr(triton_attention, "paged_attention", spy)
    cfg = dw.load_config(
        "smollm2-135m",
        {
            "num_hidden_layers": 1,
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
    )
    model = LlamaModel(
        cfg, dw.random_weights(cfg), torch.float32, torch.device("cpu"), max_positions=1024
    )
    pool = torch.zeros(2, 1, 64, 16, 2, 16)
    logs = []
    stats = warm_up(model, pool, "triton", max_blocks_per_seq=40, log=logs.append)
    from engine.exec.warmup import decode_variant, effective_splits

    warmed = {decode_variant(w, s) for w, s in seen}
    # every (width, requested split) serving can produce maps to a warmed variant
    for w in range(1, 41):
        for req in range(1, 65):
            assert decode_variant(w, effective_splits(w, 16, req)) in warmed, (w, req)
    assert {w for w, _ in seen} >= {1, 16}
    assert stats["launches"] >= len(seen) and any("done" in m for m in logs)
    assert not pool.isnan().any()


def test_effective_splits_match_the_kernel_wrapper():
    """effective_splits mirrors triton_attention's rounding of a requested split count."""
    from engine.exec.warmup import effective_splits

    assert effective_splits(48, 16, 5) == 4 and effective_splits(48, 16, 12) == 12
    assert effective_splits(512, 16, 64) == 64 and effective_splits(1, 16, 64) == 1
