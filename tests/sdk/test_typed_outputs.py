"""Typed outputs from the SDK on the real stack (``parrot serve`` with the builtin engine
and the bundled model): ``Output(schema=...)``, ``regex``, ``choice``, ``json_object``;
``var.get()`` parses, ``get_text()`` is the text; a later call reads a field of a typed
variable on the server (``{{city.name}}``); bad formats fail before anything is sent."""

from __future__ import annotations

import json
import re

import msgspec
import pytest
from conftest import REPO_ROOT
from pydantic import BaseModel, ConfigDict, Field

from parrot.sdk.api import (
    AsyncClient,
    BadRequestError,
    Client,
    DefinitionError,
    Input,
    Output,
    Var,
    semantic_function,
)
from parrot.wire.bodies import CallParameter
from parrot.wire.formats import OutputFormat


class City(BaseModel):
    model_config = ConfigDict(extra="forbid")  # no keys but these: the answer stays short

    name: str = Field(max_length=16)
    country: str = Field(max_length=16)


CITY_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "population": {"type": "integer"}},
    "required": ["name", "population"],
    "additionalProperties": False,
}
DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"  # (\d would allow any Unicode digit, as in Python)
TURN = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"


@semantic_function
def describe_city(question: Input, city: Output(schema=City, max_tokens=40, temperature=0)):
    """<|im_start|>user
    {{question}} Answer in JSON.<|im_end|>
    <|im_start|>assistant
    {{city}}"""


@semantic_function
def tell_more(city: Input, note: Output(max_tokens=4, temperature=0)):
    """<|im_start|>user
    Say one thing about {{city.name}}.<|im_end|>
    <|im_start|>assistant
    {{note}}"""


def test_schema_output_round_trip(parrot):
    with parrot.session():
        city = describe_city("Which city is the capital of France?")
        value = city.get()
        assert isinstance(value, City)
        assert City.model_validate_json(city.get_text()) == value
        assert city.get() is value  # parsed once
        assert city.value == city.get_text()


def test_dict_schema_json_object_regex_and_choice(parrot):
    outputs = {
        "as_dict": Output(schema=CITY_SCHEMA, max_tokens=32, temperature=0.7, seed=3),
        "any_object": Output(json_object=True, max_tokens=24, temperature=0),
        "date": Output(regex=DATE, max_tokens=16, temperature=0.9, seed=1),
        "answer": Output(choice=["yes", "no", "maybe"], max_tokens=4, temperature=0),
    }
    with parrot.session() as session:
        made = {}
        for name, output in outputs.items():
            template = TURN.format(q=f"Give me {name.replace('_', ' ')}.") + "{{" + name + "}}"
            made[name] = session.submit(template, outputs={name: output}).outputs[name]
        as_dict = made["as_dict"].get()
        assert isinstance(as_dict, dict) and set(as_dict) == {"name", "population"}
        assert isinstance(as_dict["population"], int) and len(as_dict["name"]) <= 16
        assert isinstance(made["any_object"].get(), dict)
        assert json.loads(made["any_object"].get_text()) == made["any_object"].get()
        assert re.fullmatch(DATE, made["date"].get())
        assert made["answer"].get() in ("yes", "no", "maybe")
        assert made["date"].get() == made["date"].get_text()  # a regex value is its text


def test_a_later_call_reads_a_field_on_the_server(parrot):
    """``{{city.name}}`` is filled on the server with that field's text: the call's prompt
    has exactly the tokens of the same call with the name given literally."""
    with parrot.session() as session:
        city = describe_city("Name a big city in Japan.")
        note = tell_more(city)  # submitted before the city exists
        assert note.get_text() is not None
        name = city.get().name
        literal = session.submit(
            TURN.format(q=f"Say one thing about {name}.") + "{{note}}",
            outputs={"note": Output(max_tokens=4, temperature=0)},
        ).outputs["note"]
        assert literal.get_text() == note.get_text()  # greedy: the same prompt, the same text
        usage = {u.call_id: u for u in session.usage([note.call_id, literal.call_id]).calls}
        assert usage[note.call_id].prompt_tokens == usage[literal.call_id].prompt_tokens


def test_a_var_typed_by_the_server_is_read_as_json(parrot):
    """A handle that this client did not type (another client's, of an attached session)
    reads the format the server reports: its JSON value comes back parsed (a dict)."""
    with parrot.session() as session:
        city = describe_city("Which city is the capital of Italy?", session=session)
        attached = parrot.attach(session.session_id, session.session_auth)
        seen = Var(attached, city.var_id, "city")
        assert seen.value_type is None
        assert seen.get() == city.get().model_dump()
        assert seen.get_text() == city.get_text()


async def test_async_typed_get(parrot_url):
    async with AsyncClient(parrot_url, timeout=120) as client, client.session():
        city = await describe_city.asubmit("Which city is the capital of Spain?")
        value = await city.get()
        assert isinstance(value, City)
        assert City.model_validate_json(await city.get_text()) == value


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"schema": City, "regex": DATE}, "one format"),
        ({"choice": ["a"], "json_object": True}, "one format"),
        ({"choice": []}, "length >= 1"),
        ({"choice": "yes"}, "list of strings"),
        ({"choice": ["a", "a"]}, "distinct"),
        ({"schema": 42}, "pydantic model class"),
        ({"schema": City, "max_tokens": 0}, "max_tokens"),
        ({"format": {"regex": "a", "choice": ["b"]}}, "exactly one"),
    ],
)
def test_bad_formats_fail_before_sending(kwargs, message):
    with pytest.raises(DefinitionError, match=message):
        Output(**kwargs)


def test_a_field_of_a_text_parameter_is_refused_at_definition():
    with pytest.raises(DefinitionError, match="annotate 'city' with Input"):

        @semantic_function
        def wrong(city, note: Output):
            """About {{city.name}}: {{note}}"""

    with pytest.raises(DefinitionError, match="reads a field"):

        @semantic_function
        def output_path(q: Input, note: Output):
            """About {{q}}: {{note.x}}"""


def test_a_format_the_server_cannot_compile_is_a_400(parrot):
    with parrot.session() as session, pytest.raises(BadRequestError, match=r"regex|format"):
        session.submit(TURN.format(q="Hi") + "{{x}}", outputs={"x": Output(regex="(unclosed")})


def test_the_readme_example_runs(parrot_url, capsys):
    """sdk/README.md's typed-outputs example, as written but for the server's address."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO_ROOT / "sdk" / "README.md").read_text(), flags=re.S)
    (code,) = [block for block in blocks if "Output(schema=City" in block]
    exec(compile(code.replace("http://127.0.0.1:9000", parrot_url), "snippet", "exec"), {})
    printed = capsys.readouterr().out  # the city's name, its JSON, the note
    city = json.loads(re.search(r"\{.*?\}", printed).group())
    assert printed.startswith(city["name"] + " ")


def test_repr_and_parameter_shape():
    assert repr(Output(schema=City, max_tokens=8)) == "Output(schema=City, max_tokens=8)"
    param = Output(choice=["a", "b"]).parameter("x")
    assert param == CallParameter(name="x", is_output=True, format=OutputFormat(choice=["a", "b"]))
    # on the wire: only what is set (the server's defaults are the struct's own)
    assert msgspec.json.decode(msgspec.json.encode(param)) == {
        "name": "x",
        "is_output": True,
        "format": {"choice": ["a", "b"]},
    }
    sampled = Output(max_tokens=8, stop=["\n"]).parameter("y").sampling
    assert (sampled.max_tokens, sampled.stop, sampled.temperature) == (8, ["\n"], 0.0)
    assert Output(schema=City).format.json_schema == City.model_json_schema()
    assert Client  # the sync client is the one the other tests use
