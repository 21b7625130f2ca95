"""A helper of the examples: their result as a reader wants it printed, with every call's
server timings (unix seconds, as ``GET /v1/session/{id}`` reports them) turned into
durations: when the call was submitted, started, wrote its first token and finished,
counted from the first submission in the result (in a run's own ``calls``, from that
run's first), how long it waited to start and how long it took.

``main(server_url)`` still returns the server's own timings (the tests compare them);
only what the script prints is changed, by ``app_main(with_durations(main))``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

STAMPS = {  # a timing the server reports -> its name as a time since the first submission
    "submitted_at": "submitted",
    "started_at": "started",
    "first_token_at": "first token",
    "finished_at": "finished",
}


def seconds(value: float) -> str:
    return f"{value:.2f} s"


def _stamps(result: Any) -> list[float]:
    """Every timing in ``result``, at any depth."""
    if isinstance(result, dict):
        found = [v for k, v in result.get("timings", {}).items() if k in STAMPS and v]
        return found + [t for v in result.values() for t in _stamps(v)]
    if isinstance(result, list | tuple):
        return [t for v in result for t in _stamps(v)]
    return []


def _durations(timings: dict[str, float], origin: float) -> dict[str, str]:
    shown = {STAMPS[k]: f"+{seconds(v - origin)}" for k, v in timings.items() if k in STAMPS and v}
    if timings.get("finished_at") and timings.get("submitted_at"):
        shown["took"] = seconds(timings["finished_at"] - timings["submitted_at"])
    if timings.get("started_at") and timings.get("submitted_at"):
        shown["waited"] = seconds(timings["started_at"] - timings["submitted_at"])
    return shown


def readable(result: Any, origin: float | None = None) -> Any:
    """``result`` with every ``timings`` dict as durations (see the module docstring); the
    ``calls`` of one run (a LangChain example's) count from that run's first submission."""
    if origin is None or (isinstance(result, dict) and "calls" in result):
        origin = min(_stamps(result), default=0.0)
    if isinstance(result, dict):
        return {
            k: _durations(v, origin) if k == "timings" and isinstance(v, dict) else readable(v, origin)
            for k, v in result.items()
        }
    if isinstance(result, list | tuple):
        return [readable(v, origin) for v in result]
    return result


def with_durations(main: Callable[..., Any]) -> Callable[..., Any]:
    """``main``, returning :func:`readable` of its result (for ``app_main`` to print)."""

    @functools.wraps(main)  # app_main shows the docstring of main's module
    def shown(*args: Any, **kwargs: Any) -> Any:
        return readable(main(*args, **kwargs))

    return shown
