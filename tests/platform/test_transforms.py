"""Native string transforms: each operation, pipelines, and clear errors on bad input."""

from __future__ import annotations

import time

import msgspec
import pytest
import regex

from parrot.platform.serve.calls.transforms import Steps, apply, validate
from parrot.platform.serve.errors import TransformError


def steps(*raw: dict) -> list:
    return msgspec.convert(list(raw), Steps)


@pytest.mark.parametrize(
    ("raw", "inputs", "expected"),
    [
        ([{"type": "strip"}], ["  hi \n"], "hi"),
        ([{"type": "strip", "chars": "*"}], ["**bold**"], "bold"),
        ([{"type": "lower"}], ["MiXeD"], "mixed"),
        ([{"type": "upper"}], ["MiXeD"], "MIXED"),
        ([{"type": "regex", "pattern": r"Answer:\s*(\w+)", "group": 1}], ["Answer: yes, because"], "yes"),
        ([{"type": "regex", "pattern": r"(?P<n>\d+)", "group": "n"}], ["order 66 now"], "66"),
        ([{"type": "regex", "pattern": "YES", "ignore_case": True}], ["oh yes"], "yes"),
        (
            [{"type": "json_field", "path": "items.1.name"}],
            ['{"items": [{"name": "a"}, {"name": "b"}]}'],
            "b",
        ),
        ([{"type": "json_field", "path": "n"}], ['{"n": {"k": [1, 2]}}'], '{"k": [1, 2]}'),
        ([{"type": "join", "separator": ", "}], ["a", "b", "c"], "a, b, c"),
        ([{"type": "split_take", "separator": "\n", "index": -1}], ["one\ntwo\nthree"], "three"),
        ([{"type": "format", "template": "{1} before {0} {{x}}"}], ["A", "B"], "B before A {x}"),
        ([{"type": "strip"}, {"type": "upper"}, {"type": "join", "separator": "|"}], [" a ", "b "], "A|B"),
    ],
)
def test_operations(raw, inputs, expected):
    pipeline = steps(*raw)
    validate(pipeline)
    assert apply(pipeline, inputs) == expected


@pytest.mark.parametrize(
    ("raw", "inputs", "message"),
    [
        ([{"type": "regex", "pattern": "x(\\d+)"}], ["no digits"], "did not match"),
        ([{"type": "regex", "pattern": "(a)", "group": 3}], ["a"], "no group 3"),
        ([{"type": "json_field", "path": "a.b"}], ["not json"], "not JSON"),
        ([{"type": "json_field", "path": "a.b"}], ['{"a": {}}'], "no field 'b'"),
        ([{"type": "split_take", "separator": ",", "index": 5}], ["a,b"], "no part 5"),
        ([{"type": "format", "template": "{2}"}], ["a"], "only 1 values"),
        ([{"type": "format", "template": "{0.__class__}"}], ["a"], "lone '{'"),
        ([{"type": "lower"}], ["a", "b"], "ends with 2 values"),
    ],
)
def test_runtime_errors_say_what_went_wrong(raw, inputs, message):
    with pytest.raises(TransformError, match=message) as info:
        apply(steps(*raw), inputs)
    assert info.value.status_code == 400


def test_bad_definitions_are_rejected_before_running():
    with pytest.raises(msgspec.ValidationError, match="Invalid value 'eval'"):
        steps({"type": "eval", "code": "1+1"})
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        steps({"type": "lower", "extra": 1})
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert([], Steps)
    with pytest.raises(TransformError, match="invalid regex"):
        validate(steps({"type": "regex", "pattern": "(unclosed"}))


def test_catastrophic_regex_times_out_instead_of_hanging():
    pipeline = steps({"type": "regex", "pattern": r"(a|aa)+$"})
    with pytest.raises(TransformError, match="time budget"):
        apply(pipeline, ["a" * 60 + "b"], budget_s=0.5)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "recursion"),  # RecursionError in json.loads
        ("1" * 5000, "digits"),  # ValueError: an int string over Python's limit
        ('{"a": "\\ud800"}', r"not valid text: lone surrogate U\+D800 at character 0"),
    ],
)
def test_json_field_on_values_python_cannot_take_fails_with_a_transform_error(value, message):
    """Issue 14.4: these raised RecursionError / ValueError (or returned a lone surrogate),
    which nobody caught: the call stayed running and its variable poisoned."""
    with pytest.raises(TransformError, match=message):
        apply(steps({"type": "json_field", "path": "a"}), [value])


def test_paths_and_format_fields_that_are_not_plain_numbers_are_transform_errors():
    # "²" is a digit to str.isdigit but not to int(); a 5,000-digit field index overflows int()
    with pytest.raises(TransformError, match="no field"):
        apply(steps({"type": "json_field", "path": "²"}), ["[1, 2]"])
    with pytest.raises(TransformError, match=r"lone '\{'"):
        apply(steps({"type": "format", "template": "{" + "9" * 5000 + "}"}), ["a"])


def slow_value(seconds: float) -> str:
    """A value on which ``(a|aa)+$|b`` backtracks for about ``seconds``, then matches."""
    pattern = regex.compile(r"(a|aa)+$|b")
    for n in range(10, 60):
        started = time.monotonic()
        pattern.search("a" * n + "b")
        if time.monotonic() - started > seconds:
            return "a" * n + "b"
    raise AssertionError("no slow value")


def test_one_budget_for_all_values_of_a_transform():
    """Issue 14.1: each value had its own 0.5 s regex timeout, so 256 values that match
    after 0.2 s each held the server for 50 s; now the whole transform has one budget, and
    the reason names it."""
    pipeline = steps({"type": "regex", "pattern": r"(a|aa)+$|b"}, {"type": "join"})
    value = slow_value(0.05)
    started = time.monotonic()
    with pytest.raises(TransformError, match=r"time budget of 0\.3 s"):
        apply(pipeline, [value] * 40, budget_s=0.3)  # 2 s of work in all
    assert time.monotonic() - started < 1.0


def test_a_join_or_format_that_would_outgrow_a_value_fails_before_it_is_built():
    """256 inputs of a value's largest size joined would make gigabytes: the size is checked
    from the inputs' lengths, before the string exists."""
    steps = msgspec.convert([{"type": "join", "separator": ", "}], Steps)
    assert apply(steps, ["abc"] * 3, max_chars=13) == "abc, abc, abc"
    with pytest.raises(TransformError, match="would make a value of 15 characters, over the limit of 13"):
        apply(msgspec.convert([{"type": "join", "separator": ",  "}], Steps), ["abc"] * 3, max_chars=13)
    fmt = msgspec.convert([{"type": "format", "template": "{0}{0}{1}!"}], Steps)
    assert apply(fmt, ["ab", "c"], max_chars=6) == "ababc!"
    with pytest.raises(TransformError, match="over the limit of 5"):
        apply(fmt, ["ab", "c"], max_chars=5)
