"""Semantic functions refuse wrong definitions when they are decorated, and wrong calls
before anything is sent (no server needed: nothing here reaches one)."""

from __future__ import annotations

import re

import pytest

from parrot.sdk.api import (
    Client,
    DefinitionError,
    Input,
    Output,
    SemanticFunction,
    TemplateError,
    Var,
    semantic_function,
)


def no_docstring(q: Input, a: Output):
    pass


def placeholder_without_parameter(q: Input, a: Output):
    """Q: {{q}} {{context}} A: {{a}}"""


def input_without_placeholder(q: Input, extra: Input, a: Output):
    """Q: {{q}} A: {{a}}"""


def output_without_placeholder(q: Input, a: Output, b: Output):
    """Q: {{q}} A: {{a}}"""


def adjacent_outputs(q: Input, a: Output, b: Output):
    """Q: {{q}} A: {{a}}{{b}}"""


def output_first(a: Output, q: Input):
    """{{a}} then {{q}}"""


def return_annotation(q: Input, a: Output) -> str:
    """Q: {{q}} A: {{a}}"""


def no_output(q: Input):
    """Q: {{q}}"""


def reserved_name(session: Input, a: Output):
    """Q: {{session}} A: {{a}}"""


def var_args(*q: Input, a: Output):
    """Q: {{q}} A: {{a}}"""


def unclosed(q: Input, a: Output):
    """Q: {{q}} A: {{a"""


def output_twice(q: Input, a: Output):
    """Q: {{q}} A: {{a}} again: {{a}}"""


@pytest.mark.parametrize(
    ("func", "message"),
    [
        (no_docstring, "has no docstring"),
        (placeholder_without_parameter, "placeholder {{context}} has no parameter"),
        (input_without_placeholder, "parameter 'extra' has no placeholder"),
        (output_without_placeholder, "parameter 'b' has no placeholder"),
        (adjacent_outputs, "outputs {{a}} and {{b}} are adjacent"),
        (output_first, "not preceded by any text"),
        (return_annotation, "has a return annotation"),
        (no_output, "has no Output parameter"),
        (reserved_name, "'session' is reserved"),
        (var_args, "*q"),
        (unclosed, "unclosed placeholder"),
        (output_twice, "output {{a}} appears twice"),
    ],
)
def test_definition_errors_at_decoration(func, message):
    with pytest.raises(DefinitionError, match="semantic function") as info:
        semantic_function(func)
    assert message in str(info.value) and func.__name__ in str(info.value)
    assert isinstance(info.value, TemplateError) and info.value.status is None


@pytest.mark.parametrize(
    ("sampling", "field"),
    [({"temperature": 99}, "temperature"), ({"max_tokens": 0}, "max_tokens"), ({"colour": 1}, "colour")],
)
def test_bad_output_settings_fail_at_once(sampling, field):
    with pytest.raises(DefinitionError, match=field):
        Output(**sampling)


@semantic_function(models=["m"], output_criteria="latency")
def greet(prefix, who: Input, greeting: Output(max_tokens=4, stop=["\n"])):
    """{{prefix}}Greet {{who}}: {{greeting}}"""


@semantic_function
def lead(prefix, a: Output(max_tokens=2)):
    """{{prefix}}{{a}}"""


def test_the_function_keeps_its_definition():
    assert isinstance(greet, SemanticFunction) and greet.__name__ == "greet"
    assert greet.template == "{{prefix}}Greet {{who}}: {{greeting}}"
    assert greet.models == ("m",) and greet.output_criteria == "latency"
    assert greet.__wrapped__.__doc__ == greet.__doc__


def test_wrong_calls_fail_before_sending():
    # A server that is not there: each error below must come before any request.
    session = Client("http://127.0.0.1:9").attach("s", "auth")
    with pytest.raises(RuntimeError, match="no session"):
        greet("Hi. ", "Ada")
    with pytest.raises(TypeError, match="missing a required argument: 'who'"):
        greet("Hi. ", session=session)
    with pytest.raises(TypeError, match="annotate 'prefix' with Input"):
        greet(Var(session, "var-1", "p"), "Ada", session=session)
    with pytest.raises(TypeError, match="input 'who' must be a Var or a str"):
        greet("Hi. ", 42, session=session)
    with pytest.raises(TypeError, match="output 'greeting' takes a Var, an Output or nothing"):
        greet("Hi. ", "Ada", greeting="x", session=session)
    # An empty text argument would leave the output with no text before it.
    with pytest.raises(
        TemplateError, match=re.escape("rendered template is wrong: output {{a}} is not preceded")
    ):
        lead("", session=session)
