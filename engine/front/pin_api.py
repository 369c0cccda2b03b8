"""The public pin operations behind `LLM.pin_prefix` / `LLM.pin_system_prompt` / `LLM.unpin`.

Why a separate module: pinning is prefill-then-hold, two steps across the engine's command queue
(engine/kv/pinning.py explains the pin itself), and engine/front/llm.py stays the thin front.
The cap is checked before anything is prefilled, so an over-cap prompt costs nothing.
"""

from __future__ import annotations

from engine.text.chat_tokens import encode_chat
from engine.text.common_prefix import common_prefix
from engine.kv.pinning import PinInfo, PinMissError
from engine.sampling.sampling_params import SamplingParams

_ATTEMPTS = 3  # a prefilled block can be evicted before the pin lands under heavy pressure


def system_prefix_ids(tokenizer, system_text: str) -> list[int]:
    """The token ids every chat with this system prompt starts with: the template's system turn
    plus whatever the template puts before the first user message's text. Found as the common
    prefix of two one-message chats, so it holds for any template."""
    if not isinstance(system_text, str) or not system_text.strip():
        raise ValueError("the system prompt is empty")
    a = encode_chat(
        tokenizer, [{"role": "system", "content": system_text}, {"role": "user", "content": "A"}]
    )
    b = encode_chat(
        tokenizer, [{"role": "system", "content": system_text}, {"role": "user", "content": "Q"}]
    )
    return a[: common_prefix(a, b)]


def pin_prefix(llm, name: str, token_ids: list[int], *, timeout: float | None = 300) -> PinInfo:
    """Prefill token_ids (if their blocks are not cached yet) and pin their full blocks under name,
    replacing an earlier pin of that name. PinCapError (a ValueError) beyond the cap."""
    ids = [int(t) for t in token_ids]
    bs = llm.config.block_size
    full = len(ids) // bs * bs
    if full == 0:
        raise ValueError(
            f"a pinned prefix needs at least one full block ({bs} tokens); got {len(ids)}"
        )
    ids = ids[:full]
    llm.run_on_engine(lambda eng: eng.pins.check_cap(name, full), timeout=timeout)
    for attempt in range(_ATTEMPTS):
        try:
            return llm.run_on_engine(
                lambda eng: _pin_and_write_through(eng, name, ids), timeout=timeout
            )
        except PinMissError:
            if attempt == _ATTEMPTS - 1:
                raise
            out = llm.generate(
                [{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, temperature=0.0)
            )
            if out[0].outputs and out[0].outputs[0].finish_reason == "error":
                raise RuntimeError(f"prefilling the pinned prompt failed: {out[0].outputs[0]}")
    raise AssertionError("unreachable")


def _pin_and_write_through(eng, name: str, ids: list[int]) -> PinInfo:
    """Pin, then write the pinned blocks to the KV tier (if any) so they survive a restart. A model
    with linear-attention layers also needs its state after the pinned tokens (a checkpoint,
    engine/kv/state_groups.py) for a hit: without one the prompt is prefilled (again) first."""
    states = eng.kv.states
    if states is not None:
        from engine.kv.block_hash import walk_blocks

        *_, last = walk_blocks(ids, None, eng.kv.block_size)
        if not states.has_checkpoint(last.hash):
            raise PinMissError(f"pin {name!r}: no state checkpoint after its {len(ids)} tokens yet")
    info = eng.pins.pin(name, ids)
    if eng.tier_link is not None:
        eng.tier_link.write_through(
            [eng.block_pool.blocks[i] for i in info.block_ids], reason="pin"
        )
        if states is not None and eng.tier_link.states is not None:  # and the state at its end
            eng.tier_link.states.write_checkpoint(last.hash, "pin")
    return info


def unpin(llm, name: str) -> bool:
    return bool(llm.run_on_engine(lambda eng: eng.pins.unpin(name)))


def pins(llm) -> list[PinInfo]:
    return llm.run_on_engine(lambda eng: eng.pins.infos())
