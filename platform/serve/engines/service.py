"""Engines: registered and removed (through the :class:`EngineRegistry`), and what the rest
of the ServeCore asks of them beyond scheduling: the models served, a chat rendered in a
model's own template.

A registration is acknowledged only once its record is stored; if the store does not take
it, the engine is removed again. (The contexts that earlier, killed runs left on the engines
are freed by the context manager as each engine is registered.)
"""

from __future__ import annotations

from collections.abc import Sequence

from parrot.engines.protocol.errors import ParrotError
from parrot.engines.protocol.schemas import RenderChatRequest, RenderChatResponse
from parrot.platform.serve.engines.loading import EngineLoading
from parrot.platform.serve.engines.registry import BUILTIN, EngineRegistry, EngineSpec
from parrot.platform.serve.journal import Journal
from parrot.platform.serve.scheduler import snapshot
from parrot.platform.serve.scheduler.global_scheduler import GlobalScheduler
from parrot.platform.serve.scheduler.slot import EngineSlot
from parrot.platform.store.models import EngineRecord


class EngineService:
    def __init__(
        self, registry: EngineRegistry, journal: Journal, scheduler: GlobalScheduler, loading: EngineLoading
    ) -> None:
        self.registry = registry
        self.journal = journal
        self.scheduler = scheduler
        self.loading = loading

    async def restore(
        self,
        records: Sequence[EngineRecord],
        urls: tuple[str, ...],
        own: str | None = None,
        own_later: bool = False,
    ) -> None:
        """The stored engines, then ``urls`` (``--engine``, or ``own``: the engine ``parrot
        serve`` started) not among them; the engine an earlier run started is replaced.
        ``own_later``: the own engine is loading its model; it is registered (under its
        stored id, if any) once it has loaded."""
        kept_id = await self.registry.restore(list(records), urls, own, own_later)
        if own is not None and own_later:

            async def register() -> None:
                await self.register(EngineSpec(BUILTIN, own, own=True), engine_id=kept_id)

            self.loading.watch(own, register)

    async def register(self, spec: EngineSpec, engine_id: str | None = None) -> EngineSlot:
        slot, stored = await self.registry.register(spec, engine_id=engine_id)
        try:
            await self.journal.commit(stored)
        except ParrotError:
            await self.registry.remove(slot.engine_id)
            raise
        return slot

    async def register_builtin(self, url: str, capacity: int | None = None) -> EngineSlot:
        return await self.register(EngineSpec(BUILTIN, url, capacity))

    async def remove(self, engine_id: str) -> None:
        await self.journal.commit(await self.registry.remove(engine_id))

    def slots(self) -> list[EngineSlot]:
        return snapshot.slots(self.scheduler)

    def models(self) -> list[str]:
        return sorted({e.model for e in snapshot.take(self.scheduler).engines if e.model})

    async def render_chat(self, model: str, chat: RenderChatRequest) -> RenderChatResponse | None:
        """A chat's prompt pieces in ``model``'s own chat template (tools in its tool
        syntax), by an engine of that model that offers it (None: none does)."""
        for slot in self.scheduler.serving((model,)):
            render = getattr(slot.client, "render_chat", None)
            if slot.up and render is not None:
                return await render(chat)
        return None

    async def close(self) -> None:
        await self.loading.stop()
        await self.registry.close()
