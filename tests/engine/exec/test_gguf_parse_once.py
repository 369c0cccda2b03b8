"""engine/exec/gguf_parse_once.py: inside the context one GGUF reader per file and a memoised tensor-name
table; outside, gguf is exactly as before. A tiny GGUF written here (no model needed)."""

import gguf
import numpy as np

from engine.exec.gguf_parse_once import gguf_parsed_once


def _tiny_gguf(path):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_string("general.name", "tiny")
    w.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_one_reader_per_file_inside_and_gguf_restored_after(tmp_path):
    a, b = _tiny_gguf(tmp_path / "a.gguf"), _tiny_gguf(tmp_path / "b.gguf")
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with gguf_parsed_once():
        first = gguf.GGUFReader(a)
        assert gguf.GGUFReader(str(a)) is first  # the same file: parsed once
        assert gguf.GGUFReader(b) is not first  # another file: its own reader
        assert bytes(first.fields["general.name"].parts[-1]) == b"tiny"
        assert np.array_equal(
            np.asarray(first.tensors[0].data).reshape(3, 4),
            np.arange(12, dtype=np.float32).reshape(3, 4),
        )
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
        assert gguf.get_tensor_name_map(arch, 2).get_name("model.embed_tokens") == "token_embd"
    assert gguf.GGUFReader is reader_class and gguf.get_tensor_name_map is name_map
    assert isinstance(gguf.GGUFReader(a), reader_class) and gguf.GGUFReader(
        a
    ) is not gguf.GGUFReader(a)


def test_restored_when_the_body_raises(tmp_path):
    reader_class = gguf.GGUFReader
    try:
        with gguf_parsed_once():
            raise KeyError("unsupported architecture")
    except KeyError:
        pass
    assert gguf.GGUFReader is reader_class
