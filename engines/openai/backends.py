"""What server an OpenAI endpoint is, found from its own answers, and what that lets the
engine do with it.

- **llama.cpp** (``llama-server``: its ``/v1/models`` entries are ``owned_by: "llamacpp"``):
  ``GET /props`` says how many parallel slots it runs (``total_slots``). Each slot keeps
  the KV of the last prompt it ran, and a request may name its slot (``id_slot``), so the
  engine plans the slots itself (:mod:`parrot.engines.openai.slots`).
- **vLLM** (``owned_by: "vllm"``): takes a request ``priority`` (lower runs first) when it
  runs with ``--scheduling-policy priority``; otherwise it answers 400, and the engine stops
  sending it (:class:`Backend` ``priority`` turned off, with one warning).
- anything else (SGLang, OpenAI, other servers): plain OpenAI requests.

The kind is found at the first ping that answers (the ``/v1/models`` page the ping reads
anyway) and again after the endpoint was down (it may have been restarted with other flags).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Final

import httpx2

log = logging.getLogger(__name__)

LLAMA_CPP, VLLM, OTHER = "llama.cpp", "vllm", "openai-compatible"
OWNERS: Final = {"llamacpp": LLAMA_CPP, "vllm": VLLM}
PROPS_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True)
class Backend:
    kind: str = OTHER
    slots: int | None = None  # llama.cpp: parallel slots (its /props)
    priority: bool = False  # send each request's priority (vLLM, until it refuses one)

    def describe(self) -> dict:
        return {"backend": self.kind, "backend_slots": self.slots}

    def without_priority(self) -> Backend:
        return replace(self, priority=False)


def server_root(base_url: str) -> str:
    """The server's root, where llama.cpp answers ``/props`` (``base_url`` without ``/v1``)."""
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url


def kind_of(models: list[Any], model: str) -> str:
    """The server kind from its ``/v1/models`` entries (the configured model's, else any)."""
    owners = [getattr(m, "owned_by", None) for m in models if getattr(m, "id", None) == model]
    owners = owners or [getattr(m, "owned_by", None) for m in models]
    return next((OWNERS[o] for o in owners if o in OWNERS), OTHER)


async def detect(http: httpx2.AsyncClient, base_url: str, models: list[Any], model: str, key: str) -> Backend:
    """The backend behind ``base_url``, from its models page and, for llama.cpp, ``/props``
    (asked with the API key ``key``: a server started with ``--api-key`` wants it there too)."""
    kind = kind_of(models, model)
    if kind == VLLM:
        return Backend(VLLM, priority=True)
    if kind != LLAMA_CPP:
        return Backend(kind)
    slots = None
    try:
        headers = {"Authorization": f"Bearer {key}"}
        answer = await http.get(f"{server_root(base_url)}/props", headers=headers, timeout=PROPS_TIMEOUT_S)
        if answer.status_code == 200:
            value = answer.json().get("total_slots")
            slots = value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    except (httpx2.HTTPError, ValueError, AttributeError) as error:
        log.warning("llama.cpp server at %s: could not read /props (%s)", server_root(base_url), error)
    return Backend(LLAMA_CPP, slots)


def request_fields(backend: Backend, slot: int | None, priority: int) -> dict[str, Any]:
    """Fields of the request body that only this backend takes."""
    fields: dict[str, Any] = {}
    if slot is not None:  # llama.cpp: the slot the planner chose, its cached prompt reused
        fields.update(id_slot=slot, cache_prompt=True)
    if backend.priority and priority:
        fields["priority"] = -priority  # vLLM runs lower values first; Parrot's latency work is 1
    return fields


def refuses_priority(message: str) -> bool:
    """A 400's message that says priority scheduling is off (vLLM's)."""
    return "priority" in message.lower()
