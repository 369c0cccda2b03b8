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


_TABLES: dict = {}


def _byte_table(device, value: bool) -> torch.Tensor:
    """[256, 8] bool: (bit j of byte v) == value; one per device and polarity, built once."""
    key = (device, value)
    t = _TABLES.get(key)
    if t is None:
        v = torch.arange(256, dtype=torch.int32)
        bits = ((v[:, None] >> torch.arange(8, dtype=torch.int32)) & 1).bool()
        t = _TABLES[key] = (bits if value else ~bits).to(device)
    return t


def _unpack(mask: torch.Tensor, vocab_size: int, value: bool) -> torch.Tensor:
    """[R, vocab_size] bool from [R, W] int32 words: one table lookup per byte (bytes read
    little-endian, as on x86 and CUDA). A shift-and-mask over [R, W, 32] int32 costs several
    vocab-wide passes; on a busy 2-core CPU every such pass costs a scheduling slice."""
    R = mask.shape[0]
    as_bytes = mask.contiguous().view(torch.uint8).reshape(-1).int()
    return _byte_table(mask.device, value).index_select(0, as_bytes).view(R, -1)[:, :vocab_size]


def allowed_from_bitmask(mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Unpack [R, W] int32 words into a [R, vocab_size] bool tensor of allowed tokens."""
    return _unpack(mask, vocab_size, True)


def apply_bitmask_(logits: torch.Tensor, rows: list[int], mask: torch.Tensor) -> None:
    """In place: logits[rows[i], t] = -inf where row i's mask disallows token t. Tokens past the
    mask's width (a model vocabulary padded beyond the tokenizer's) are disallowed. When every
    row is masked (the usual constrained batch) that is one in-place masked_fill."""
    if not rows:
        return
    B, V = logits.shape
    if not bool((mask != 0).any(-1).all()):
        raise ValueError("structured: the grammar allows no token at this point")
    m = mask.to(logits.device, non_blocking=True)
    width = m.shape[1] * 32
    banned = _unpack(m, min(V, width), False)
    if V > width:
        banned = torch.cat([banned, banned.new_ones(len(rows), V - width)], 1)
    if rows == list(range(B)):
        logits.masked_fill_(banned, float("-inf"))
        return
    idx = torch.as_tensor(rows, device=logits.device)
    logits[idx] = logits[idx].masked_fill_(banned, float("-inf"))
