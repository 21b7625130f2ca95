"""The state of a semantic call: one vocabulary for the graph, the journal, the store and
the dashboard.

A leaf module (no imports from the rest of Parrot), so the store can name the states it
persists without depending on the serve layer's graph. A :class:`StrEnum`: the values are
the strings the REST API, the dashboard and the database have always used.
"""

from __future__ import annotations

from enum import StrEnum


class CallState(StrEnum):
    PENDING = "pending"  # submitted; no chain has started yet
    RUNNING = "running"  # a chain started on an engine (or the ServeCore, a transform)
    DONE = "done"  # every output has its value
    FAILED = "failed"  # an output failed: the call never finishes

    @property
    def settled(self) -> bool:
        """Done or failed: nothing about the call changes any more."""
        return self in (CallState.DONE, CallState.FAILED)


UNFINISHED = (CallState.PENDING, CallState.RUNNING)  # what runs again after a restart
