"""The reference sampler, one row at a time: the definition the batched sampler is checked against
(test_sampler_exact.py, test_sampler_cpu_rows.py). Here so that no test module imports another."""

from collections import Counter

import torch

from engine.sampling.sampler import make_generator
from engine.sampling.sampling_params import SamplingParams


def reference_row(row, p: SamplingParams, gen, history, prompt_len):
    l = row.float().clone()
    if p.repetition_penalty != 1.0:
        for t in set(history):
            l[t] = l[t] / p.repetition_penalty if l[t] > 0 else l[t] * p.repetition_penalty
    for t, c in Counter(history[prompt_len:]).items():
        l[t] = l[t] - (p.frequency_penalty * c + p.presence_penalty)
    if p.greedy:
        return int(l.argmax())
    u = torch.rand(1, generator=gen)
    l = l / p.temperature
    vals, order = l.sort(descending=True, stable=True)
    V = len(vals)
    k = min(p.top_k, V) if p.top_k > 0 else V
    keep = vals >= vals[k - 1]
    probs = (vals.masked_fill(~keep, float("-inf")) - torch.logsumexp(vals[keep], 0)).exp()
    before = probs.cumsum(0) - probs
    keep &= before < p.top_p
    keep[0] = True
    keep &= probs >= p.min_p * probs[0]
    cdf = (probs * keep).cumsum(0)
    target = u * cdf[-1]
    j = int((cdf <= target).sum())
    j = min(j, int((cdf < cdf[-1]).sum()))  # never past the last kept token
    return int(order[j])


def reference_batch(logits, params, seeds, histories, plens):
    return [
        reference_row(logits[i], p, make_generator(s), h, n)
        for i, (p, s, h, n) in enumerate(zip(params, seeds, histories, plens))
    ]
