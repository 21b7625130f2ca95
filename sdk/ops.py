"""Every route of the Parrot REST API as a pure function that returns an :class:`Op`.

Nothing here sends anything; the sync and async clients send the same Ops. Bodies are the
wire contract's structs (:mod:`parrot.wire.bodies`), the types the server decodes them with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from parrot.sdk.errors import BadRequestError
from parrot.sdk.http import Op, nothing, struct, text
from parrot.sdk.results import (
    CallInfo,
    CallSubmitted,
    EngineInfo,
    Health,
    RenderedChat,
    SessionCreated,
    SessionInfo,
    SessionUsage,
    VarInfo,
    parse_metrics,
)
from parrot.wire.adapter_bodies import RenderChat
from parrot.wire.bodies import (
    CallParameter,
    CreateVar,
    NewSession,
    RegisterEngine,
    SetVar,
    SubmitCall,
    SubmitTransform,
    TransformInput,
)
from parrot.wire.chat import ChatTurn
from parrot.wire.transforms import Steps


@dataclass(frozen=True)
class SessionKey:
    """What identifies a session and proves the right to use it."""

    session_id: str
    session_auth: str


def create_session(label: str | None = None, tags: Sequence[str] = ()) -> Op[SessionCreated]:
    """A new session; ``label`` and ``tags`` (up to 16, each 1 to 64 characters; a label 1
    to 200) are what the dashboard finds it by. Without them no body is sent."""
    body = NewSession(label=label, tags=list(tags)) if label is not None or tags else None
    return Op("POST", "/v1/session", struct(SessionCreated), body=body)


def session_info(key: SessionKey) -> Op[SessionInfo]:
    return Op("GET", f"/v1/session/{key.session_id}", struct(SessionInfo), token=key.session_auth)


def delete_session(key: SessionKey) -> Op[None]:
    return Op("DELETE", f"/v1/session/{key.session_id}", nothing, token=key.session_auth)


def create_var(key: SessionKey, name: str, value: str | None = None) -> Op[VarInfo]:
    body = CreateVar(session_id=key.session_id, name=name, value=value)
    return Op("POST", "/v1/semantic_var", struct(VarInfo), body=body, token=key.session_auth)


def set_var(key: SessionKey, var_id: str, value: str) -> Op[VarInfo]:
    body = SetVar(session_id=key.session_id, value=value)
    return Op("PUT", f"/v1/semantic_var/{var_id}", struct(VarInfo), body=body, token=key.session_auth)


def get_var(key: SessionKey, var_id: str, criteria: str, timeout: float) -> Op[VarInfo]:
    """Wait up to ``timeout`` seconds for the value; ``latency`` also makes its producers
    (back through the DAG) latency-critical on the server."""
    params = {"session_id": key.session_id, "criteria": criteria, "timeout": timeout}
    return Op(
        "GET",
        f"/v1/semantic_var/{var_id}",
        struct(VarInfo),
        params=params,
        token=key.session_auth,
        wait_s=timeout,
    )


def submit_call(
    key: SessionKey,
    template: str,
    parameters: Sequence[CallParameter],
    models: Sequence[str] = (),
    output_criteria: str | None = None,
) -> Op[CallSubmitted]:
    """``parameters``: inputs by ``var_id`` or ``value``, outputs with their ``sampling``
    and ``format`` (see :func:`parrot.sdk.handles.call_parameters`)."""
    body = SubmitCall(
        session_id=key.session_id,
        template=template,
        parameters=list(parameters),
        models=list(models),
        output_criteria=output_criteria,
    )
    return Op("POST", "/v1/semantic_call", struct(CallSubmitted), body=body, token=key.session_auth)


def submit_transform(
    key: SessionKey, inputs: Sequence[TransformInput], steps: Sequence[Mapping[str, Any]], output: str
) -> Op[CallSubmitted]:
    """``steps`` as dicts (``{"type": "regex", "pattern": ...}``), checked here against the
    step types the server takes (:mod:`parrot.wire.transforms`)."""
    try:
        typed = msgspec.convert(list(steps), Steps)
    except msgspec.ValidationError as error:
        raise BadRequestError(f"transform steps: {error}") from None
    body = SubmitTransform(session_id=key.session_id, inputs=list(inputs), steps=typed, output=output)
    return Op("POST", "/v1/semantic_transform", struct(CallSubmitted), body=body, token=key.session_auth)


def call_info(key: SessionKey, call_id: str) -> Op[CallInfo]:
    params = {"session_id": key.session_id}
    return Op("GET", f"/v1/semantic_call/{call_id}", struct(CallInfo), params=params, token=key.session_auth)


def session_usage(key: SessionKey, call_ids: Sequence[str] = ()) -> Op[SessionUsage]:
    """Token usage of the session's calls (of ``call_ids`` only, when given)."""
    params = {"call_id": list(call_ids)} if call_ids else None
    path = f"/v1/session/{key.session_id}/usage"
    return Op("GET", path, struct(SessionUsage), params=params, token=key.session_auth)


def render_chat(messages: Sequence[Mapping[str, str]], model: str | None = None) -> Op[RenderedChat]:
    """``messages`` (``role``, ``content``) in the model's own chat template."""
    turns = [ChatTurn(role=m["role"], content=m["content"]) for m in messages]
    body = RenderChat(messages=turns, model=model)
    return Op("POST", "/v1/render_chat", struct(RenderedChat), body=body)


def list_engines() -> Op[list[EngineInfo]]:
    return Op("GET", "/v1/engines", struct(list[EngineInfo]))


def register_engine(admin_token: str | None, spec: RegisterEngine) -> Op[EngineInfo]:
    return Op("POST", "/v1/engines", struct(EngineInfo), body=spec, token=admin_token)


def remove_engine(admin_token: str | None, engine_id: str) -> Op[None]:
    return Op("DELETE", f"/v1/engines/{engine_id}", nothing, token=admin_token)


def healthz() -> Op[Health]:
    return Op("GET", "/healthz", struct(Health))


def metrics() -> Op[dict[str, float]]:
    return Op("GET", "/metrics", text).then(parse_metrics)
