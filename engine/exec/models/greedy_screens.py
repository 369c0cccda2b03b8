"""Which screened LM heads a CPU model gets for its greedy steps (kernels/greedy_head.py).

The lean step reads an int8 copy of the head; the loop, for fp32 weights, oneDNN's bf16 product.
Neither applies to an int8 head (nothing left to save), to Gemma's final soft-cap (logits rounded
after the tanh could tie where the sums did not), or with PAGED_CHAT_GREEDY_HEAD=0. The copies are
built once per head tensor and shared by every model over the same prepared weights (the test
suite and the app's model switches build many models over one cached set): 0.06 s and 28 MB
int8, ~0.1 s and 56 MB bf16 for the default model. A copy over MAX_COPY_BYTES is not made (a
128k-token vocabulary over 4,096 features would add 0.5 GB int8 and 1 GB bf16 for one gain).
"""

from __future__ import annotations

import weakref

import torch

from kernels import greedy_head

# (kind, id(head)) -> (weak reference to the head, its screen); an entry leaves with its head
# (a tensor compares by value, so it cannot key a WeakKeyDictionary)
MAX_COPY_BYTES = 256 * 2**20

_CACHE: dict[tuple[str, int], tuple[weakref.ref, object]] = {}


def _cached(kind: str, head: torch.Tensor, build):
    key = (kind, id(head))
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is head:
        return hit[1]
    screen = build(head)
    _CACHE[key] = (weakref.ref(head), screen)
    weakref.finalize(head, _CACHE.pop, key, None)
    return screen


def _applies(model) -> bool:
    from engine.exec.cpu_linear import Int8Linear

    return (
        greedy_head.enabled()
        and model.spec.final_softcap is None
        and model.lm_head.device.type == "cpu"
        and not isinstance(model.lm_head_linear, Int8Linear)
        and model.lm_head.dim() == 2
        and model.lm_head.is_contiguous()
    )


def int8_screen(model) -> greedy_head.Int8Screen | None:
    """The lean step's copy of the model's head, or None where screening does not apply."""
    if not _applies(model) or model.lm_head.numel() > MAX_COPY_BYTES:
        return None
    return _cached("int8", model.lm_head, _int8_on_huge_pages)


def _int8_on_huge_pages(head: torch.Tensor) -> greedy_head.Int8Screen | None:
    """The int8 copy, its codes moved onto 2 MiB pages like the weights the lean step streams
    (engine/exec/huge_pages.py; where that is off or memory is short they stay on the heap)."""
    from engine.exec.huge_pages import arena_for

    screen = greedy_head.int8_screen(head)
    if screen is None:
        return None
    arena = arena_for([screen.codes])
    if arena is None:
        return screen
    return greedy_head.Int8Screen(arena.take(screen.codes), screen.scale, screen.coef)


def bf16_screen(model) -> greedy_head.Bf16Screen | None:
    """The loop's screened head (fp32 weights only), or None."""
    if (
        not _applies(model)
        or model.lm_head.dtype != torch.float32
        or 2 * model.lm_head.numel() > MAX_COPY_BYTES
        or not greedy_head.Bf16Screen.available()
    ):
        return None
    return _cached("bf16", model.lm_head, greedy_head.Bf16Screen)
