"""Deterministic workloads: every system in a run sees exactly the same token ids.

chat      N sessions sharing one ~300-token system prompt, varied user messages, output lengths
          drawn from [out_min, out_max] (EOS ignored, so every system generates the same count).
multiturn conversations x turns of user messages; the history is built by the engine's session
          run and replayed as exact ids to the other systems.
decode    equal-length short prompts (no padding anywhere), fixed output length.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from engine.text.session_prompt import continue_session_prompt

SYSTEM_PROMPT = (
    "You are Quill, the support assistant of Northwind Outfitters, a small company that sells "
    "hiking, camping and climbing gear online and in three shops. Follow these rules in every "
    "answer. Be friendly, direct and brief: most answers fit in a short paragraph, and lists are "
    "used only when the customer asks for steps or for a comparison. Never invent prices, stock "
    "levels, delivery dates or order details; when you need them, ask the customer for the order "
    "number and say that a colleague will confirm. Returns are accepted within 60 days for unused "
    "items and within 30 days for used items with a defect; the customer pays return shipping "
    "unless the item is faulty. Warranty claims on tents, sleeping bags and backpacks go to the "
    "manufacturer after the first year. We ship to the whole of Europe; orders above 80 euros ship "
    "free. Gift cards never expire and cannot be exchanged for cash. When a question is about "
    "safety in the mountains, such as avalanche risk, river crossings, altitude sickness or "
    "weather, give general advice only and recommend a local guide or the official mountain "
    "service. Do not discuss competitors. If the customer is upset, acknowledge it in one sentence "
    "before answering. Answer in the language of the customer. Sign nothing and do not add "
    "greetings at the end. If you do not know something, say so plainly and offer to hand the "
    "conversation to a human colleague during office hours, Monday to Friday, nine to six."
)

# --quick's: the prompt's first three sentences (~55 tokens, 3 full blocks: the shared prefix still
# hits), so the smoke test's prefills, HF's above all, cost a fraction of the full prompt's
SHORT_SYSTEM_PROMPT = SYSTEM_PROMPT[: SYSTEM_PROMPT.index(", and lists are used only")] + "."

_QUESTIONS = [
    "Can I return a {item} that I bought {when}?",
    "How warm is the {item} really, and would it work for {trip}?",
    "My {item} arrived damaged. What should I do?",
    "Which {item} would you recommend for {trip}?",
    "Do you ship a {item} to {place}, and how long does it take?",
    "Is the {item} worth it for a beginner planning {trip}?",
    "I want to buy a {item} as a gift. Can I pay with a gift card?",
    "What is the difference between your two cheapest {item} models?",
]
_ITEMS = [
    "tent",
    "sleeping bag",
    "backpack",
    "headlamp",
    "rain jacket",
    "pair of trekking poles",
    "stove",
    "climbing harness",
    "water filter",
    "pair of hiking boots",
]
_WHEN = ["last week", "two months ago", "yesterday", "in the spring sale", "for my brother"]
_TRIPS = [
    "a week in the Alps in October",
    "a weekend by the lake",
    "a long hike in Scotland",
    "winter camping in Norway",
    "a first multi-day trek",
    "a summer festival",
]
_PLACES = ["Portugal", "Finland", "a small island in Greece", "Vienna", "the north of Scotland"]
_DETAILS = [
    "I am about 1.85 m tall and usually sleep cold.",
    "My budget is not very large, so I would prefer something durable rather than light.",
    "Last time I bought gear from another shop the zip broke after three trips, which was annoying.",
    "We will be two adults and a dog, and we usually walk about twenty kilometres a day.",
    "I already own a good mat and a small stove, so I only need the rest.",
    "The weather forecast says rain for most of the week, with temperatures near freezing at night.",
    "I read a review that said the seams leak in heavy rain; is that still true for this year's model?",
    "I need it before the end of the month because the trip is booked and cannot be moved.",
]


@dataclass
class ChatRequest:
    prompt_ids: list[int]
    max_tokens: int


@dataclass
class Conversation:
    user_messages: list[str]
    history: list[dict] = field(default_factory=list)


def user_message(rng: random.Random) -> str:
    q = rng.choice(_QUESTIONS).format(
        item=rng.choice(_ITEMS),
        when=rng.choice(_WHEN),
        trip=rng.choice(_TRIPS),
        place=rng.choice(_PLACES),
    )
    extra = rng.sample(_DETAILS, rng.randint(0, 4))  # varied length: ~10 to ~110 tokens
    return " ".join([q] + extra) if rng.random() < 0.5 else " ".join(extra + [q])


def chat_workload(
    tokenizer, n: int, out_min: int, out_max: int, seed: int, system_prompt: str = SYSTEM_PROMPT
) -> list[ChatRequest]:
    rng = random.Random(seed)
    reqs = []
    for _ in range(n):
        msgs = [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": user_message(rng)},
        ]
        reqs.append(
            ChatRequest(
                continue_session_prompt(tokenizer, msgs, None), rng.randint(out_min, out_max)
            )
        )
    return reqs


def multiturn_workload(
    n_conv: int, n_turns: int, seed: int, system_prompt: str = SYSTEM_PROMPT
) -> list[Conversation]:
    rng = random.Random(seed + 1)
    convs = []
    for _ in range(n_conv):
        convs.append(
            Conversation(
                [user_message(rng) for _ in range(n_turns)],
                [{"role": "system", "content": system_prompt}],
            )
        )
    return convs


def decode_prompts(tokenizer, batch: int, prompt_len: int, seed: int) -> list[list[int]]:
    """Distinct windows of the same length from the workload's own text (no padding needed)."""
    rng = random.Random(seed + 2)
    text = SYSTEM_PROMPT + " " + " ".join(_DETAILS + _QUESTIONS)
    ids = tokenizer.encode(text, add_special_tokens=False)
    starts = [rng.randrange(0, len(ids) - prompt_len) for _ in range(batch)]
    return [ids[s : s + prompt_len] for s in starts]


def common_prefix_len(seqs: list[list[int]]) -> int:
    if not seqs:
        return 0
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for i in range(n):
        if any(s[i] != first[i] for s in seqs[1:]):
            return i
    return n
