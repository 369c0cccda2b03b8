"""Structured outputs and tool calls through the official `openai` client against the real server:
`chat.completions.parse` with Pydantic models over 30 schemas (nested objects, arrays, enums,
bounded numbers, optional fields), every output checked with `jsonschema`; tool_choice required /
named / auto, streamed tool calls reassembled by the SDK, n=3 constrained choices, vLLM's
structured_outputs extras, logit_bias, and continue_final_message."""

from __future__ import annotations

import asyncio
import json
import re
from enum import Enum
from typing import Literal, Optional

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field, conlist

pytestmark = pytest.mark.slow


class Color(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Address(BaseModel):
    street: str = Field(max_length=40)
    city: str = Field(max_length=30)
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Item(BaseModel):
    name: str = Field(max_length=20)
    qty: int = Field(ge=1, le=99)


def _models() -> list[type[BaseModel]]:
    class Person(BaseModel):
        name: str = Field(max_length=30)
        age: int = Field(ge=0, le=120)

    class PersonAddr(BaseModel):
        name: str = Field(max_length=30)
        address: Address

    class Order(BaseModel):
        id: int = Field(ge=1, le=10000)
        items: conlist(Item, min_length=1, max_length=3)

    class Paint(BaseModel):
        color: Color
        coats: int = Field(ge=1, le=3)

    class Flag(BaseModel):
        enabled: bool
        reason: Optional[str] = Field(max_length=30)

    class Temperature(BaseModel):
        celsius: float = Field(ge=-90, le=60)
        place: str = Field(max_length=30)

    class Tags(BaseModel):
        tags: conlist(Literal["a", "b", "c", "d"], max_length=4)

    class Score(BaseModel):
        player: str = Field(max_length=20)
        score: int = Field(ge=0, le=100)
        rank: Literal["gold", "silver", "bronze"]

    class Book(BaseModel):
        title: str = Field(max_length=40)
        year: int = Field(ge=1450, le=2030)
        authors: conlist(str, min_length=1, max_length=2)

    class Point(BaseModel):
        x: float = Field(ge=-10, le=10)
        y: float = Field(ge=-10, le=10)

    class Polygon(BaseModel):
        points: conlist(Point, min_length=3, max_length=4)

    class Recipe(BaseModel):
        dish: str = Field(max_length=30)
        minutes: int = Field(ge=1, le=240)
        vegetarian: bool

    class Maybe(BaseModel):
        nickname: Optional[str] = Field(max_length=20)
        age: Optional[int] = Field(ge=0, le=120)

    class Company(BaseModel):
        name: str = Field(max_length=30)
        hq: Address
        employees: int = Field(ge=1, le=1000000)

    class Ticket(BaseModel):
        priority: Literal[1, 2, 3]
        title: str = Field(max_length=40)

    class Pet(BaseModel):
        kind: Literal["cat", "dog", "fish"]
        name: str = Field(max_length=20)
        legs: int = Field(ge=0, le=4)

    class Family(BaseModel):
        pets: conlist(Pet, max_length=2)

    class Event(BaseModel):
        name: str = Field(max_length=30)
        date: str = Field(pattern=r"^20[0-9]{2}-[01][0-9]-[0-3][0-9]$")

    class Rating(BaseModel):
        stars: float = Field(ge=0, le=5)
        comment: str = Field(max_length=50)

    class Matrix(BaseModel):
        rows: conlist(conlist(int, min_length=2, max_length=2), min_length=2, max_length=2)

    class Inventory(BaseModel):
        warehouse: str = Field(max_length=20)
        items: conlist(Item, max_length=2)
        colors: conlist(Color, max_length=2)

    class Login(BaseModel):
        user: str = Field(pattern=r"^[a-z]{3,10}$")
        admin: bool

    class Money(BaseModel):
        amount: float = Field(gt=0, lt=1000)
        currency: Literal["EUR", "USD", "GBP"]

    class Nested3(BaseModel):
        class Inner(BaseModel):
            class Core(BaseModel):
                value: int = Field(ge=0, le=9)

            core: Core

        inner: Inner

    class Answer(BaseModel):
        answer: Literal["yes", "no"]

    class Weather(BaseModel):
        city: str = Field(max_length=20)
        sky: Literal["sunny", "cloudy", "rainy"]
        wind_kmh: int = Field(ge=0, le=200)

    class Song(BaseModel):
        title: str = Field(max_length=30)
        seconds: int = Field(ge=30, le=600)
        genre: Optional[Literal["pop", "rock", "jazz"]]

    class Contact(BaseModel):
        email: str = Field(pattern=r"^[a-z]{1,10}@[a-z]{1,10}\.(com|org)$")
        phone: Optional[str] = Field(pattern=r"^[0-9]{3}-[0-9]{4}$")

    class Shape(BaseModel):
        sides: int = Field(ge=3, le=8)
        regular: bool
        name: str = Field(max_length=20)

    class Trip(BaseModel):
        start: Address
        stops: conlist(str, max_length=2)
        days: int = Field(ge=1, le=30)

    return [
        Person,
        PersonAddr,
        Order,
        Paint,
        Flag,
        Temperature,
        Tags,
        Score,
        Book,
        Point,
        Polygon,
        Recipe,
        Maybe,
        Company,
        Ticket,
        Pet,
        Family,
        Event,
        Rating,
        Matrix,
        Inventory,
        Login,
        Money,
        Nested3,
        Answer,
        Weather,
        Song,
        Contact,
        Shape,
        Trip,
    ]


def test_parse_with_30_pydantic_models_all_validate(aclient, model_id):
    models = _models()
    assert len(models) == 30

    async def one(i, m):
        return await aclient.chat.completions.parse(
            model=model_id,
            response_format=m,
            max_tokens=250,
            temperature=0 if i % 2 else 0.7,
            seed=i,
            messages=[{"role": "user", "content": f"Give an example {m.__name__} as JSON."}],
        )

    async def run():
        return await asyncio.gather(*(one(i, m) for i, m in enumerate(models)))

    results = asyncio.run(run())
    for m, r in zip(models, results):
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "stop", (m.__name__, msg.content)
        assert isinstance(msg.parsed, m), (m.__name__, msg.content)
        jsonschema.validate(json.loads(msg.content), m.model_json_schema())


def test_n3_constrained_choices_all_validate(client, model_id):
    schema = {
        "type": "object",
        "properties": {
            "animal": {"enum": ["cat", "dog", "owl"]},
            "age": {"type": "integer", "minimum": 0, "maximum": 30},
        },
        "required": ["animal", "age"],
    }
    r = client.chat.completions.create(
        model=model_id,
        n=3,
        temperature=1.0,
        seed=3,
        max_tokens=60,
        messages=[{"role": "user", "content": "An animal as JSON."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": schema, "strict": True},
        },
    )
    assert len(r.choices) == 3
    for c in r.choices:
        jsonschema.validate(json.loads(c.message.content), schema)


def test_structured_outputs_extras_regex_and_choice(client, model_id):
    msgs = [{"role": "user", "content": "Invent a serial number."}]
    r = client.chat.completions.create(
        model=model_id,
        messages=msgs,
        max_tokens=20,
        temperature=0.8,
        seed=1,
        extra_body={"structured_outputs": {"regex": r"SN-[0-9]{4}-[A-Z]{2}"}},
    )
    assert re.fullmatch(r"SN-[0-9]{4}-[A-Z]{2}", r.choices[0].message.content)
    r = client.chat.completions.create(
        model=model_id, messages=msgs, max_tokens=5, extra_body={"guided_choice": ["alpha", "beta"]}
    )
    assert r.choices[0].message.content in ("alpha", "beta")
    r = client.completions.create(
        model=model_id,
        prompt="The answer is",
        max_tokens=10,
        extra_body={"structured_outputs": {"choice": [" yes", " no"]}},
    )
    assert r.choices[0].text in (" yes", " no")


def test_json_object_mode(client, model_id):
    r = client.chat.completions.create(
        model=model_id,
        max_tokens=120,
        response_format={"type": "json_object"},
        messages=[{"role": "user", "content": 'Reply with {"ok": true} as JSON.'}],
    )
    c = r.choices[0]
    assert c.message.content.startswith("{")
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.message.content), dict)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time in a timezone",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z]+$"}},
            "required": ["tz"],
        },
    },
}
SCHEMAS = {
    "get_weather": WEATHER["function"]["parameters"],
    "get_time": TIME["function"]["parameters"],
}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}]
)
@pytest.mark.parametrize("parallel", [True, False])
def test_required_and_named_tool_calls_validate(aclient, model_id, choice, parallel):
    async def three_seeds():  # at once, as three clients would: the engine batches them
        return await asyncio.gather(
            *(
                aclient.chat.completions.create(
                    model=model_id,
                    messages=ASK,
                    tools=[WEATHER, TIME],
                    tool_choice=choice,
                    parallel_tool_calls=parallel,
                    max_tokens=120,
                    temperature=0.8,
                    seed=seed,
                )
                for seed in range(3)
            )
        )

    for r in asyncio.run(three_seeds()):
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        assert c.message.tool_calls and (parallel or len(c.message.tool_calls) == 1)
        for call in c.message.tool_calls:
            if isinstance(choice, dict):
                assert call.function.name == "get_time"
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
            assert call.id.startswith("call_") and call.type == "function"


def test_streamed_tool_calls_are_reassembled_by_the_sdk(client, model_id):
    kw = dict(
        model=model_id,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="required",
        max_tokens=120,
        temperature=0,
        parallel_tool_calls=False,
    )
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    with client.chat.completions.stream(**kw) as stream:
        deltas = [e for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert final.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == (
        whole.function.name,
        json.loads(whole.function.arguments),
    )
    assert len(deltas) > 1  # arguments arrive in fragments, not in one piece
    # raw chunks: the first tool-call delta carries index, id, type and name; later ones only fragments
    chunks = list(client.chat.completions.create(stream=True, **kw))
    tc = [
        ch.choices[0].delta.tool_calls[0]
        for ch in chunks
        if ch.choices and ch.choices[0].delta.tool_calls
    ]
    assert tc[0].index == 0 and tc[0].id and tc[0].function.name == whole.function.name
    assert all(t.id is None and t.function.name is None for t in tc[1:])
    assert "".join(t.function.arguments or "" for t in tc) == call.function.arguments


def test_tool_result_in_history_and_auto_choice(client, model_id):
    call = {
        "id": "call_1",
        "type": "function",
        "function": {
            "name": "get_weather",
            "arguments": json.dumps({"city": "Paris", "unit": "celsius"}),
        },
    }
    msgs = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": json.dumps({"temp_c": 21, "sky": "sunny"}),
        },
    ]
    r = client.chat.completions.create(
        model=model_id, messages=msgs, tools=[WEATHER], max_tokens=60, temperature=0
    )
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    if c.message.tool_calls:  # auto: a call, if made, still fits its schema
        for t in c.message.tool_calls:
            jsonschema.validate(json.loads(t.function.arguments), SCHEMAS[t.function.name])
    else:
        assert c.message.content
    r = client.chat.completions.create(
        model=model_id, messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=20
    )
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason != "tool_calls"


def test_logit_bias_on_both_endpoints(client, model_id, llm):
    tok = llm.get_tokenizer().encode(" banana", add_special_tokens=False)[0]
    r = client.completions.create(
        model=model_id,
        prompt="My favourite fruit is",
        max_tokens=2,
        temperature=0,
        logit_bias={str(tok): 100},
    )
    assert r.choices[0].text == " banana banana"
    r = client.chat.completions.create(
        model=model_id, messages=ASK, max_tokens=2, temperature=0, logit_bias={str(tok): 100}
    )
    assert r.choices[0].message.content == " banana banana"


def test_continue_final_message_extends_the_assistant_message(client, model_id):
    q = [{"role": "user", "content": "Write one sentence about the moon."}]
    full = (
        client.chat.completions.create(
            model=model_id,
            messages=q,
            max_tokens=24,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        .choices[0]
        .message.content
    )
    cut = full[: full.index(" ", 12)]  # a word boundary: the same ids when re-tokenized
    rest = client.chat.completions.create(
        model=model_id,
        messages=q + [{"role": "assistant", "content": cut}],
        max_tokens=40,
        temperature=0,
        extra_body={
            "continue_final_message": True,
            "add_generation_prompt": False,
            "ignore_eos": True,
        },
    )
    assert (cut + rest.choices[0].message.content).startswith(full)
    with pytest.raises(openai.BadRequestError, match="continue_final_message"):
        client.chat.completions.create(
            model=model_id,
            messages=q,
            max_tokens=2,
            extra_body={"continue_final_message": True, "add_generation_prompt": False},
        )


def test_without_the_grammar_library_structured_requests_are_400_and_others_run(
    client, model_id, monkeypatch
):
    from engine.sampling.structured import compiler

    monkeypatch.setattr(compiler, "llguidance", None)
    with pytest.raises(openai.BadRequestError, match="llguidance"):
        client.chat.completions.create(
            model=model_id, messages=ASK, max_tokens=5, response_format={"type": "json_object"}
        )
    with pytest.raises(openai.BadRequestError, match="llguidance"):
        client.chat.completions.create(
            model=model_id, messages=ASK, max_tokens=5, tools=[WEATHER], tool_choice="required"
        )
    r = client.chat.completions.create(model=model_id, messages=ASK, max_tokens=3)
    assert r.choices[0].message.content


@pytest.mark.parametrize(
    "extra",
    [
        {"structured_outputs": {"regex": "a{1000}{1000}"}},
        {"structured_outputs": {"regex": "(a{1000}){1000}"}},
        {"guided_grammar": 'start: x{1000}\nx: "a"{1000}'},
        {"structured_outputs": {"json": {"type": "string", "pattern": "^(ab{100}){200}$"}}},
    ],
)
def test_a_constraint_that_would_blow_up_mid_generation_is_400_at_validation(
    client, model_id, extra
):
    """Issue 48.5: these compile, then fail mid-generation ("lexer error: too many expressions
    constructed": a 500 after tokens were sent, not every time) and slow every step until then.
    Nested counts are now bounded before compiling (engine/sampling/structured/bounds.py)."""
    with pytest.raises(openai.BadRequestError, match="use \\* or \\+ for long runs") as e:
        client.chat.completions.create(
            model=model_id,
            max_tokens=8,
            temperature=0,
            extra_body=extra,
            messages=[{"role": "user", "content": "Write some letters."}],
        )
    assert e.value.status_code == 400
