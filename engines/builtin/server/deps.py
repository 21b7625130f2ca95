"""Dependencies of the engine's HTTP routes: the one way a handler gets the engine.

The app's state holds the engine, or the loader building it, and the ids of its OpenAI
requests' contexts; the controllers declare these providers once, and handlers take
``engine`` (``ids``) by name.
"""

from __future__ import annotations

import itertools

from litestar.datastructures import State
from litestar.di import NamedDependency, Provide

from parrot.engines.builtin.engine import BuiltinEngine
from parrot.engines.builtin.loading import EngineLoader


class OpenAIContextIds:
    """Engine-internal context ids for OpenAI requests: -1, -2, ... (never a ServeCore's)."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def next(self) -> int:
        return -next(self._ids)


def engine_state(engine: BuiltinEngine | EngineLoader) -> State:
    return State({"engine": engine, "openai_ids": OpenAIContextIds()})


def provide_engine(state: State) -> BuiltinEngine:
    """The engine; while a loader builds it, a 503 that names the stage."""
    held = state.engine
    return held.engine if isinstance(held, EngineLoader) else held


def provide_openai_ids(state: State) -> OpenAIContextIds:
    return state.openai_ids


ENGINE = {"engine": Provide(provide_engine, sync_to_thread=False)}
OPENAI = {**ENGINE, "ids": Provide(provide_openai_ids, sync_to_thread=False)}
EngineDep = NamedDependency[BuiltinEngine]  # a handler's ``engine`` parameter
OpenAIIds = NamedDependency[OpenAIContextIds]  # a handler's ``ids`` parameter
