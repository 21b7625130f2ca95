"""Response bodies of the Parrot REST API: the server encodes them, the SDK decodes them.

Light on purpose (msgspec only), so a client imports them without the ServeCore. Fields a
newer server adds are ignored when an older client decodes.
"""

from __future__ import annotations

import msgspec

from parrot.wire.formats import OutputFormat


class VarInfo(msgspec.Struct, kw_only=True, frozen=True):
    """A semantic variable as the server sees it, with its value once it has one (``None``
    only while it has none): the answer of a create, a set (``PUT``) and a get. ``format``
    when it is typed: its value matches it."""

    var_id: str
    name: str
    ready: bool
    value: str | None = None
    error: str | None = None  # why it will never get a value
    format: OutputFormat | None = None


class VarSummary(msgspec.Struct, kw_only=True, frozen=True):
    """A variable in a session listing: whether it is ready, without its value (a session
    may hold thousands of values of megabytes each); get the variable for its value."""

    var_id: str
    name: str
    ready: bool
    error: str | None = None  # why it will never get a value
    format: OutputFormat | None = None


class CallInfo(msgspec.Struct, kw_only=True, frozen=True):
    """A semantic call: ``state`` is pending, running, done or failed; ``timings`` has
    ``submitted_at``, ``started_at``, ``first_token_at`` (its first generated token),
    ``finished_at`` (unix seconds) once they happened."""

    call_id: str
    state: str
    outputs: dict[str, str]  # output placeholder -> var_id
    engine: str | None = None
    timings: dict[str, float] = msgspec.field(default_factory=dict)
    error: str | None = None


class SessionInfo(msgspec.Struct, kw_only=True, frozen=True):
    """A session's variables (without values: :class:`VarSummary`) and calls, in the order
    they were made; its ``label`` and ``tags`` as it was created with them."""

    session_id: str
    vars: list[VarSummary]
    calls: list[CallInfo]
    label: str | None = None
    tags: list[str] = msgspec.field(default_factory=list)


class SessionCreated(msgspec.Struct, kw_only=True, frozen=True):
    session_id: str
    session_auth: str


class ParamInfo(msgspec.Struct, kw_only=True, frozen=True):
    name: str  # the placeholder
    is_output: bool
    var_id: str | None = None


class CallSubmitted(msgspec.Struct, kw_only=True, frozen=True):
    call_id: str
    outputs: dict[str, str]  # output placeholder -> var_id
    param_info: list[ParamInfo] = msgspec.field(default_factory=list)

    def output_ids(self) -> dict[str, str]:
        """Output placeholder -> var_id."""
        return {p.name: p.var_id for p in self.param_info if p.is_output and p.var_id}


class CallsSubmitted(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """A batch accepted: its session (``session_auth`` only when the batch opened it) and
    each call as ``POST /v1/semantic_call`` answers it, in the batch's order."""

    session_id: str
    calls: list[CallSubmitted]
    session_auth: str | None = None


class EngineInfo(msgspec.Struct, kw_only=True, frozen=True):
    """An engine registered with the ServeCore, as operators see it everywhere (the API's
    ``GET /v1/engines``, the dashboard, ``/metrics``, ``/healthz``), never with its API key.
    The engine's own load is from its last ping (None: the engine does not say, e.g. an
    OpenAI-compatible endpoint)."""

    engine_id: str
    kind: str  # "builtin" or "openai"
    url: str
    model: str
    up: bool
    running: int  # tasks the ServeCore placed on it now
    capacity: int  # tasks at once
    contexts: int = 0  # contexts the ServeCore holds on it
    missed_pings: int = 0  # in a row (down after a few)
    jobs_running: int | None = None  # the engine's running batch
    jobs_waiting: int | None = None
    max_running: int | None = None  # its running-job limit
    kv_blocks_used: int | None = None
    kv_blocks_total: int | None = None
    tokens_per_s: float | None = None
    backend: str | None = None  # an OpenAI endpoint's server: llama.cpp, vllm, sglang, ...


class Health(msgspec.Struct, kw_only=True, frozen=True):
    status: str  # "ok"; "degraded" when no engine can take work (see ``reason``); "loading" (503)
    engines: int  # registered
    engines_up: int = 0
    reason: str | None = None
    stage: str | None = None  # while loading: what the engine is doing, and for how long
