"""The OpenAI chat stream and answer of a request with tools (engines/protocol/openai_stream):
a generic tool answer, fed as the engine's text deltas, becomes content deltas (a response)
or ``tool_calls`` deltas with ``finish_reason: "tool_calls"``; per choice, for ``n`` choices."""

from __future__ import annotations

import json

from parrot.engines.protocol.openai_stream import Answer, Delta, Finish, chat_response, chat_stream, usage
from parrot.wire.tool_syntax import GENERIC

CALLS = (
    '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"get_time","arguments":{}}]}'
)
SAID = 'Sunny, "18" degrees. ' * 8
RESPONSE = json.dumps({"response": SAID})


async def events(texts: list[str], reason: str = "stop"):
    """Both answers, cut in 3-character pieces, interleaved; then each one's finish."""
    pieces = [[t[i : i + 3] for i in range(0, len(t), 3)] for t in texts]
    for step in range(max(len(p) for p in pieces)):
        for index, own in enumerate(pieces):
            if step < len(own):
                yield Delta(index, own[step])
    for index in range(len(texts)):
        yield Finish(index, reason, 10)


async def chunks(texts: list[str], tools: bool = True, reason: str = "stop") -> list[dict]:
    stream = chat_stream(events(texts, reason), len(texts), "id", 0, "m", None, GENERIC if tools else None)
    out = [message.data async for message in stream]
    assert out[-1] == "[DONE]"
    return [json.loads(data) for data in out[:-1]]


def choice_parts(all_chunks: list[dict], index: int) -> tuple[str, list[dict], str | None]:
    deltas = [c["choices"][0] for c in all_chunks if c["choices"][0]["index"] == index]
    content = "".join(d["delta"].get("content") or "" for d in deltas)
    calls = [call for d in deltas for call in d["delta"].get("tool_calls", [])]
    return content, calls, deltas[-1]["finish_reason"]


async def test_a_stream_with_tools_gives_calls_or_content_per_choice():
    got = await chunks([CALLS, RESPONSE])
    content, calls, reason = choice_parts(got, 0)
    assert content == "" and reason == "tool_calls"
    assert [(c["index"], c["type"], c["function"]["name"]) for c in calls] == [
        (0, "function", "get_weather"),
        (1, "function", "get_time"),
    ]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"} and calls[0]["id"].startswith(
        "call_"
    )
    at = [i for i, c in enumerate(got) if c["choices"][0]["delta"].get("tool_calls")]
    said = [
        i
        for i, c in enumerate(got)
        if c["choices"][0]["index"] == 1 and c["choices"][0]["delta"].get("content")
    ]
    assert any(at[0] < i < at[1] for i in said)  # each call went out once complete, not at the end
    content, calls, reason = choice_parts(got, 1)
    assert content == SAID and calls == [] and reason == "stop"
    pieces = [c["choices"][0]["delta"].get("content") for c in got if c["choices"][0]["index"] == 1]
    assert len([p for p in pieces if p]) > 3  # the response streamed as it came


FIRST_WHOLE = CALLS.index(',{"name":"get_time"') + 5  # the first call whole, the second not
LOOP = '{"tool_calls":[' + ",".join(['{"name":"get_weather","arguments":{"city":"Oslo"}}'] * 5)  # cut


async def test_without_tools_the_text_is_content_and_a_cut_list_gives_its_whole_calls():
    content, calls, reason = choice_parts(await chunks([CALLS], tools=False), 0)
    assert content == CALLS and calls == [] and reason == "stop"
    content, calls, reason = choice_parts(await chunks([CALLS[:40]], reason="length"), 0)
    assert content == "" and calls == [] and reason == "length"  # never the format's text
    content, calls, reason = choice_parts(await chunks([CALLS[:FIRST_WHOLE]], reason="length"), 0)
    assert content == "" and [c["function"]["name"] for c in calls] == ["get_weather"] and reason == "length"
    content, calls, reason = choice_parts(await chunks(['{"'], reason="length"), 0)
    assert content == "" and calls == [] and reason == "length"


async def test_a_repeated_call_ends_the_list():
    content, calls, reason = choice_parts(await chunks([LOOP], reason="length"), 0)
    assert content == "" and len(calls) == 1 and reason == "tool_calls"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}


def test_a_plain_answer_with_tools():
    answers = [
        Answer(CALLS, "stop", 9),
        Answer(RESPONSE, "stop", 5),
        Answer(CALLS[:30], "length", 4),
        Answer(CALLS[:FIRST_WHOLE], "length", 6),
        Answer(LOOP, "length", 40),
        Answer("Plain words, no format", "stop", 4),
    ]
    response = chat_response("id", 0, "m", answers, usage(3, 18, 0), tools=GENERIC)
    calls, said, cut, cut_later, loop, plain = response.choices
    assert calls.finish_reason == "tool_calls" and calls.message.content is None
    assert [c.function.name for c in calls.message.tool_calls] == ["get_weather", "get_time"]
    assert said.message.content == SAID and said.finish_reason == "stop"
    assert cut.message.content is None and not cut.message.tool_calls and cut.finish_reason == "length"
    assert [c.function.name for c in cut_later.message.tool_calls] == ["get_weather"]
    assert cut_later.message.content is None and cut_later.finish_reason == "length"
    assert len(loop.message.tool_calls) == 1 and loop.finish_reason == "tool_calls"
    assert plain.message.content == "Plain words, no format"  # a model not held to the format
