"""The held-out chats for KV-format decisions (issue 49): no test reads them, nothing is tuned on them.

Why a separate set: bench/kv_accuracy.py's CHATS are also what tests/engine/kv/test_kv_cache_accuracy.py
asserts on, and issue 22's rotation was chosen on them; on six other short chats it made greedy
replies drift. A default must be picked on prompts nobody fitted it to: these 30 chats (short and
multi-turn; English, French, German, Spanish, Italian, Portuguese, Dutch, Polish, Russian, Chinese,
Japanese, Korean, Arabic, Turkish; Python, JavaScript, SQL, Rust, C and shell; arithmetic; four with
a long system prompt of ~700 tokens). `python -m bench.kv_accuracy --heldout` runs them. Keep tests
off this module (tests/test_heldout_untouched.py checks no test imports it).
"""

from __future__ import annotations

LONG_SYSTEM = (
    "You are Nora, the support assistant of Fjordline Outdoor, a small Norwegian shop that sells and rents "
    "hiking, skiing and kayaking equipment online and in two stores (Bergen, Tromsø). Follow these rules.\n"
    "1. Answer in the customer's language. Be brief: at most six sentences unless the customer asks for a list "
    "or step-by-step instructions.\n"
    "2. Prices are in Norwegian kroner (NOK) including VAT. Never invent a price: the catalogue excerpts below "
    "are the only prices you know. If something is not listed, say you will ask a colleague.\n"
    "3. Rentals: skis, boots and poles 350 NOK per day or 1,200 NOK per week; touring skis with skins 450 NOK "
    "per day; sea kayak (single) 600 NOK per day, double 900 NOK, paddles, spray skirt and life jacket included; "
    "tents (2-person) 250 NOK per day; sleeping bags (-10 C comfort) 120 NOK per day. A deposit of 2,000 NOK "
    "is blocked on the card and released within five working days after return.\n"
    "4. Purchases: free shipping in Norway above 1,500 NOK, otherwise 99 NOK. Delivery takes 2-4 working days "
    "to southern Norway and 4-7 days north of Trondheim. Returns are accepted within 30 days if the item is "
    "unused and in its original packaging; customers pay return shipping unless the item is faulty.\n"
    "5. Warranty: two years on all products, five years on tents and kayaks from our own brand (Fjordline "
    "Basecamp). Faulty items: ask for the order number, a photo and a short description, then open a case.\n"
    "6. Safety: for glacier hikes, avalanche terrain or open-sea kayaking, always recommend a certified guide "
    "and the official avalanche warning service (varsom.no); never give route-specific safety advice.\n"
    "7. Opening hours: Bergen store Monday-Friday 10:00-18:00, Saturday 10:00-16:00; Tromsø store Monday-"
    "Friday 09:00-17:00, Saturday 10:00-15:00; both closed on Sundays and public holidays. Online chat is "
    "answered 08:00-22:00 every day.\n"
    "8. Loyalty club: members get 10% off purchases (not rentals), a free ski wax each season and early "
    "access to the autumn sale. Membership is free; customers sign up with an email address at the till or "
    "online.\n"
    "9. Size advice: for boots, ask for foot length in centimetres; for skis, ask for height, weight and "
    "whether they ski mostly on groomed tracks or off-piste. Children's skis: body height minus 10-15 cm.\n"
    "10. Never share another customer's data, never ask for a full card number, and do not discuss "
    "competitors' prices. If a customer is upset, apologise once, then focus on a solution.\n"
    "Catalogue excerpt: Basecamp Trek 2 tent 3,490 NOK; Basecamp Down -10 sleeping bag 2,790 NOK; Aurora GTX "
    "hiking boots 2,199 NOK; Fjell 45 L backpack 1,499 NOK; Merino base layer set 899 NOK; Headlamp 400 lm "
    "349 NOK; Ski wax kit 299 NOK; Dry bag 20 L 249 NOK; Trekking poles carbon 799 NOK; Gaiters 399 NOK.\n"
    "Today is a weekday in late February. The Tromsø store has a ski-touring evening on Thursday at 18:30 "
    "(free, sign up at the till). Current campaign: 20% off all sleeping bags until Sunday."
)

SHORT_SYSTEM = "You are a helpful assistant. Answer clearly and concisely."

_U, _A = "user", "assistant"

CHATS: list[list[tuple[str, str]]] = [
    # ---- English, general ----
    [(_U, "What is the difference between weather and climate? Explain with one example.")],
    [
        (
            _U,
            "I have eggs, spinach, feta and half an onion. What can I cook for dinner in 20 minutes?",
        )
    ],
    [
        (
            _U,
            "Write a short, friendly email to my landlord saying the kitchen tap has been dripping for a week.",
        )
    ],
    [
        (
            _U,
            "My plant's leaves are turning yellow at the bottom. I water it every day. What am I doing wrong?",
        ),
        (
            _A,
            "Yellow lower leaves with daily watering usually mean too much water: the roots cannot breathe "
            "and start to rot. Check whether the soil is still wet a few centimetres down.",
        ),
        (_U, "It is wet. Should I repot it now or wait?"),
    ],
    # ---- arithmetic / reasoning ----
    [
        (
            _U,
            "A train leaves at 14:35 and arrives at 18:10. How long is the journey? Show your steps.",
        )
    ],
    [
        (
            _U,
            "If three notebooks cost 7.50 euros, how much do eight notebooks cost? Explain briefly.",
        )
    ],
    # ---- code ----
    [
        (
            _U,
            "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
        )
    ],
    [
        (
            _U,
            "What does this JavaScript print, and why?\n```js\nconst a = [1, 2, 3];\nconst b = a;\nb.push(4);\n"
            "console.log(a.length, a === b);\n```",
        )
    ],
    [
        (
            _U,
            "Write an SQL query that returns the five customers with the highest total order amount from "
            "tables customers(id, name) and orders(id, customer_id, amount).",
        )
    ],
    [
        (
            _U,
            "Explain what this Rust code does:\n```rust\nfn main() {\n    let v: Vec<i32> = (1..=10).filter(|x| "
            "x % 3 == 0).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n```",
        )
    ],
    [
        (
            _U,
            "Why does this C code crash sometimes?\n```c\nchar *copy(const char *s) {\n    char buf[64];\n"
            "    strcpy(buf, s);\n    return buf;\n}\n```",
        )
    ],
    [
        (
            _U,
            "Give me a bash one-liner that counts the lines of all .py files in a directory tree.",
        ),
        (_A, "You can use: `find . -name '*.py' -print0 | xargs -0 wc -l | tail -n 1`"),
        (_U, "How do I exclude the venv folder from that?"),
    ],
    # ---- other languages ----
    [(_U, "Bonjour ! Pouvez-vous m'expliquer simplement comment fonctionne une pompe à chaleur ?")],
    [
        (
            _U,
            "Ich möchte Deutsch lernen. Welche drei Gewohnheiten helfen am meisten im ersten Monat?",
        )
    ],
    [(_U, "¿Cuál es la diferencia entre 'ser' y 'estar'? Dame dos ejemplos de cada uno.")],
    [
        (
            _U,
            "Ciao! Sto organizzando una cena per sei persone. Mi suggerisci un menù vegetariano semplice?",
        )
    ],
    [(_U, "Olá, quais são as vantagens de andar de bicicleta para ir ao trabalho?")],
    [(_U, "Hoi! Kun je uitleggen waarom de Nederlanders zoveel fietsen?")],
    [(_U, "Dzień dobry, jak najlepiej przygotować się do rozmowy o pracę?")],
    [(_U, "Привет! Объясни, пожалуйста, что такое инфляция, простыми словами.")],
    [(_U, "请用简单的话解释一下什么是人工智能，并举一个日常生活中的例子。")],
    [(_U, "こんにちは。東京で初めて一人旅をするのですが、おすすめの過ごし方を教えてください。")],
    [(_U, "안녕하세요! 건강하게 잠을 잘 자는 방법을 알려 주세요.")],
    [(_U, "مرحبا! ما هي أفضل طريقة لتعلم لغة جديدة بسرعة؟")],
    [(_U, "Merhaba, İstanbul'da bir günüm var. Neleri görmeliyim?")],
    [
        (
            _U,
            "J'ai écrit : « Je suis allé au magasin hier et j'ai acheter du pain. » Y a-t-il une faute ?",
        ),
        (_A, "Oui : après « j'ai », il faut le participe passé : « j'ai acheté du pain »."),
        (_U, "Merci ! Et pourquoi « je suis allé » et pas « j'ai allé » ?"),
    ],
    # ---- the long system prompt ----
    [
        (
            _U,
            "Hi, I want to rent touring skis for four days next week in Tromsø. What will it cost in total?",
        )
    ],
    [
        (
            _U,
            "Hei! Jeg kjøpte et telt for tre uker siden, og glidelåsen har gått i stykker. Hva gjør jeg?",
        )
    ],
    [
        (_U, "Is the down sleeping bag on sale right now? And do I get the club discount on top?"),
        (
            _A,
            "Yes: all sleeping bags are 20% off until Sunday, so the Basecamp Down -10 costs 2,232 NOK "
            "instead of 2,790 NOK.",
        ),
        (_U, "Great. And can I pick it up in Bergen on Saturday afternoon at 17:00?"),
    ],
    [
        (
            _U,
            "We are two adults planning a kayak trip on the open sea near Lofoten. Which route is safest, and "
            "what gear should we rent?",
        )
    ],
]

SYSTEMS = [SHORT_SYSTEM] * 26 + [LONG_SYSTEM] * 4  # the last four chats use the long system prompt


def messages() -> list[list[dict]]:
    """Each chat as OpenAI-style messages, system prompt first (what llama-server's
    /v1/chat/completions and the engine's chat template both take)."""
    assert len(SYSTEMS) == len(CHATS)
    return [
        [{"role": "system", "content": s}] + [{"role": r, "content": c} for r, c in turns]
        for s, turns in zip(SYSTEMS, CHATS)
    ]


def token_ids(tokenizer) -> list[list[int]]:
    """The chats through the model's chat template, with the generation prompt."""
    out = []
    for msgs in messages():
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out
