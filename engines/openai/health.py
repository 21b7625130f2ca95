"""An endpoint's health as the OpenAI engine sees it, and its request counters.

After a final availability failure (:class:`Failure` ``hard``) the endpoint is unhealthy for
``cooldown_s``: ``ping`` raises at once instead of probing, then probes again. A request
that succeeds, or a probe that answers, makes it healthy again.
"""

from __future__ import annotations

import logging
import time
from typing import NoReturn

from parrot.engines.openai.failures import Failure
from parrot.engines.protocol.errors import EngineUnavailableError

log = logging.getLogger(__name__)


class EndpointHealth:
    def __init__(self, where: str, cooldown_s: float) -> None:
        self.where = where
        self.cooldown_s = cooldown_s
        self.unhealthy: str | None = None  # why, while unhealthy
        self.down_until = 0.0  # monotonic; ping raises before it
        self.done = self.failed = self.retries = 0

    @property
    def healthy(self) -> bool:
        return self.unhealthy is None

    def check(self) -> None:
        """Raise during the cool-down after a hard failure."""
        remaining = self.down_until - time.monotonic()
        if self.unhealthy is not None and remaining > 0:
            raise EngineUnavailableError(
                f"{self.where} is unhealthy ({self.unhealthy}); next probe in {remaining:.1f} s"
            )

    def answered(self) -> None:
        """A probe answered."""
        self.unhealthy = None

    def succeeded(self) -> None:
        self.done += 1
        if self.unhealthy is not None:
            log.info("%s answers again", self.where)
        self.unhealthy = None
        self.down_until = 0.0

    def fail(self, failure: Failure) -> NoReturn:
        self.failed += 1
        if failure.hard:
            self.mark_unhealthy(str(failure.error))
        raise failure.error

    def mark_unhealthy(self, reason: str) -> None:
        self.unhealthy = reason
        self.down_until = time.monotonic() + self.cooldown_s
        log.warning("%s is unhealthy for %g s: %s", self.where, self.cooldown_s, reason)
