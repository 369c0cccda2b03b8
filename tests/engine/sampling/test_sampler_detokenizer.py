"""Sampler transformations and the incremental detokenizer, with the real tokenizer."""

import torch

from engine.text.detokenizer import IncrementalDetokenizer
from engine.sampling.sampler import apply_penalties, make_generator, sample
from engine.sampling.sampling_params import SamplingParams


def test_top_k_top_p_min_p_masks():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])

    def kept(p):
        draws = sample(
            logits.expand(400, 5).contiguous(),
            [p] * 400,
            [make_generator(s) for s in range(400)],
            [[]] * 400,
        )
        return sorted(set(draws))

    assert kept(SamplingParams(top_k=2)) == [0, 1]
    probs = logits.softmax(-1)  # [0.64, 0.24, 0.09, 0.03, 0.01]
    assert probs[0] < 0.7 < probs[:2].sum()
    assert kept(SamplingParams(top_p=0.7)) == [0, 1]
    assert kept(SamplingParams(top_p=0.5)) == [0]
    assert kept(SamplingParams(min_p=0.3)) == [0, 1]  # 0.24/0.64 = 0.37 >= 0.3, 0.14 < 0.3
    assert kept(SamplingParams()) == [0, 1, 2, 3, 4]


def test_repetition_penalty_follows_hf_rule():
    row = torch.tensor([[2.0, -2.0, 1.0]])
    apply_penalties(row, [SamplingParams(repetition_penalty=2.0)], [[0, 1, 1]])
    assert row.tolist() == [[1.0, -4.0, 1.0]]


def test_presence_and_frequency_penalties_follow_openai_rule_on_output_only():
    row = torch.tensor([[2.0, 2.0, 2.0, 2.0]])
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    apply_penalties(row, [p], [[3, 0, 1, 1, 2]], [2])  # prompt [3, 0]; output [1, 1, 2]
    assert row.tolist() == [[2.0, 2.0 - 0.5 - 0.5, 2.0 - 0.5 - 0.25, 2.0]]


def test_seeded_draws_do_not_depend_on_batch_neighbours():
    torch.manual_seed(0)
    logits = torch.randn(3, 100)
    p = SamplingParams(temperature=1.0, seed=5)
    alone = sample(logits[1:2], [p], [make_generator(5)], [[]])
    mixed = sample(
        logits,
        [SamplingParams(temperature=1.0)] * 3,
        [make_generator(9), make_generator(5), make_generator(1)],
        [[], [], []],
    )
    assert mixed[1] == alone[0]
    greedy = sample(logits, [SamplingParams(temperature=0)] * 3, [make_generator(0)] * 3, [[]] * 3)
    assert greedy == logits.argmax(-1).tolist()


def _stream(tokenizer, text, stop=None):
    ids = tokenizer.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer(tokenizer, [1], stop)
    deltas = [d.add(t) for t in ids]
    deltas.append(d.flush())
    return deltas, d


def test_multibyte_characters_never_split(tokenizer):
    text = "Hello 世界! 🎉🚀 naïve café — 北京欢迎你 👩‍👩‍👧"
    deltas, _ = _stream(tokenizer, text)
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert len(tokenizer.encode("🎉", add_special_tokens=False)) > 1  # the case being tested exists


def test_stop_string_across_deltas_is_not_emitted(tokenizer):
    deltas, d = _stream(tokenizer, "The answer is 42. END OF ANSWER and more text", stop=["END OF"])
    assert "".join(deltas) == "The answer is 42. "
    assert d.stopped
    assert not any("END" in x for x in deltas)
