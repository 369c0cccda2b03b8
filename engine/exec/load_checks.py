"""Checks a model must pass before the engine spends minutes loading it, each failing in a sentence.

Why before: a model too large for the machine is otherwise found out by the kernel's OOM killer
halfway through reading weights (the app dies without a word), and a chat template that cannot
render is otherwise found out by the first user who sends a message. Both are refused at start-up
with a ModelLoadError that says what to do.
"""

from __future__ import annotations

import glob
import os

from engine.errors import ModelLoadError

# the loader holds the checkpoint in fp32 while it prepares the model's own copy (engine/exec/
# models/llama_weights.py): about twice the fp32 weights at the peak
LOAD_PEAK_FACTOR = 2.0


def available_memory_bytes() -> int | None:
    """MemAvailable (Linux), None where it cannot be read (then nothing is refused)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def folder_weight_elements(folder: str) -> int:
    """Elements of a folder's safetensors weights, from their headers (nothing is read)."""
    from safetensors import safe_open

    n = 0
    for f in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        with safe_open(f, "pt") as g:
            for k in g.keys():  # noqa: SIM118 (safe_open is not a dict)
                shape = g.get_slice(k).get_shape()
                size = 1
                for s in shape:
                    size *= int(s)
                n += size
    return n


def gguf_weight_elements(path: str) -> int:
    """Elements of a GGUF's tensors, from its tensor table."""
    import gguf

    return sum(int(t.n_elements) for t in gguf.GGUFReader(path).tensors)


def check_fits_memory(elements: int, what: str, bytes_per_element: int = 4) -> None:
    """ModelLoadError when loading `elements` weights (held as fp32 while loading) cannot fit."""
    avail = available_memory_bytes()
    need = elements * bytes_per_element * LOAD_PEAK_FACTOR
    if avail is not None and need > avail:
        raise ModelLoadError(
            f"{what} is too large for this machine: loading its {elements / 1e9:.2f} B weights takes about "
            f"{need / 2**30:.1f} GiB of memory and {avail / 2**30:.1f} GiB is available. Pick a smaller "
            "model, or close other programs and try again"
        )


PROBE = [{"role": "user", "content": "Hello, can you hear me?"}]


def check_chat_template(tokenizer, what: str) -> None:
    """ModelLoadError when the model's chat template fails on a one-message chat or drops the
    message (a model without a template is not refused: its prompts are plain text or token ids)."""
    if not getattr(tokenizer, "chat_template", None):
        return
    from engine.text.chat_tokens import encode_chat, render_chat

    try:
        text = render_chat(tokenizer, PROBE)
        encode_chat(tokenizer, PROBE)
    except Exception as e:  # jinja errors, a template calling raise_exception, a missing filter
        raise ModelLoadError(
            f"the chat template of {what} cannot be rendered ({type(e).__name__}: {e}); "
            "the model cannot be chatted with safely"
        ) from e
    if PROBE[0]["content"] not in text:
        raise ModelLoadError(
            f"the chat template of {what} leaves the user's message out of the prompt; "
            "the model cannot be chatted with"
        )
