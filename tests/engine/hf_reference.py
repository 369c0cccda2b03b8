"""HF transformers greedy generation, the reference our engine's outputs must equal (cached per run)."""
import functools

import torch

_MODEL = {}


def set_model(model) -> None:
    _MODEL["m"] = model


@functools.lru_cache(maxsize=None)
def _greedy(ids: tuple, max_new_tokens: int, eos: bool) -> tuple:
    m = _MODEL["m"]
    kwargs = {} if eos else {"eos_token_id": None}
    x = torch.tensor([list(ids)])
    # explicit mask: pad id == <|im_end|> occurs inside chat prompts; without eos set, HF would
    # otherwise infer a mask that hides those tokens
    with torch.no_grad():
        out = m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                         do_sample=False, pad_token_id=m.config.eos_token_id, **kwargs)
    return tuple(out[0, len(ids):].tolist())


def hf_greedy(ids, max_new_tokens: int, stop_at_eos: bool = True) -> list[int]:
    return list(_greedy(tuple(ids), max_new_tokens, stop_at_eos))
