"""The OpenAI chat stream and answer of a request with tools (engines/protocol/openai_stream):
a generic tool answer, fed as the engine's text deltas, becomes content deltas (a response)
or ``tool_calls`` deltas with ``finish_reason: "tool_calls"``; per choice, for ``n`` choices."""

from __future__ import annotations

import json

from parrot.engines.protocol.openai_stream import Answer, Delta, Finish, chat_response, chat_stream, usage

CALLS = (
    '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"get_time","arguments":{}}]}'
)
RESPONSE = '{"response":"Sunny, \\"18\\" degrees"}'


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
    stream = chat_stream(events(texts, reason), len(texts), "id", 0, "m", None, tools)
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
    content, calls, reason = choice_parts(got, 1)
    assert content == 'Sunny, "18" degrees' and calls == [] and reason == "stop"
    pieces = [c["choices"][0]["delta"].get("content") for c in got if c["choices"][0]["index"] == 1]
    assert len([p for p in pieces if p]) > 3  # the response streamed as it came


async def test_without_tools_or_cut_off_the_text_is_content():
    content, calls, reason = choice_parts(await chunks([CALLS], tools=False), 0)
    assert content == CALLS and calls == [] and reason == "stop"
    content, calls, reason = choice_parts(await chunks([CALLS[:40]], reason="length"), 0)
    assert content == CALLS[:40] and calls == [] and reason == "length"


def test_a_plain_answer_with_tools():
    answers = [Answer(CALLS, "stop", 9), Answer(RESPONSE, "stop", 5), Answer(CALLS[:30], "length", 4)]
    response = chat_response("id", 0, "m", answers, usage(3, 18, 0), tools=True)
    calls, said, cut = response.choices
    assert calls.finish_reason == "tool_calls" and calls.message.content is None
    assert [c.function.name for c in calls.message.tool_calls] == ["get_weather", "get_time"]
    assert said.message.content == 'Sunny, "18" degrees' and said.finish_reason == "stop"
    assert cut.message.content == CALLS[:30] and cut.finish_reason == "length"
