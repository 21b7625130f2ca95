"""Readiness of semantic variables: values and errors arrive, waiters wake."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from parrot.engines.protocol.errors import ProducerFailedError
from parrot.platform.serve.graph import SemanticVariable


@dataclass
class Variables:
    """Readiness events of the variables, so waiting costs nothing."""

    events: dict[int, asyncio.Event] = field(default_factory=dict)
    waits: int = 0  # gets that waited, and their total wait (for /metrics)
    wait_seconds: float = 0.0
    on_change: Callable[[SemanticVariable], None] | None = None  # a value or an error arrived

    def event(self, var: SemanticVariable) -> asyncio.Event:
        ev = self.events.setdefault(id(var), asyncio.Event())
        if var.ready or var.error:
            ev.set()
        return ev

    def set_value(self, var: SemanticVariable, value: str) -> None:
        var.value = value
        self._changed(var)

    def fail(self, var: SemanticVariable, error: str) -> None:
        var.error = error
        self._changed(var)

    def _changed(self, var: SemanticVariable) -> None:
        self.event(var).set()
        if self.on_change is not None:
            self.on_change(var)

    async def wait(self, var: SemanticVariable, timeout: float | None = None) -> str:
        started = time.monotonic()
        try:
            await asyncio.wait_for(self.event(var).wait(), timeout)
        finally:
            self.waits += 1
            self.wait_seconds += time.monotonic() - started
        if var.error:
            raise ProducerFailedError(f"variable {var.name!r} has no value: {var.error}")
        return var.value or ""
