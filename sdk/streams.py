"""Streamed responses of the ServeCore, read with :class:`StreamOp` (one SSE reader, in
:mod:`parrot.sdk.http`):

- a semantic variable's text as it is generated (``GET /v1/semantic_var/{id}/stream``):
  :func:`stream_var` decodes its ``delta`` / ``value`` / ``error`` events
  (:mod:`parrot.wire.var_stream`); an ``error`` event raises the :class:`ParrotError` that
  the same failure raises as an HTTP error (``producer_failed`` 424, ``session_closed``
  404, ...). ``Var.stream()`` / ``AsyncVar.astream()`` hand out its text pieces;
- streamed completions from the OpenAI-compatible routes (``POST /v1/completions`` and
  ``/v1/chat/completions`` with ``stream``): one-call requests, outside any session.

Sampling settings are validated as :class:`SamplingParams` and all of them are sent, so a
stream samples exactly as a semantic call with the same settings would (the OpenAI routes'
own defaults, such as 16 tokens for a completion, never apply).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from httpx_sse import ServerSentEvent

from parrot.sdk.errors import BadRequestError, error_for
from parrot.sdk.http import StreamOp
from parrot.sdk.ops import SessionKey
from parrot.wire.openai_schemas import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    CompletionResponse,
    StreamOptions,
    Usage,
)
from parrot.wire.sampling import SamplingParams
from parrot.wire.var_stream import DELTA, ERROR, VALUE, VarDelta, VarStreamError, VarValue

# What the OpenAI routes take of SamplingParams (they have no stop_token_ids).
OPENAI_FIELDS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
)

# What every streamed request of the OpenAI routes says: stream, and end with the usage.
_STREAM: dict[str, Any] = {"stream": True, "stream_options": StreamOptions(include_usage=True)}


class CompletionDelta(msgspec.Struct, kw_only=True, frozen=True):
    """A piece of a streamed generation: new ``text``; ``finish_reason`` ("stop" or
    "length") on the generation's last event; ``usage`` on the very last one."""

    model: str
    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None


def openai_sampling(sampling: Mapping[str, Any]) -> dict[str, Any]:
    """Every sampling field the OpenAI routes take, with Parrot's defaults filled in."""
    try:
        params = msgspec.convert(dict(sampling), SamplingParams)
    except msgspec.ValidationError as error:
        raise BadRequestError(f"sampling settings: {error}") from None
    if params.stop_token_ids:
        raise BadRequestError("stop_token_ids cannot be streamed; use stop strings")
    fields = msgspec.to_builtins(params)
    return {name: fields[name] for name in OPENAI_FIELDS if fields.get(name) is not None}


def _completion_delta(event: ServerSentEvent) -> CompletionDelta | None:
    chunk = msgspec.json.decode(event.data, type=CompletionResponse)
    if not chunk.choices:
        return CompletionDelta(model=chunk.model, usage=chunk.usage) if chunk.usage else None
    choice = chunk.choices[0]
    return CompletionDelta(model=chunk.model, text=choice.text, finish_reason=choice.finish_reason)


def _chat_delta(event: ServerSentEvent) -> CompletionDelta | None:
    chunk = msgspec.json.decode(event.data, type=ChatCompletionChunk)
    if not chunk.choices:
        return CompletionDelta(model=chunk.model, usage=chunk.usage) if chunk.usage else None
    choice = chunk.choices[0]
    if not choice.delta.content and choice.finish_reason is None:
        return None  # the opening event that only names the role
    return CompletionDelta(
        model=chunk.model, text=choice.delta.content or "", finish_reason=choice.finish_reason
    )


def stream_completion(
    prompt: str,
    model: str | None,
    sampling: Mapping[str, Any],
    api_key: str | None,
    metadata: Mapping[str, str] | None = None,
) -> StreamOp[CompletionDelta]:
    """``POST /v1/completions`` with ``stream``: ``prompt`` is sent as it is; ``metadata``
    as for :func:`stream_chat`."""
    named = {"metadata": dict(metadata)} if metadata else {}
    body = CompletionRequest(prompt=prompt, model=model, **_STREAM, **named, **openai_sampling(sampling))
    return StreamOp("/v1/completions", _completion_delta, body=body, token=api_key)


def stream_chat(
    messages: Sequence[Mapping[str, str]],
    model: str | None,
    sampling: Mapping[str, Any],
    api_key: str | None,
    metadata: Mapping[str, str] | None = None,
) -> StreamOp[CompletionDelta]:
    """``POST /v1/chat/completions`` with ``stream``: the server renders ``messages``
    (``role``, ``content``) with the model's own chat template; ``metadata`` (OpenAI's:
    ``label`` and other keys) names the request on the dashboard's requests page."""
    turns = [ChatMessage(role=m["role"], content=m["content"]) for m in messages]
    named = {"metadata": dict(metadata)} if metadata else {}
    body = ChatCompletionRequest(messages=turns, model=model, **_STREAM, **named, **openai_sampling(sampling))
    return StreamOp("/v1/chat/completions", _chat_delta, body=body, token=api_key)


def var_event(event: ServerSentEvent) -> VarDelta | VarValue | None:
    if event.event == DELTA:
        return msgspec.json.decode(event.data, type=VarDelta)
    if event.event == VALUE:
        return msgspec.json.decode(event.data, type=VarValue)
    if event.event == ERROR:
        error = msgspec.json.decode(event.data, type=VarStreamError).error
        raise error_for(error.status, error.code, error.message)
    return None  # an event a newer server may add: nothing for this client


def stream_var(key: SessionKey, var_id: str, criteria: str, wait_s: float) -> StreamOp[VarDelta | VarValue]:
    """``GET /v1/semantic_var/{id}/stream``: the variable's deltas, then its value (the
    last event). ``criteria`` as for a get (``latency`` makes its producers, back through
    the DAG, latency-critical); ``wait_s``: how long the server may be quiet (the producer
    may wait for its own inputs before it writes anything)."""
    params = {"session_id": key.session_id, "criteria": criteria}
    path = f"/v1/semantic_var/{var_id}/stream"
    return StreamOp(path, var_event, token=key.session_auth, method="GET", params=params, wait_s=wait_s)
