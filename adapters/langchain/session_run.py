"""One run of LangChain work on Parrot: a session, the texts of the run, and its calls.

A run uses the session of the enclosing ``with client.session()`` block of the SDK when
that session is on the same server (so an application can put LangChain calls and its own
semantic calls in one DAG, and look at them afterwards); otherwise it creates a session,
named with the model's ``session_label`` and ``session_tags`` (what the dashboard finds it
by), and deletes it when the run ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from parrot.adapters.langchain.settings import ParrotSettings
from parrot.adapters.langchain.templates import call_template
from parrot.adapters.langchain.texts import Piece, Texts, TextSlot
from parrot.sdk.aclient import AsyncClient, AsyncSession, AsyncVar
from parrot.sdk.handles import current_session
from parrot.sdk.params import Output
from parrot.sdk.results import CallUsage


class SessionRun:
    """Semantic calls in one session. With ``share_inputs``, a known text that a call
    reads becomes a semantic variable of its own (once, named after it), so every call
    that reads it depends on the same variable; without, it is bound by value."""

    def __init__(self, client: AsyncClient, session: AsyncSession, share_inputs: bool) -> None:
        self.client = client
        self.session = session
        self.texts = Texts()
        self.share_inputs = share_inputs
        self._vars: dict[int, asyncio.Task[AsyncVar]] = {}  # id(slot) -> its variable, being made

    async def generate(
        self, pieces: Sequence[Piece], output: str, sampling: dict[str, Any], models: Sequence[str]
    ) -> TextSlot:
        """Submit a call that generates after ``pieces``; returns the slot of its output,
        registered in :attr:`texts`. Nothing waits for the generation."""
        call = call_template(pieces, output)
        bound = await asyncio.gather(*(self._bound(slot) for slot in call.inputs.values()))
        submitted = await self.session.submit(
            call.template,
            dict(zip(call.inputs, bound, strict=True)),
            {call.output: Output(**sampling)},
            models=models,
        )
        slot = TextSlot(output, var=submitted.outputs[call.output], call_id=submitted.call_id)
        self.texts.add(slot)
        return slot

    async def _bound(self, slot: TextSlot) -> AsyncVar | str:
        if slot.var is not None:
            return slot.var
        if not self.share_inputs or slot not in self.texts:
            return slot.value or ""
        task = self._vars.get(id(slot))
        if task is None:
            task = self._vars[id(slot)] = asyncio.ensure_future(self.session.var(slot.name, slot.value))
        slot.var = await task
        return slot.var

    async def values(self, slots: Sequence[TextSlot], criteria: str, timeout: float) -> dict[TextSlot, str]:
        """The value of each slot, waiting for those still being generated (all at once)."""
        waiting = [s for s in slots if s.value is None and s.var is not None]
        got = await asyncio.gather(*(s.var.get_text(criteria, timeout) for s in waiting))
        for slot, value in zip(waiting, got, strict=True):
            slot.value = value
        return {slot: slot.value or "" for slot in slots}

    async def usage(self, call_ids: Sequence[str]) -> dict[str, CallUsage]:
        """Token usage of these calls of the run, by call id."""
        if not call_ids:
            return {}
        return {u.call_id: u for u in (await self.session.usage(list(call_ids))).calls}


@asynccontextmanager
async def open_run(settings: ParrotSettings, share_inputs: bool) -> AsyncIterator[SessionRun]:
    """A run in the enclosing SDK session (same server), else in a session of its own."""
    config = settings.client_config()
    async with AsyncClient(config.base_url, timeout=config.timeout) as client:
        enclosing = current_session()
        if enclosing is not None and enclosing.client.config.base_url == config.base_url:
            session = client.attach(enclosing.session_id, enclosing.session_auth)
            yield SessionRun(client, session, share_inputs)
            return
        async with client.session(**settings.session_names()) as session:
            yield SessionRun(client, session, share_inputs)


@asynccontextmanager
async def shared_session(settings: ParrotSettings) -> AsyncIterator[None]:
    """Make the runs started inside (concurrently, by a batch) share one session: the
    enclosing one when it is on this server, else a new one, deleted at the end."""
    config = settings.client_config()
    enclosing = current_session()
    if enclosing is not None and enclosing.client.config.base_url == config.base_url:
        yield
        return
    async with (
        AsyncClient(config.base_url, timeout=config.timeout) as client,
        client.session(**settings.session_names()),
    ):
        yield
