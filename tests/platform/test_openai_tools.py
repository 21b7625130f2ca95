"""The ServeCore's OpenAI front with the real ``openai`` client: ``response_format``
(``parse()`` with a Pydantic model, ``json_object``), tool calling (a 2-turn loop, streamed
calls) and bad inputs; the checks are shared with the engine's own ``/v1``."""

from __future__ import annotations

import openai
import pytest
from conftest import ServerThread
from openai_tool_checks import (
    check_bad_inputs,
    check_completion_format,
    check_json_object_and_streamed_schema,
    check_oversized_format,
    check_parse_returns_the_model,
    check_required_tools_do_not_run_away,
    check_schemas_decoding_cannot_enforce,
    check_streamed_tool_calls,
    check_structured_outputs,
    check_tool_loop,
)

from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore
from parrot.platform.store.store import Store, sqlite_url


@pytest.fixture(scope="module")
def front(engine_server, tmp_path_factory):
    core = ServeCore(store=Store(sqlite_url(tmp_path_factory.mktemp("front-db"))))
    with ServerThread(create_app(core, engine_urls=(engine_server.url,))) as server:
        yield server


@pytest.fixture(scope="module")
def oai(front):
    with openai.OpenAI(base_url=f"{front.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_parse_returns_the_model(oai):
    check_parse_returns_the_model(oai)


def test_json_object_and_streamed_schema(oai):
    check_json_object_and_streamed_schema(oai)


def test_tool_loop(oai):
    check_tool_loop(oai)


def test_streamed_tool_calls(oai):
    check_streamed_tool_calls(oai)


def test_required_tools_do_not_run_away(oai):
    check_required_tools_do_not_run_away(oai)


def test_schemas_decoding_cannot_enforce_are_checked_whole(oai):
    check_schemas_decoding_cannot_enforce(oai)


def test_bad_inputs_get_400_naming_the_field(front):
    check_bad_inputs(front.url)


def test_completions_take_a_response_format(oai):
    check_completion_format(oai)


def test_an_oversized_format_is_a_4xx_streaming_or_not(front):
    check_oversized_format(front.url)


def test_structured_outputs_of_vllm(oai):
    check_structured_outputs(oai)
