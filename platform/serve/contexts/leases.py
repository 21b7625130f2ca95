"""Leases: what a task holds on its engine while its request runs.

A lease is made by the context manager (platform/serve/contexts/manager.py) when it places a
task or fills a waiting chain's prefix ahead, and says what the engine request sends (the
task runner builds the request from it); ending it (settle or discard) hands its contexts
back to the manager, which alone changes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from parrot.engines.protocol.schemas import GenerateResponse, StreamEnd
from parrot.platform.serve.contexts.tree import READY, ContextTree, EngineContext
from parrot.platform.serve.scheduler.prompt import Prompt
from parrot.platform.serve.scheduler.slot import EngineSlot

if TYPE_CHECKING:
    from parrot.platform.serve.contexts.manager import ContextManager

Result = GenerateResponse | StreamEnd


@dataclass(eq=False)
class Lease:
    """A task's contexts on its engine, from its placement until its request is done: the
    context it forks from (held, so it is not evicted under it), the context it generates
    into and the checkpoint contexts its request makes at its prompt's shared prefixes.
    They join the tree when the task is placed, so the tasks placed right after it see its
    prompt there. Ended by exactly one of :meth:`settle` and :meth:`discard`."""

    manager: ContextManager
    slot: EngineSlot
    tree: ContextTree  # the engine's tree when it was placed (an engine lost gets a new one)
    prompt: Prompt
    context: EngineContext
    parent: EngineContext | None
    length: int  # symbols taken from the parent
    checkpoints: list[EngineContext]

    @property
    def tail(self) -> Sequence:
        """What the request sends: the prompt past what it forks."""
        return self.prompt.symbols[self.length :]

    @property
    def parent_id(self) -> int | None:
        return self.parent.context_id if self.parent is not None else None

    @property
    def parent_pending(self) -> bool:
        """Its parent's own request may still be on its way to the engine."""
        return self.parent is not None and self.parent.state != READY

    def request(self) -> dict:
        """The arguments of its engine request that come from its contexts."""
        return {
            "parent_len": self.length if self.parent is not None else None,
            "checkpoints": [(c.context_id, c.length) for c in self.checkpoints],
            **({"text": self.tail} if self.slot.text else {"token_ids": list(self.tail)}),
        }

    def refs(self) -> list[EngineContext]:
        """The contexts whose ``refs`` count this lease while it lives."""
        return [c for c in (self.parent, self.context) if c is not None]

    def settle(self, result: Result) -> None:
        """The request succeeded: its contexts are computed; the generation context holds
        prompt and output and stays cached."""
        self.manager.settle(self, result)

    def discard(self) -> None:
        """The request failed: its contexts are gone or useless on the engine."""
        self.manager.discard(self)


@dataclass(eq=False)
class AheadLease(Lease):
    """A fill-ahead request's contexts. Its context is held for the waiting chain (the
    hold, not the lease, counts in its ``refs``) until the chain runs or never will."""

    key: str = ""  # the chain's

    def refs(self) -> list[EngineContext]:
        return [self.parent] if self.parent is not None else []

    def settle(self, result: Result | None = None) -> None:
        self.manager.settle_ahead(self)

    def discard(self) -> None:
        """The fill failed: the chain fills its prompt when it runs."""
        self.manager.release_hold(self.key)
        self.manager.discard(self)


@dataclass(eq=False)
class AheadFill:
    """Contexts filled ahead for a waiting chain of a session, held until it runs."""

    session_id: str
    held: list[AheadLease] = field(default_factory=list)
