"""One access line a request, at info, as vLLM's and uvicorn's servers log them (issue 38):
method, route, status, duration, and the tokens of a generation where the handler counted
them. With ``--log-json`` the same fields are keys of the JSON line (``method``, ``route``,
``status``, ``duration_ms``, ``bytes``, ``prompt_tokens``, ``completion_tokens``).

Litestar hooks of both apps (the ServeCore's and the builtin engine's), not a middleware
around them: a hook returns before the response is written, so it adds no step to the path
of a call (docs/architecture.md). ``before_request`` notes when a routed request started;
``before_send`` sees the status and the body go by and writes the line with the response's
last bytes, so a stream counts whole (a request no route matched has no duration). Health
checks and metrics (a ping a second from every ServeCore) and the dashboard's static
files are not logged. The route is the handler's path template
(``/v1/semantic_var/{var_id}``), so lines group by route and carry no ids.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from litestar import Request
from litestar.types import Message, Scope

log = logging.getLogger("parrot.access")

QUIET = ("/healthz", "/ping", "/metrics", "/static", "/favicon.ico")
TOKENS = "access_tokens"  # a handler's count, in the request's state: (prompt, completion)
_STARTED, _STATUS, _BYTES = "access_started", "access_status", "access_bytes"  # scope keys


def record_tokens(state: Any, prompt: int, completion: int) -> None:
    """What a generation handler counted, for the access line (``request.state``)."""
    state[TOKENS] = (prompt, completion)


def before_request(check: Callable[[Request], Awaitable[None]]) -> Callable[[Request], Awaitable[None]]:
    """An app's ``before_request``: the request's start noted, then ``check`` (the app's own)."""

    async def hook(request: Request) -> None:
        request.scope[_STARTED] = time.perf_counter()
        await check(request)

    return hook


async def before_send(message: Message, scope: Scope) -> None:
    """An app's ``before_send``: the line, once the response's last bytes go."""
    if scope["type"] != "http":
        return
    if message["type"] == "http.response.start":
        scope[_STATUS] = message["status"]
    elif message["type"] == "http.response.body":
        sent = scope.get(_BYTES, 0) + len(message.get("body", b""))
        scope[_BYTES] = sent
        if not message.get("more_body", False) and log.isEnabledFor(logging.INFO):
            _line(scope, sent)


def _line(scope: Scope, sent: int) -> None:
    route = scope.get("path_template") or scope.get("path", "")[:200]
    if route.startswith(QUIET):
        return
    started = scope.get(_STARTED)
    fields: dict[str, Any] = {
        "method": scope.get("method", ""),
        "route": route,
        "status": scope.get(_STATUS, 0),
        "duration_ms": None if started is None else round((time.perf_counter() - started) * 1000, 1),
        "bytes": sent,
    }
    tokens = (scope.get("state") or {}).get(TOKENS)
    took = "-" if fields["duration_ms"] is None else f"{fields['duration_ms']:.1f}"
    text = ""
    if tokens is not None:
        fields["prompt_tokens"], fields["completion_tokens"] = tokens
        text = f" {tokens[0]}+{tokens[1]} tokens"
    log.info("%s %s %d %s ms%s", fields["method"], route, fields["status"], took, text, extra=fields)
