"""HF transformers baselines on the same token ids: one at a time, static batch, continuous batching.

Token times come from a logits processor that stamps each generation step (it runs right after
the step's forward, before sampling, for the whole batch at once). EOS is disabled
(eos_token_id=-1) so HF generates exactly as many tokens as the engine with ignore_eos.
KV bytes are measured from the cache object that generate returns (DynamicCache layers' key and
value tensors), or from the preallocated cache tensor of the continuous-batching manager.
"""

from __future__ import annotations

import time

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
)

from bench.engine_runner import RequestTiming


class StepClock(LogitsProcessor):
    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


def load_hf(folder: str):
    import transformers

    transformers.logging.set_verbosity_error()
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def cache_bytes(cache) -> int:
    if cache is None:
        return 0
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return sum(
            t.nbytes
            for layer in layers
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
            if isinstance(t, torch.Tensor)
        )
    return sum(t.nbytes for kv in cache for t in kv if isinstance(t, torch.Tensor))  # legacy tuples


def _gen_config(max_new: int, pad_id: int) -> GenerationConfig:
    return GenerationConfig(
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=-1,
        pad_token_id=pad_id,
        return_dict_in_generate=True,
    )


@torch.inference_mode()
def generate_padded(model, batch: list[list[int]], max_new: int, pad_id: int):
    """One HF generate over a left-padded batch. Returns (t_start, step_times, new_ids, kv_bytes)."""
    width = max(len(x) for x in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for r, x in enumerate(batch):
        ids[r, width - len(x) :] = torch.tensor(x)
        mask[r, width - len(x) :] = 1
    clock = StepClock()
    t0 = time.perf_counter()
    out = model.generate(
        ids,
        attention_mask=mask,
        generation_config=_gen_config(max_new, pad_id),
        logits_processor=LogitsProcessorList([clock]),
    )
    t1 = time.perf_counter()
    cache = getattr(out, "cache", None)
    if cache is None:
        cache = getattr(out, "past_key_values", None)
    new = out.sequences[:, width:].tolist()
    return t0, clock.times, new, cache_bytes(cache), t1


def run_static(model, prompts: list[list[int]], max_tokens: list[int], pad_id: int) -> dict:
    """The traditional method: the whole batch runs until its longest request is done."""
    longest = max(max_tokens)
    t0, steps, new, kv, t1 = generate_padded(model, prompts, longest, pad_id)
    timings = []
    for ids, k, row in zip(prompts, max_tokens, new):
        rt = RequestTiming(
            t0,
            token_times=steps[:k],
            token_ids=row[:k],
            prompt_ids=list(ids),
            prompt_tokens=len(ids),
        )
        timings.append(rt)
    width = max(len(x) for x in prompts)
    return {
        "timings": timings,
        "t0": t0,
        "wall_s": t1 - t0,
        "peak_kv_bytes": kv,
        "prefill_tokens_computed": width * len(prompts),
        "generated_tokens_computed": longest * len(prompts),
    }


def run_one_at_a_time(model, prompts: list[list[int]], max_tokens: list[int], pad_id: int) -> dict:
    timings, peak, wall = [], 0, 0.0
    for ids, k in zip(prompts, max_tokens):
        t0, steps, new, kv, t1 = generate_padded(model, [ids], k, pad_id)
        timings.append(
            RequestTiming(
                t0,
                token_times=steps,
                token_ids=new[0],
                prompt_ids=list(ids),
                prompt_tokens=len(ids),
            )
        )
        peak, wall = max(peak, kv), wall + (t1 - t0)
    return {
        "timings": timings,
        "t0": timings[0].submit if timings else 0.0,
        "wall_s": wall,
        "peak_kv_bytes": peak,
        "prefill_tokens_computed": sum(len(p) for p in prompts),
    }


def run_continuous(
    model,
    prompts: list[list[int]],
    max_tokens: list[int],
    pad_id: int,
    deadline_s: float,
    max_batch_tokens: int = 512,
    page_size: int = 256,
) -> dict:
    """transformers' own paged continuous batching (generate_batch's manager, per-request lengths).
    Its cache is sized to what this workload needs (by default it takes ~half of free RAM) and its
    step budget matches the engine's CPU chunk (max_batch_tokens=512)."""
    from transformers import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    hints = WorkloadHints(
        max_prompt_length=max(len(p) for p in prompts),
        max_generated_length=max(max_tokens),
        num_requests=len(prompts),
    )
    gc = GenerationConfig(
        max_new_tokens=max(max_tokens), do_sample=False, eos_token_id=-1, pad_token_id=pad_id
    )
    pages = sum(-(-(len(p) + k) // page_size) for p, k in zip(prompts, max_tokens)) + 2
    cbc = ContinuousBatchingConfig(
        page_size=page_size, num_blocks=pages, max_batch_tokens=max_batch_tokens
    )
    t_setup = time.perf_counter()
    results, kv, timed_out = {}, 0, False
    with model.continuous_batching_context_manager(
        generation_config=gc,
        block=True,
        timeout=10,
        warmup=False,
        continuous_batching_config=cbc,
        workload_hints=hints,
    ) as mgr:
        setup_s = time.perf_counter() - t_setup
        t0 = time.perf_counter()
        rids = [
            mgr.add_request(list(p), max_new_tokens=k, eos_token_id=-1, record_timestamps=True)
            for p, k in zip(prompts, max_tokens)
        ]
        while len(results) < len(rids):
            if time.perf_counter() - t0 > deadline_s:
                timed_out = True
                break
            r = mgr.get_result(timeout=1)
            if r is not None and r.is_finished():
                results[r.request_id] = r
            elif r is None and not mgr.is_running():
                break
        t1 = time.perf_counter()
        cache = getattr(getattr(mgr, "batch_processor", None), "cache", None)
        tensor = getattr(cache, "cache_tensor", None)
        kv = tensor.nbytes if isinstance(tensor, torch.Tensor) else 0
    timings, errors = [], 0
    for rid, p in zip(rids, prompts):
        r = results.get(rid)
        if r is None or r.error:
            errors += 1
            continue
        timings.append(
            RequestTiming(
                r.created_time,
                token_times=list(r.timestamps or []),
                token_ids=list(r.generated_tokens),
                prompt_ids=list(p),
                prompt_tokens=len(p),
            )
        )
    return {
        "timings": timings,
        "t0": t0,
        "wall_s": t1 - t0,
        "peak_kv_bytes": kv,
        "setup_s": setup_s,
        "kv_bytes_kind": "preallocated paged cache tensor",
        "timed_out": timed_out,
        "finished": len(timings),
        "failed_or_missing": errors,
        "prefill_tokens_computed": sum(len(p) for p in prompts),
    }


def prefill_ttft(model, ids: list[int], pad_id: int) -> RequestTiming:
    """Time to the first token of one request (a 1-token generate): the whole prompt is computed."""
    t0, steps, new, _, _ = generate_padded(model, [ids], 1, pad_id)
    return RequestTiming(
        t0, token_times=steps, token_ids=new[0], prompt_ids=list(ids), prompt_tokens=len(ids)
    )
