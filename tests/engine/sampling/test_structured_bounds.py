"""engine/sampling/structured/bounds.py (issue 48.5): the product of nested counted repetitions
in a regex, a Lark grammar (through its rules) and a JSON schema's patterns; ordinary patterns
stay far below the bound, the ones that fail mid-generation in llguidance are far above it."""

import pytest

from engine.sampling.structured.bounds import (
    MAX_REPEAT_PRODUCT,
    check_repetition,
    lark_repeat_product,
    regex_repeat_product,
    schema_repeat_product,
)


@pytest.mark.parametrize(
    "rx,product",
    [
        ("a{1000}{1000}", 10**6),
        ("(a{1000}){1000}", 10**6),
        ("^\\d{1,1000}{1,1000}$", 10**6),
        ("((a{30}){30}){30}", 27_000),
        ("(a|b{100}){100}", 10_000),
        ("(?:ab){50}", 50),
        ("SN-[0-9]{4}-[A-Z]{2}", 4),
        ("[a-z]{1,20}@[a-z]{2,5}\\.com", 20),
        ("\\p{L}{1,50}", 50),
        ("a\\{1000\\}{10}", 10),
        ("[{]{3}x*", 3),
        ("^[A-Z][a-z]+/[A-Z][a-z]+$", 1),
    ],
)
def test_regex_products(rx, product):
    assert regex_repeat_product(rx) == product


def test_lark_rules_multiply_where_they_are_used_and_recursion_counts_once():
    assert lark_repeat_product('start: x{1000}\nx: "a"{1000}') == 10**6
    assert lark_repeat_product("start: /a{1000}{1000}/") == 10**6
    assert lark_repeat_product('start: item+\nitem: "a" | b\nb: "c" item ~ 3') == 3
    assert (
        lark_repeat_product('%ignore WS\nstart: a b\na: "x"{10}\nb: a{20}\n%import common.WS')
        == 200
    )
    assert (
        lark_repeat_product('start: %json {"type": "string", "pattern": "x{500}{500}"}') == 250_000
    )


def test_schema_patterns_and_the_refusal_sentence():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": "^a{1000}{1000}$"}},
        "patternProperties": {"^k{5}$": {}},
    }
    assert schema_repeat_product(schema) == 10**6
    check_repetition("regex", "a{100}{100}")  # at the bound: accepted
    assert MAX_REPEAT_PRODUCT == 10_000
    with pytest.raises(ValueError, match="repeats a piece 1,000,000 times"):
        check_repetition("json_schema", schema)
    check_repetition("choice", ["x" * 5000])  # nothing to multiply
