"""HF transformers greedy generation, the reference our engine's outputs must equal (cached per run).

`hf_greedy(ids, n, draft=engine_tokens)` answers the same question as HF `generate` (the greedy
continuation of `ids` under HF's model) in about a tenth of the time, the way HF's own assisted
generation does: one HF forward over `ids + draft` gives HF's argmax after every prefix of the
draft; the draft's tokens are kept while they are HF's argmax, the first one that is not is
replaced by HF's, and from there HF `generate` continues. Every token returned is HF's own greedy
choice given the tokens before it, whatever the draft was; a draft only saves HF the steps it got
right (on this CPU one HF decode step costs ~100 ms, one forward over 100 tokens ~0.4 s).

The only difference from `generate` is floating-point order: the accepted tokens' logits come from
one forward over all positions instead of one step per token (the same weights, the same fp32;
logits agree to ~1e-6). A token whose top two logits are that close could go either way in either
reference; tests/engine/test_hf_reference.py checks that right, wrong, short and junk drafts all
come back as `generate`'s tokens.
"""

import functools

import torch

_MODEL = {}


def set_model(model) -> None:
    _MODEL["m"] = model


def _eos_ids(m) -> set[int]:
    eos = m.generation_config.eos_token_id
    eos = m.config.eos_token_id if eos is None else eos
    return set(eos) if isinstance(eos, (list, tuple)) else {eos} - {None}


@functools.lru_cache(maxsize=None)
def _generate(ids: tuple, max_new_tokens: int, eos: bool) -> tuple:
    """HF `generate`, greedy: the plain reference."""
    m = _MODEL["m"]
    kwargs = {} if eos else {"eos_token_id": None}
    x = torch.tensor([list(ids)])
    # explicit mask: pad id == <|im_end|> occurs inside chat prompts; without eos set, HF would
    # otherwise infer a mask that hides those tokens
    with torch.no_grad():
        out = m.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=m.config.eos_token_id,
            **kwargs,
        )
    return tuple(out[0, len(ids) :].tolist())


@functools.lru_cache(maxsize=None)
def _greedy_with_draft(ids: tuple, max_new_tokens: int, eos: bool, draft: tuple) -> tuple:
    m = _MODEL["m"]
    draft = draft[:max_new_tokens]
    x = torch.tensor([list(ids) + list(draft)])
    with torch.no_grad():
        logits = m(x, attention_mask=torch.ones_like(x)).logits[0, len(ids) - 1 :]
    choice = logits.argmax(-1).tolist()  # HF's token after ids + draft[:i], for i = 0..len(draft)
    stop = _eos_ids(m) if eos else set()
    out: list[int] = []
    for i, tok in enumerate(choice):
        out.append(tok)
        if tok in stop or len(out) == max_new_tokens:
            return tuple(out)
        if i == len(draft) or tok != draft[i]:
            break  # past the draft, or HF chose otherwise: HF goes on alone
    return tuple(out) + _generate(ids + tuple(out), max_new_tokens - len(out), eos)


def hf_greedy(ids, max_new_tokens: int, stop_at_eos: bool = True, draft=None) -> list[int]:
    """HF's greedy continuation of `ids`: up to `max_new_tokens` tokens, ending with an EOS when
    `stop_at_eos`. `draft`: tokens to verify first (the engine's answer), see the module docstring."""
    ids = tuple(ids)
    if draft:
        return list(_greedy_with_draft(ids, max_new_tokens, stop_at_eos, tuple(draft)))
    return list(_generate(ids, max_new_tokens, stop_at_eos))
