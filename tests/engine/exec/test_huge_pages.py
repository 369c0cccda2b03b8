"""The lean step's weights and the KV pool on 2 MiB pages (engine/exec/huge_pages.py).

What must hold: a copy keeps dtype, shape and values and shares memory with nothing; its mapping
asked for huge pages (the `hg` flag in /proc/self/smaps, which madvise(MADV_HUGEPAGE) sets whether
or not the kernel then finds free 2 MiB pages); `PAGED_CHAT_HUGE_PAGES=0` leaves everything where
torch put it; and the real model, moved, still decodes HF's greedy tokens (a tensor put back in the
wrong slot would not). The suite itself runs with huge pages off (tests/conftest.py says why), so
this file turns them on.
"""

import pytest
import torch

from engine.exec import huge_pages


def _vm_flags(ptr: int) -> list[str]:
    """The VmFlags of the mapping holding address ptr in this process."""
    lines = open("/proc/self/smaps").read().splitlines()
    inside = False
    for line in lines:
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= ptr < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {ptr:#x}")


@pytest.fixture
def huge_on(monkeypatch):
    monkeypatch.setenv("PAGED_CHAT_HUGE_PAGES", "1")
    if not huge_pages.enabled():
        pytest.fail("this Python has no MADV_HUGEPAGE: the engine would never move its weights")


def test_copies_keep_dtype_shape_values_and_ask_for_huge_pages(huge_on):
    originals = [
        torch.randn(3, 5),
        torch.randn(4, 16).to(torch.bfloat16),
        torch.randint(-127, 128, (2, 3, 4, 16), dtype=torch.int8),
        torch.randn(1024, 768),  # 3 MiB: spans a 2 MiB page boundary
    ]
    keep = [t.clone() for t in originals]
    arena = huge_pages.arena_for(originals)
    assert arena is not None
    copies = [arena.take(t) for t in originals]
    for t, c, k in zip(originals, copies, keep):
        assert c.dtype == t.dtype and c.shape == t.shape and c.is_contiguous()
        assert torch.equal(c, k)
        assert c.data_ptr() != t.data_ptr()
        assert "hg" in _vm_flags(c.data_ptr())
    copies[0].add_(1)  # no copy aliases its original or its neighbour
    assert torch.equal(originals[0], keep[0]) and torch.equal(copies[1], keep[1])
    ends = sorted((c.data_ptr(), c.data_ptr() + c.numel() * c.element_size()) for c in copies)
    assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:]))


def test_zeros_is_a_zeroed_writable_pool_on_huge_pages(huge_on):
    z = huge_pages.zeros((2, 3, 64, 16, 3, 64), torch.float32)
    assert z.shape == (2, 3, 64, 16, 3, 64) and z.dtype == torch.float32
    assert z.count_nonzero() == 0
    assert z.data_ptr() % huge_pages.HUGE_PAGE == 0
    assert "hg" in _vm_flags(z.data_ptr())
    z[1, 2, 63] = 7.0
    assert z.sum() == 7.0 * 16 * 3 * 64


def test_off_leaves_tensors_where_torch_put_them(monkeypatch):
    monkeypatch.setenv("PAGED_CHAT_HUGE_PAGES", "0")
    t = torch.randn(1024, 768)
    assert huge_pages.arena_for([t]) is None
    z = huge_pages.zeros((1024, 1024), torch.float32)
    assert "hg" not in _vm_flags(z.data_ptr())


def test_the_real_model_moved_decodes_hf_greedy_tokens(huge_on, hf_model, tokenizer):
    from engine import LLM, SamplingParams
    from engine.text.chat_tokens import encode_chat

    ids = encode_chat(tokenizer, [{"role": "user", "content": "Name three rivers in Europe."}])
    want = hf_model.generate(
        torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.eos_token_id
    )[0, len(ids) :].tolist()
    llm = LLM(dtype="float32", kv_cache_gib=0.1, progress=lambda f, m: None)
    try:
        runner = llm.engine.runner
        model = runner.model
        assert model.lean is not None, model.cpu_path
        assert "hg" in _vm_flags(model.embed.data_ptr())  # the embedding and tied LM head
        assert "hg" in _vm_flags(runner.kv_pool.data_ptr())
        out = llm.generate(
            [{"prompt_token_ids": ids}],
            SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
        )[0].outputs[0]
    finally:
        llm.shutdown()
    n = want.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in want else len(want)
    assert list(out.token_ids)[:n] == want[:n]
