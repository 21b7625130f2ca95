"""What server an OpenAI endpoint is, found from its own answers, and what that lets the
engine do with it.

- **llama.cpp** (``llama-server``: its ``/v1/models`` entries are ``owned_by: "llamacpp"``):
  ``GET /props`` says how many parallel slots it runs (``total_slots``). Each slot keeps
  the KV of the last prompt it ran, and a request may name its slot (``id_slot``), so the
  engine plans the slots itself (:mod:`parrot.engines.openai.slots`).
- **vLLM** (``owned_by: "vllm"``): takes a request ``priority`` (lower runs first) when it
  runs with ``--scheduling-policy priority``; otherwise it answers 400, and the engine stops
  sending it (:class:`Backend` ``priority`` turned off, with one warning).
- **SGLang** (``owned_by: "sglang"``): its ``GET /server_info`` (``/get_server_info`` before
  0.5) gives its server arguments. With ``--enable-priority-scheduling`` it takes a request
  ``priority``, higher values first unless ``--schedule-low-priority-values-first``; without
  it the field is not sent (SGLang ignores it, or aborts the request with
  ``--abort-on-priority-when-disabled``). ``max_running_requests`` is what it runs at once.
- anything else (OpenAI, other servers): plain OpenAI requests.

The kind is found at the first ping that answers (the ``/v1/models`` page the ping reads
anyway) and again after the endpoint was down (it may have been restarted with other flags).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Final

import httpx2

log = logging.getLogger(__name__)

LLAMA_CPP, VLLM, SGLANG, OTHER = "llama.cpp", "vllm", "sglang", "openai-compatible"
OWNERS: Final = {"llamacpp": LLAMA_CPP, "vllm": VLLM, "sglang": SGLANG}
INFO_TIMEOUT_S: Final = 5.0
SGLANG_INFO: Final = ("/server_info", "/get_server_info")  # the newer page first
LOW_FIRST, HIGH_FIRST = -1, 1  # how a backend orders priorities: the sign Parrot's gets


@dataclass(frozen=True)
class Backend:
    kind: str = OTHER
    slots: int | None = None  # llama.cpp: parallel slots (its /props)
    running: int | None = None  # requests it runs at once (llama.cpp: its slots; SGLang's max)
    priority: int = 0  # send priorities with this sign (LOW_FIRST, HIGH_FIRST); 0: none

    def describe(self) -> dict:
        return {"backend": self.kind, "backend_slots": self.slots, "backend_priority": self.priority}

    def without_priority(self) -> Backend:
        return replace(self, priority=0)


def server_root(base_url: str) -> str:
    """The server's root, where llama.cpp answers ``/props`` (``base_url`` without ``/v1``)."""
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url


def kind_of(models: list[Any], model: str) -> str:
    """The server kind from its ``/v1/models`` entries (the configured model's, else any)."""
    owners = [getattr(m, "owned_by", None) for m in models if getattr(m, "id", None) == model]
    owners = owners or [getattr(m, "owned_by", None) for m in models]
    return next((OWNERS[o] for o in owners if o in OWNERS), OTHER)


async def detect(http: httpx2.AsyncClient, base_url: str, models: list[Any], model: str, key: str) -> Backend:
    """The backend behind ``base_url``, from its models page and, for llama.cpp and SGLang,
    the page that gives their settings (asked with the API key ``key``: a server started
    with an API key wants it there too)."""
    kind = kind_of(models, model)
    if kind == VLLM:
        return Backend(VLLM, priority=LOW_FIRST)
    if kind == LLAMA_CPP:
        props = await _page(http, base_url, ("/props",), key)
        slots = _count(props.get("total_slots"))
        return Backend(LLAMA_CPP, slots=slots, running=slots)
    if kind == SGLANG:
        info = await _page(http, base_url, SGLANG_INFO, key)
        args = info.get("server_args") if isinstance(info.get("server_args"), dict) else info
        order = LOW_FIRST if args.get("schedule_low_priority_values_first") is True else HIGH_FIRST
        priority = order if args.get("enable_priority_scheduling") is True else 0
        return Backend(SGLANG, running=_count(args.get("max_running_requests")), priority=priority)
    return Backend(kind)


async def _page(http: httpx2.AsyncClient, base_url: str, paths: tuple[str, ...], key: str) -> dict:
    """The first of ``paths`` the server answers, as a JSON object ({} if none does)."""
    root = server_root(base_url)
    for path in paths:
        try:
            headers = {"Authorization": f"Bearer {key}"}
            answer = await http.get(f"{root}{path}", headers=headers, timeout=INFO_TIMEOUT_S)
            if answer.status_code == 200:
                body = answer.json()
                return body if isinstance(body, dict) else {}
        except (httpx2.HTTPError, ValueError) as error:
            log.warning("server at %s: could not read %s (%s)", root, path, error)
    return {}


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def request_fields(backend: Backend, slot: int | None, priority: int) -> dict[str, Any]:
    """Fields of the request body that only this backend takes."""
    fields: dict[str, Any] = {}
    if slot is not None:  # llama.cpp: the slot the planner chose, its cached prompt reused
        fields.update(id_slot=slot, cache_prompt=True)
    if backend.priority and priority:  # Parrot's latency work is 1, throughput work 0
        fields["priority"] = backend.priority * priority
    return fields


def refuses_priority(message: str) -> bool:
    """A 400's message that says priority scheduling is off (vLLM's; SGLang's abort)."""
    return "priority" in message.lower()
