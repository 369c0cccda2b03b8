"""Packed token bitmasks: one int32 word per 32 tokens, bit t % 32 of word t // 32 set when token t
is allowed (the layout llguidance and xgrammar fill). Filled on the CPU for the rows that need one,
sent to the logits' device in one copy, and applied there in a few vectorized ops."""
from __future__ import annotations

import torch


def words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def fill_masks(states, vocab_size: int) -> torch.Tensor:
    """[len(states), words] int32 on the CPU, each row from its GrammarState."""
    mask = torch.empty((len(states), words(vocab_size)), dtype=torch.int32)
    for i, st in enumerate(states):
        st.fill(mask[i])
    return mask


def allowed_from_bitmask(mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Unpack [R, W] int32 words into a [R, vocab_size] bool tensor (on the mask's device)."""
    shifts = torch.arange(32, dtype=torch.int32, device=mask.device)
    bits = (mask[:, :, None] >> shifts) & 1
    return bits.view(mask.shape[0], -1)[:, :vocab_size].bool()


def apply_bitmask_(logits: torch.Tensor, rows: list[int], mask: torch.Tensor) -> None:
    """In place: logits[rows[i], t] = -inf where row i's mask disallows token t. Tokens past the
    mask's width (a model vocabulary padded beyond the tokenizer's) are disallowed."""
    if not rows:
        return
    V = logits.shape[1]
    m = mask.to(logits.device, non_blocking=True)
    width = m.shape[1] * 32
    allowed = allowed_from_bitmask(m, min(V, width))
    if V > width:
        allowed = torch.cat([allowed, allowed.new_zeros(len(rows), V - width)], 1)
    if not bool(allowed.any(-1).all()):
        raise ValueError("structured: the grammar allows no token at this point")
    idx = torch.as_tensor(rows, device=logits.device)
    logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))
