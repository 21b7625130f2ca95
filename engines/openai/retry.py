"""When to retry a request to an OpenAI-compatible endpoint, and how long to wait first.

Retried: 408, 429 and 5xx answers, timeouts and connection errors; an ``x-should-retry``
header (``true`` / ``false``) overrides that for an answer. The wait is exponential
(``base * 2**attempt``, jittered down by up to a quarter, at most ``max``) unless the
endpoint says how long: ``retry-after-ms`` (milliseconds), ``Retry-After`` (seconds, or
an HTTP date) are honoured, capped at ``max``.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

RETRYABLE_STATUS = frozenset({408, 429})


def retryable_status(status: int, headers: Mapping[str, str]) -> bool:
    should = (headers.get("x-should-retry") or "").strip().lower()
    if should in ("true", "false"):
        return should == "true"
    return status in RETRYABLE_STATUS or status >= 500


def retry_after_s(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the endpoint asks to wait (``retry-after-ms``, then ``Retry-After`` as
    seconds or an HTTP date), or None when it does not say (or says nonsense)."""
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if parsed is None or parsed.tzinfo is None:
        return None
    return max(0.0, parsed.timestamp() - (time.time() if now is None else now))


@dataclass
class Backoff:
    """Delays between attempts. ``rng`` is injectable so tests can pin the jitter."""

    base_s: float
    max_s: float
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """The wait before retry number ``attempt + 1`` (``attempt`` counts from 0)."""
        if retry_after is not None:
            return min(retry_after, self.max_s)
        exponential = min(self.base_s * 2.0 ** min(attempt, 60), self.max_s)
        return exponential * (1 - 0.25 * self.rng.random())
