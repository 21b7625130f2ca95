"""The builtin engine that ``parrot serve`` started, while it loads its model.

``parrot serve`` binds its port at once instead of waiting for its engine (a first start
converts the model: minutes on a small CPU, with both ports refusing connections, as if
nothing ran). Meanwhile the ServeCore answers ``/healthz`` 503 ``loading`` with the engine's
own stage, and calls with a 503 that names it; once the engine's ``/healthz`` says ``ok``
it is registered (or, restored from an earlier run's record, it comes up on its next ping).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import httpx

log = logging.getLogger(__name__)
POLL_S = 0.5  # between two looks at the engine's /healthz


class EngineLoading:
    """Whether the ServeCore's own engine is still loading, and its stage. Written only by
    the watch task (:meth:`watch`); the health route and the call service read it."""

    def __init__(self) -> None:
        self.stage: str | None = None  # None: no engine of ours is loading
        self._task: asyncio.Task | None = None

    def describe(self) -> str:
        return f"the builtin engine is loading its model: {self.stage}"

    @staticmethod
    async def serves(url: str) -> bool:
        """Whether the engine at ``url`` has loaded (one look at its ``/healthz``)."""
        async with httpx.AsyncClient(timeout=5.0) as http:
            try:
                return (await http.get(f"{url}/healthz")).status_code == 200
            except httpx.TransportError:
                return False

    def watch(self, url: str, register: Callable[[], Awaitable[None]]) -> None:
        """Follow the engine at ``url`` until it serves, then ``register`` it."""
        self.stage = "starting"
        self._task = asyncio.create_task(self._follow(url, register))

    async def _follow(self, url: str, register: Callable[[], Awaitable[None]]) -> None:
        async with httpx.AsyncClient(timeout=5.0) as http:
            while True:
                try:
                    answer = await http.get(f"{url}/healthz")
                except httpx.TransportError:
                    self.stage = "starting (its port is not open yet)"
                else:
                    if answer.status_code == 200:
                        break
                    self.stage = _stage(answer)
                await asyncio.sleep(POLL_S)
        try:
            await register()
        except Exception as error:  # logged; /healthz then says no engine is up (its reason)
            log.error("the builtin engine at %s loaded but could not be registered: %s", url, error)
        finally:
            self.stage = None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def _stage(answer: httpx.Response) -> str:
    try:
        stage = answer.json().get("stage")
    except ValueError:
        stage = None
    return stage if isinstance(stage, str) else f"answering {answer.status_code}"
