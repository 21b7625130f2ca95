"""The engines the ServeCore schedules on: registration, removal, and their records.

Engines are registered by URL (a running ``parrot engine``) or as an OpenAI-compatible
endpoint; each becomes an :class:`EngineSlot` handed to the scheduler (which owns the
slots from then on), and its record is stored
so a restarted ServeCore finds its engines again. An engine that does not answer at
restore is kept, marked down, until the monitor sees it answer again.

An engine's secrets (an API key, credentials or a key inside its URL) are used to reach it
and stored encrypted; everything shown (listings, messages, logs) has its public URL.

The builtin engine that ``parrot serve`` starts itself (its child process, which dies with
it) is marked so in its record (``own``). A later run on the same database replaces it:
the record of an earlier run's own engine at another URL (``make run ENGINE_PORT=...``) is
dropped, not kept down forever beside the new one. Engines registered by hand, or given with
``--engine``, are never dropped this way.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field

from parrot.engines.protocol.errors import BadRequestError, ConflictError, NotFoundError, ParrotError
from parrot.engines.protocol.urls import public_url
from parrot.platform.serve.contexts.manager import ContextManager
from parrot.platform.serve.engines.client import Engine, HttpEngine
from parrot.platform.serve.engines.settings import EngineSettings
from parrot.platform.serve.engines.tokenizers import TokenizerManager
from parrot.platform.serve.engines.url import check_engine_url
from parrot.platform.serve.journal import Journal
from parrot.platform.serve.scheduler.global_scheduler import GlobalScheduler
from parrot.platform.serve.scheduler.slot import EngineSlot
from parrot.platform.store.models import EngineRecord

log = logging.getLogger(__name__)

BUILTIN, OPENAI = "builtin", "openai"


@dataclass(frozen=True)
class EngineSpec:
    """What registering an engine needs. ``api_key`` and ``url`` (which may hold
    credentials) are secrets: shown only as :attr:`public_url`."""

    kind: str
    url: str = field(repr=False)
    # Tasks at once. None: a builtin engine's own running-job limit (from its ping); an
    # OpenAI endpoint's requests in flight default to 16.
    capacity: int | None = None
    model: str | None = None  # openai: the endpoint's model name
    api: str = "chat"  # openai: "chat" | "completions"
    api_key: str | None = field(default=None, repr=False)
    own: bool = False  # builtin: started by this ``parrot serve`` (replaced by the next run's)

    @property
    def public_url(self) -> str:
        return public_url(self.url)

    def config(self) -> dict:
        """The public part of the spec (stored in the clear, shown in listings)."""
        out: dict = {} if self.capacity is None else {"capacity": self.capacity}
        if self.kind == OPENAI:
            out["api"] = self.api
        if self.own:
            out["own"] = True
        return out

FIRST_PING_S = 10.0  # the first ping of an engine being registered


def _connect(spec: EngineSpec, settings: EngineSettings, ping_timeout_s: float) -> Engine:
    if spec.kind == BUILTIN:
        check_engine_url(spec.url)
        return HttpEngine(spec.url, timeout_s=settings.request_timeout_s, ping_timeout_s=ping_timeout_s)
    if spec.kind == OPENAI:
        from parrot.engines.openai.config import OpenAIEngineConfig
        from parrot.engines.openai.engine import OpenAIEngine

        if not spec.model:
            raise BadRequestError("an openai engine needs 'model'")
        return OpenAIEngine(
            OpenAIEngineConfig(
                base_url=spec.url,
                model=spec.model,
                api_key=spec.api_key,
                api=spec.api,
                capacity=spec.capacity,  # None: a llama.cpp server's slots, else the default
                default_capacity=settings.openai_capacity,
            )
        )
    raise BadRequestError(f"engine kind must be {BUILTIN!r} or {OPENAI!r}, got {spec.kind!r}")


class EngineRegistry:
    def __init__(
        self,
        scheduler: GlobalScheduler,
        contexts: ContextManager,
        journal: Journal,
        tokenizers: TokenizerManager,
        settings: EngineSettings,
        ping_timeout_s: float,
    ) -> None:
        self.scheduler = scheduler
        self.contexts = contexts  # frees what earlier runs left on an engine being registered
        self.journal = journal
        self.tokenizers = tokenizers
        self.settings = settings
        self.ping_timeout_s = ping_timeout_s  # the monitor's: an engine's client pings within it
        self.clients: dict[str, Engine] = {}  # by engine id: made here, closed here
        self.specs: dict[str, EngineSpec] = {}
        self._ids = itertools.count(1)

    def url_of(self, engine_id: str) -> str:
        return self.specs[engine_id].public_url

    async def register(
        self, spec: EngineSpec, engine_id: str | None = None, stored_model: str | None = None
    ) -> tuple[EngineSlot, asyncio.Future]:
        """Connect to the engine and add it. With ``stored_model`` (a restore) an engine
        that does not answer is kept, marked down, with the model its record names."""
        url = spec.public_url  # what messages and logs may show
        for known_id, known in self.specs.items():
            if known.public_url == url and (known.model == spec.model or spec.kind == BUILTIN):
                raise ConflictError(f"engine {url} is already registered as {known_id}")
        ping_s = self.ping_timeout_s
        client = _connect(spec, self.settings, ping_s)
        model, up, info = spec.model or stored_model or "", True, {}
        try:
            # A new registration waits longer than a health ping: an engine that has just
            # started may be slow to answer its first one (a restore keeps the short ping, so
            # engines that are down do not hold the start up).
            first = None if stored_model is not None else max(ping_s, FIRST_PING_S)
            info = await client.ping(first)
            model = info["model"]
            await self.contexts.free_orphans(url, client)
        except ParrotError as error:
            if stored_model is None:
                await client.aclose()
                raise BadRequestError(f"could not reach an engine at {url}: {error}") from None
            log.warning("engine %s at %s does not answer; kept, marked down", engine_id, url)
            up = False
        engine_id = engine_id or f"engine-{next(self._ids)}"
        tokenize = getattr(client, "tokenize", None)  # engines that take token ids
        if tokenize is not None and up and not self.tokenizers.has_local(model):
            await self._load_tokenizer(model, client)
        slot = EngineSlot(engine_id, model, client, text=tokenize is None, tokenize=tokenize)
        self.specs[engine_id] = spec
        self.clients[engine_id] = client
        # Without a capacity, an engine says how many tasks it runs at once in its pings
        # (a builtin engine's running-job limit; an endpoint's llama.cpp slots, or the default).
        self.scheduler.add_engine(slot, task_limit=spec.capacity, info=info, up=up)
        done = self.journal.record(
            lambda db: db.save_engine(
                engine_id, spec.kind, spec.url, model, spec.config(), {"api_key": spec.api_key or ""}
            )
        )
        return slot, done

    async def _load_tokenizer(self, model: str, client: Engine) -> None:
        fetch = getattr(client, "tokenizer_json", None)
        try:
            text = await fetch() if fetch is not None else None
            if text is not None:
                self.tokenizers.load(model, text)
        except Exception as error:  # the engine's /tokenize still works: slower, not wrong
            log.warning("could not load the tokenizer of %s here (%s); the engine tokenizes", model, error)

    async def remove(self, engine_id: str) -> asyncio.Future:
        slot = self.scheduler.remove_engine(engine_id)
        if slot is None:
            raise NotFoundError(f"engine {engine_id!r} is not registered")
        self.specs.pop(engine_id, None)
        await self.clients.pop(engine_id).aclose()
        return self.journal.record(lambda db: db.delete_engine(engine_id))

    async def restore(
        self,
        records: list[EngineRecord],
        urls: tuple[str, ...],
        own: str | None = None,
        own_later: bool = False,
    ) -> str | None:
        """Bring back the stored engines, then register ``urls`` not among them; ``own`` (one
        of them) is the engine this ``parrot serve`` started, which replaces an earlier run's.
        ``own_later``: it is still loading and is registered later (not here); the id of its
        record, kept for it, is returned."""
        numbers = [int(n) for r in records if (n := r.engine_id.rpartition("-")[2]).isdigit()]
        self._ids = itertools.count(max(numbers, default=0) + 1)
        # An --engine URL naming a stored builtin engine brings its current credentials.
        given = {public_url(url): url for url in urls}
        own_url = None if own is None else public_url(own)
        kept_id = None
        for record in records:
            if record.kind == BUILTIN and record.config.get("own") and record.url != own_url:
                await self._drop_stale(record)
                continue
            if own_later and record.kind == BUILTIN and record.url == own_url:
                kept_id = record.engine_id
                continue
            try:
                secrets = self.journal.store.engine_secrets(record) if self.journal.store else {}
            except ValueError as error:  # the key is not the one they were sealed with
                log.error("engine %s at %s is not restored: %s", record.engine_id, record.url, error)
                continue
            url = secrets.get("url", record.url)
            if record.kind == BUILTIN:
                url = given.get(record.url, url)
            spec = EngineSpec(
                kind=record.kind,
                url=url,
                capacity=record.config.get("capacity"),
                model=record.model if record.kind == OPENAI else None,
                api=record.config.get("api", "chat"),
                api_key=secrets.get("api_key"),
                own=record.kind == BUILTIN and record.url == own_url,
            )
            await self.register(spec, engine_id=record.engine_id, stored_model=record.model)
        known = {s.public_url for s in self.specs.values()}
        for url in urls:
            if public_url(url) not in known and not (own_later and public_url(url) == own_url):
                await self.register(EngineSpec(BUILTIN, url, own=public_url(url) == own_url))
        return kept_id

    async def _drop_stale(self, record: EngineRecord) -> None:
        """The record of an engine an earlier ``parrot serve`` started (it died with that
        run): removed from the store, so it does not stay listed, down, for good."""
        log.info("engine %s at %s was started by an earlier run; replaced", record.engine_id, record.url)
        engine_id = record.engine_id
        try:
            await self.journal.commit(self.journal.record(lambda db: db.delete_engine(engine_id)))
        except ParrotError as error:  # the next start tries again; this one goes on without it
            log.warning("could not remove the record of engine %s: %s", engine_id, error)

    async def close(self) -> None:
        for client in self.clients.values():
            await client.aclose()
