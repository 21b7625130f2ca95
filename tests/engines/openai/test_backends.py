"""What the OpenAI engine finds out about its endpoint, and what it sends each kind of server
(issue 39): a llama.cpp server's slots (its ``/props``) become the engine's capacity and each
request names its slot; vLLM gets request priorities until it refuses them, SGLang in its
own order when its settings say its scheduler takes them. Against the
scripted endpoint, a real HTTP server of the tests' own (the real llama-server:
test_llama_fleet.py)."""

from __future__ import annotations

import logging

import pytest
from conftest import ServerThread
from scripted_endpoint import Reply, ScriptedEndpoint, config_for, error

from parrot.engines.openai.backends import LLAMA_CPP, OTHER, SGLANG, VLLM, kind_of, server_root
from parrot.engines.openai.engine import OpenAIEngine
from parrot.wire.sampling import SamplingParams

pytestmark = pytest.mark.asyncio(loop_scope="function")
SAMPLING = SamplingParams(max_tokens=3)


async def _generate(engine: OpenAIEngine, context_id: int, text: str, priority: int = 0) -> None:
    async for _ in engine.generate_stream(context_id, SAMPLING, text=text, priority=priority):
        pass


async def test_a_llama_cpp_server_gives_its_slots_as_capacity_and_each_request_names_its_slot():
    endpoint = ScriptedEndpoint(Reply())
    endpoint.owned_by, endpoint.pages["/props"] = "llamacpp", {"total_slots": 3}
    with ServerThread(endpoint) as server:
        engine = OpenAIEngine(config_for(server))
        stats = await engine.ping()
        assert (stats["backend"], stats["backend_slots"], stats["max_running"]) == (LLAMA_CPP, 3, 3)
        await _generate(engine, 1, "A prompt of its own. " * 40)
        await _generate(engine, 2, "A prompt of its own. " * 40 + "And more.")
        await _generate(engine, 3, "Another prompt altogether. " * 40)
        await engine.aclose()
    slots = [body["id_slot"] for _, _, body, _ in endpoint.requests]
    assert all(body["cache_prompt"] is True for _, _, body, _ in endpoint.requests)
    # The second prompt starts with the first (and its answer): the same slot; the third
    # shares nothing with it and goes to a free slot.
    assert slots[0] == slots[1] != slots[2], slots
    assert engine.kept_prefix("A prompt of its own. " * 40 + "else") == len("A prompt of its own. " * 40)


async def test_a_configured_capacity_wins_and_slot_planning_can_be_turned_off():
    endpoint = ScriptedEndpoint(Reply())
    endpoint.owned_by, endpoint.pages["/props"] = "llamacpp", {"total_slots": 3}
    with ServerThread(endpoint) as server:
        engine = OpenAIEngine(config_for(server, capacity=5, plan_slots=False))
        assert (await engine.ping())["max_running"] == 5
        await _generate(engine, 1, "Hello.")
        await engine.aclose()
    assert "id_slot" not in endpoint.requests[0][2]


async def test_other_servers_get_plain_requests_and_the_default_capacity():
    endpoint = ScriptedEndpoint(Reply())
    with ServerThread(endpoint) as server:
        engine = OpenAIEngine(config_for(server, default_capacity=7))
        stats = await engine.ping()
        await _generate(engine, 1, "Hello.", priority=1)
        await engine.aclose()
    assert (stats["backend"], stats["max_running"]) == (OTHER, 7)
    assert not {"id_slot", "cache_prompt", "priority"} & endpoint.requests[0][2].keys()


async def test_vllm_gets_priorities_until_it_refuses_them(caplog):
    refused = Reply(400, error("Priority scheduling is not enabled.", "invalid_request"))
    endpoint = ScriptedEndpoint(Reply(), refused, Reply())
    endpoint.owned_by = "vllm"
    caplog.set_level(logging.WARNING)
    with ServerThread(endpoint) as server:
        engine = OpenAIEngine(config_for(server))
        assert (await engine.ping())["backend"] == VLLM
        await _generate(engine, 1, "Latency work.", priority=1)  # sent with priority -1
        await _generate(engine, 2, "More latency work.", priority=1)  # refused, sent again without
        await _generate(engine, 3, "Even more.", priority=1)  # never sent again
        await _generate(engine, 4, "Throughput work.")
        await engine.aclose()
    priorities = [body.get("priority") for _, _, body, _ in endpoint.requests]
    assert priorities == [-1, -1, None, None, None], priorities
    assert sum("refuses request priorities" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize(
    ("page", "info", "sent", "capacity"),
    [
        # SGLang runs higher priority values first by default; its info page is flat ...
        ("/server_info", {"enable_priority_scheduling": True, "max_running_requests": 48}, 1, 48),
        # ... or, on older servers, /get_server_info, the arguments maybe under server_args
        (
            "/get_server_info",
            {"server_args": {"enable_priority_scheduling": True, "schedule_low_priority_values_first": True}},
            -1,
            7,
        ),
        # without priority scheduling it gets none (it would ignore it, or abort the request)
        ("/server_info", {"enable_priority_scheduling": False, "max_running_requests": None}, None, 7),
        (None, {}, None, 7),  # no info page at all: plain requests
    ],
)
async def test_sglang_gets_priorities_in_its_own_order_when_its_scheduler_takes_them(
    page, info, sent, capacity
):
    endpoint = ScriptedEndpoint(Reply())
    endpoint.owned_by = "sglang"
    if page is not None:
        endpoint.pages[page] = info
    with ServerThread(endpoint) as server:
        engine = OpenAIEngine(config_for(server, default_capacity=7))
        stats = await engine.ping()
        await _generate(engine, 1, "Latency work.", priority=1)
        await _generate(engine, 2, "Throughput work.")
        await engine.aclose()
    found = (stats["backend"], stats["max_running"], stats["backend_priority"])
    assert found == (SGLANG, capacity, sent or 0)
    assert [body.get("priority") for _, _, body, _ in endpoint.requests] == [sent, None]
    assert not {"id_slot", "cache_prompt"} & endpoint.requests[0][2].keys()


async def test_the_server_kind_comes_from_its_models_page():
    class Model:
        def __init__(self, id: str, owned_by: str) -> None:
            self.id, self.owned_by = id, owned_by

    assert kind_of([Model("a", "vllm")], "a") == VLLM and kind_of([Model("a", "sglang")], "a") == SGLANG
    assert kind_of([Model("x", "llamacpp")], "not listed") == LLAMA_CPP
    assert kind_of([Model("a", "openai")], "a") == OTHER and kind_of([], "a") == OTHER
    assert (
        server_root("http://h:8080/v1") == "http://h:8080" and server_root("http://h/api") == "http://h/api"
    )
