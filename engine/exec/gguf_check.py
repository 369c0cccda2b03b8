"""A GGUF file checked before transformers reads it: a truncated or corrupt file gets a sentence.

Why: transformers (through gguf-py) fails deep inside numpy on such files ("cannot reshape array
of size ..." or an mmap error), which tells a user nothing. gguf-py's reader parses the header,
the metadata and the tensor table, and maps the data; a download cut short leaves the table
pointing past the end of the file, which is checked here against the file's size.
"""

from __future__ import annotations

import os

from engine.errors import ModelLoadError


def check_gguf(path: str) -> str:
    """The file's architecture; ModelLoadError in plain words when it is not a whole GGUF file."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(
            f"{path} is not a GGUF file (it does not start with the GGUF signature)"
        )
    try:
        import gguf

        reader = gguf.GGUFReader(path)
    except Exception as e:  # gguf-py raises ValueError / IndexError / struct errors on bad bytes
        raise ModelLoadError(
            f"{path} is damaged or cut short: its header and tables cannot be read "
            f"({type(e).__name__}: {e}); download it again"
        ) from e
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if end > size:
        raise ModelLoadError(
            f"{path} is cut short: its tensors need {end / 2**20:.1f} MiB but the file "
            f"has {size / 2**20:.1f} MiB; download it again"
        )
    f = reader.fields.get("general.architecture")
    return bytes(f.parts[f.data[0]]).decode("utf-8") if f is not None else ""
