"""A semantic variable: a named text container of a session, ``ready`` once it holds a value.

Its producer and consumers are the chains of calls that generate and read it (the links of
its session's DAG, :mod:`parrot.platform.serve.calls.graph`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from parrot.platform.serve.variables.stream import ValueStream
from parrot.wire.formats import OutputFormat

if TYPE_CHECKING:
    from parrot.platform.serve.calls.graph import CompletionChain


@dataclass(eq=False)
class SemanticVariable:
    """A named text container of a session; ``ready`` once it holds a value.

    It owns its readiness event: waiting state lives and dies with the variable (never in
    a table keyed by object addresses, which a later variable could reuse)."""

    var_id: str
    name: str
    value: str | None = None
    error: str | None = None  # why it will never get a value (its producer failed)
    format: OutputFormat | None = None  # what its value must be (a typed variable), checked when set
    producer: CompletionChain | None = None
    consumers: list[CompletionChain] = field(default_factory=list)
    stored: bool = True  # False in sessions that are not persisted (one-shot OpenAI requests)
    # Set once the variable has a value or an error (by its one writer,
    # :class:`~parrot.platform.serve.variables.values.VariableValues`).
    settled: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _stream: ValueStream | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.value is not None or self.error is not None:  # made settled (a restore)
            self.settled.set()

    @property
    def ready(self) -> bool:
        return self.value is not None

    @property
    def stream(self) -> ValueStream:
        """Its text while its producer generates it (made when first asked for)."""
        if self._stream is None:
            self._stream = ValueStream()
        return self._stream

    def end_stream(self, finish_reason: str | None = None) -> None:
        """It settled: whoever streams it reads the rest and ends."""
        if self._stream is not None:
            self._stream.close(finish_reason)

    @property
    def partial(self) -> str | None:
        """What its producer generated so far, while it runs (None: no text yet, or settled)."""
        if self._stream is None or self.value is not None or self.error is not None:
            return None
        return self._stream.text or None
