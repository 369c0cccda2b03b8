"""The tensors behind the state pool: every linear-attention layer's recurrent state and conv tail,
one slot per holder, allocated once beside the KV pool.

Why slots: a Gated DeltaNet layer's memory of a sequence is not a list of tokens but one fixed-size
state (engine/exec/models/gated_deltanet.py). Like KV blocks, the slots are allocated once and never
resized; the KV manager's state side (engine/kv/state_pool.py) decides which slot a sequence,
a fork or a checkpoint holds, and the step plan carries each row's slot, so execution reads data
and never asks the manager. A slot holds the state of all linear layers of one sequence (they
advance together), so a copy (a fork's copy-on-write, a checkpoint, its restore) is one index copy
per tensor.

    rec  [linear layers, slots, v_heads, k_dim, v_dim]  fp32 (the recurrence accumulates in fp32)
    conv [linear layers, slots, conv channels, K - 1]   the model's dtype
"""

from __future__ import annotations

import torch


class LinearState:
    def __init__(self, spec, num_layers: int, num_slots: int, dtype: torch.dtype, device):
        self.spec = spec
        self.num_slots = num_slots
        self.rec = torch.zeros(
            num_layers,
            num_slots,
            spec.num_v_heads,
            spec.k_dim,
            spec.v_dim,
            dtype=torch.float32,
            device=device,
        )
        self.conv = torch.zeros(
            num_layers, num_slots, spec.conv_dim, spec.conv_kernel - 1, dtype=dtype, device=device
        )

    @staticmethod
    def bytes_per_slot(spec, num_layers: int, dtype: torch.dtype) -> int:
        """One holder's state over all linear layers."""
        return num_layers * spec.state_bytes(torch.empty((), dtype=dtype).element_size())

    def copy_slots(self, src_dst) -> None:
        """Copy slot src -> dst for every (src, dst) pair (all layers), in order: a later pair may
        read what an earlier one wrote (a checkpoint taken, then restored for a prefix hit). A
        src that is bytes is a state loaded from the KV tier (`slot_bytes`' format), written into
        dst in its place in the order."""
        for src, dst in src_dst:
            if isinstance(src, int):
                self.rec[:, dst] = self.rec[:, src]
                self.conv[:, dst] = self.conv[:, src]
            else:
                self.load_bytes(dst, src)

    # ---- the KV tier's view of a slot (engine/kv/tier/state_entries.py) ---------------------------------
    @property
    def slot_nbytes(self) -> int:
        return self.rec[:, 0].numel() * 4 + self.conv[:, 0].numel() * self.conv.element_size()

    def layout(self) -> str:
        """What a slot's bytes mean (the tier's fingerprint names it: a state written under
        another layout is never read)."""
        return (
            f"rec={tuple(self.rec[:, 0].shape)}:{self.rec.dtype};"
            f"conv={tuple(self.conv[:, 0].shape)}:{self.conv.dtype}"
        )

    def slot_bytes(self, slot: int) -> bytes:
        """One slot's state as the tier stores it: the recurrent state (fp32), then the conv tail
        (the model's dtype), every linear layer, exactly as held (a reload is bit-identical)."""
        out = []
        for t in (self.rec[:, slot], self.conv[:, slot]):
            t = t.contiguous() if t.device.type == "cpu" else t.cpu().contiguous()
            out.append(t.view(torch.uint8).numpy().tobytes())
        return b"".join(out)

    def load_bytes(self, slot: int, data: bytes) -> None:
        if len(data) != self.slot_nbytes:
            raise ValueError(f"a state slot is {self.slot_nbytes} bytes, got {len(data)}")
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        n = self.rec[:, 0].numel() * 4
        for t, part in ((self.rec, raw[:n]), (self.conv, raw[n:])):
            src = part.view(t.dtype).view(t[:, slot].shape)
            t[:, slot].copy_(src.to(t.device))

    def read(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One slot's tensors (copies), e.g. for the KV tier."""
        return self.rec[:, slot].clone(), self.conv[:, slot].clone()

    def write(self, slot: int, rec: torch.Tensor, conv: torch.Tensor) -> None:
        self.rec[:, slot] = rec
        self.conv[:, slot] = conv
