"""The builtin engine while it loads: its port answers from the start.

A first start converts the model and compiles the C++ extension (minutes on a small CPU).
Refusing connections all that time looks like a dead server; so ``parrot engine`` binds its
port at once and builds the engine in a thread (:class:`EngineLoader`), answering
``/healthz`` with 503 ``{"status": "loading", "stage": ...}`` and every other route with a
503 that names the stage, as llama.cpp's server answers 503 "Loading model". Each stage is
logged with its real duration when it ends (:class:`LoadStages`).
"""

from __future__ import annotations

import logging
import threading
import time

from parrot.engines.builtin.engine import BuiltinEngine
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.protocol.errors import EngineLoadingError

log = logging.getLogger("parrot.loading")


class LoadStages:
    """What the engine is doing while it loads: the stage and since when. Written by the
    loading thread, read by the server's handlers (under a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = self._since = time.monotonic()
        self._stage = "finding the model"

    def enter(self, stage: str) -> None:
        now = time.monotonic()
        with self._lock:
            previous, since = self._stage, self._since
            self._stage, self._since = stage, now
        log.info("loading: %s took %.1f s; now %s", previous, now - since, stage)

    def finish(self) -> float:
        """The load ended: log the last stage and the whole time, which is returned."""
        now = time.monotonic()
        with self._lock:
            previous, since = self._stage, self._since
            self._stage, self._since = "loaded", now
        log.info("loading: %s took %.1f s", previous, now - since)
        return now - self._started

    def describe(self) -> str:
        """The stage and its seconds so far, e.g. ``converting the model (12 s)``."""
        with self._lock:
            stage, since = self._stage, self._since
        return f"{stage} ({time.monotonic() - since:.0f} s)"


class EngineLoader:
    """Builds a :class:`BuiltinEngine` in a thread of its own; ``engine`` raises
    :class:`EngineLoadingError` (503, naming the stage) until it is built. A failed build
    keeps its ``error`` and sets ``failed`` (the CLI's server stops on it and exits with
    the error)."""

    def __init__(self, config: EngineConfig) -> None:
        self.stages = LoadStages()
        self.error: BaseException | None = None
        self.failed = threading.Event()
        self._engine: BuiltinEngine | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._load, args=(config,), name="parrot-load", daemon=True)
        self._thread.start()

    def _load(self, config: EngineConfig) -> None:
        try:
            engine = BuiltinEngine(config, on_stage=self.stages.enter)
        except BaseException as error:  # what the process does about it is the CLI's
            self.error = error
            self.failed.set()
            return
        seconds = self.stages.finish()
        log.info("serving %s (loaded in %.1f s)", engine.model_name, seconds)
        self._engine = engine  # published last: a handler sees a whole engine or none
        if self._stopped:  # the server stopped while it loaded
            engine.stop()

    @property
    def loaded(self) -> bool:
        return self._engine is not None

    @property
    def engine(self) -> BuiltinEngine:
        engine = self._engine
        if engine is None:
            raise EngineLoadingError(f"the engine is loading its model: {self.stages.describe()}")
        return engine

    def stop(self) -> None:
        self._stopped = True
        if self._engine is not None:
            self._engine.stop()
