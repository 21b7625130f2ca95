"""Typed request and response bodies of the Parrot REST API."""

from __future__ import annotations

from typing import Annotated

import msgspec

from parrot.platform.serve.core import CallParameter

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Text = Annotated[str, msgspec.Meta(max_length=4_000_000)]


class SessionCreated(msgspec.Struct, kw_only=True):
    session_id: str
    session_auth: str


class VarInfo(msgspec.Struct, kw_only=True):
    var_id: str
    name: str
    ready: bool
    value: str | None = None
    error: str | None = None


class CallInfo(msgspec.Struct, kw_only=True):
    call_id: str
    state: str
    outputs: dict[str, str]
    engine: str | None = None


class SessionInfo(msgspec.Struct, kw_only=True):
    session_id: str
    vars: list[VarInfo]
    calls: list[CallInfo]


class CreateVar(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    session_id: str
    name: Name
    value: Text | None = None


class SetVar(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    session_id: str
    value: Text


class SubmitCall(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    session_id: str
    template: Text
    parameters: Annotated[list[CallParameter], msgspec.Meta(max_length=1024)]
    models: list[str] = msgspec.field(default_factory=list)
    output_criteria: str | None = None


class CallSubmitted(msgspec.Struct, kw_only=True):
    call_id: str
    outputs: dict[str, str]
    param_info: list[dict]


class RegisterEngine(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    url: Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]
    capacity: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 16


class EngineInfo(msgspec.Struct, kw_only=True):
    engine_id: str
    url: str
    model: str
    up: bool
    running: int
    capacity: int
    queued_tasks: int = 0
