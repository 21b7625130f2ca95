"""The settings of ``parrot serve``: one frozen dataclass, read in one place from CLI flags
and ``PARROT_*`` environment variables (a flag wins over its variable, the variable over the
default). Every tunable of the ServeCore is here with its documented default:

================================  ===========================  =======================================
flag                              variable                     default: meaning
================================  ===========================  =======================================
``--host`` / ``--port``           PARROT_HOST / PARROT_PORT    127.0.0.1 / 9000
``--engine URL`` (repeatable)     PARROT_ENGINES (comma list)  none: a builtin engine is started
``--db URL``                      PARROT_DB                    SQLite in the data folder
``--data-dir``                    PARROT_DATA_DIR              $XDG_DATA_HOME/parrot
``--admin-token``                 PARROT_ADMIN_TOKEN           generated, shown once
``--model``                       PARROT_MODEL                 the bundled model (a hub id, folder or .gguf)
``--openai-api-key`` (repeatable) PARROT_OPENAI_API_KEYS       none: the OpenAI front is open
``--session-timeout``             PARROT_SESSION_TIMEOUT       3600 s: an idle session expires
``--secure-cookies``              PARROT_SECURE_COOKIES        off: dashboard cookies only over HTTPS
``--ping-interval``               PARROT_PING_INTERVAL         1 s between two rounds of engine pings
``--ping-timeout``                PARROT_PING_TIMEOUT          2 s: one ping may take this long
``--max-missed-pings``            PARROT_MAX_MISSED_PINGS      2 in a row: the engine is down
``--down-grace``                  PARROT_DOWN_GRACE            15 s a task waits for a down engine
``--engine-timeout``              PARROT_ENGINE_TIMEOUT        600 s: one engine request at most
``--parent-wait``                 PARROT_PARENT_WAIT           10 s a fork waits for its parent context
``--memory-high`` / ``-low``      PARROT_MEMORY_HIGH / _LOW    0.9 / 0.75 of an engine's KV blocks
``--openai-capacity``             PARROT_OPENAI_CAPACITY       16 requests at once per OpenAI endpoint
``--cluster-min-shared``          PARROT_CLUSTER_MIN_SHARED    64 shared tokens: placed together
``--header-timeout`` and others   PARROT_HEADER_TIMEOUT, ...   the HTTP server's limits (``server_flags``)
``--max-body-bytes``              PARROT_MAX_BODY_BYTES        33554432 (32 MiB): one request body (413)
``--max-value-chars``             PARROT_MAX_VALUE_CHARS       8388608: one variable's value (413)
``--max-prompt-chars``            PARROT_MAX_PROMPT_CHARS      8388608: a template or prompt (413)
``--max-placeholders``            PARROT_MAX_PLACEHOLDERS      4096 placeholders in a template (413)
``--max-value-bytes``             PARROT_MAX_VALUE_BYTES       1073741824 (1 GiB): all values held (507)
``--max-value-bytes-per-client``  PARROT_MAX_VALUE_BYTES_PER_CLIENT 268435456 (256 MiB) per address (429)
``--max-sessions-per-client``     PARROT_MAX_SESSIONS_PER_CLIENT 4096 live sessions per address (429)
``--max-vars-per-session``        PARROT_MAX_VARS_PER_SESSION  10000 (429)
``--max-calls-per-session``       PARROT_MAX_CALLS_PER_SESSION 10000 (429)
``--max-pending-calls``           PARROT_MAX_PENDING_CALLS     10000 unfinished calls, server-wide (429)
``--max-subscribers-per-var``     PARROT_MAX_SUBSCRIBERS_PER_VAR 64 streams of one variable (429)
``--max-subscribers-per-session`` PARROT_MAX_SUBSCRIBERS_PER_SESSION 256 streams in one session (429)
(no flag: a secret)               PARROT_SECRET_KEY            key file in the data folder (0600)
``--transform-budget``            PARROT_TRANSFORM_BUDGET      2 s of CPU one transform may take in all
``--transform-workers``           PARROT_TRANSFORM_WORKERS     2 transforms computed at once (threads)
================================  ===========================  =======================================

``PARROT_SECRET_KEY`` encrypts engine secrets at rest: one Fernet key, or several
comma-separated (the first encrypts, the others still decrypt: key rotation). It has no flag
because a command line is visible to every user of the machine (``ps``).

``--log-level`` / ``--log-json`` (PARROT_LOG_LEVEL, PARROT_LOG_JSON) belong to the ``parrot``
command itself (:mod:`parrot.cli.logs`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TypeVar

from parrot.cli.server_flags import add_server_arguments, server_limits_from_args
from parrot.engines.protocol.server import ServerLimits
from parrot.platform.serve.calls.transform_runner import TransformLimits
from parrot.platform.serve.contexts.tree import MemoryPressure
from parrot.platform.serve.engines.settings import EngineSettings
from parrot.platform.serve.limits.settings import Limits, env_name, flag
from parrot.platform.serve.scheduler.health import HealthSettings
from parrot.platform.serve.scheduler.policy import SchedulingPolicy

T = TypeVar("T")


def from_env(name: str, parse: Callable[[str], T], default: T, env: Mapping[str, str] | None = None) -> T:
    """``PARROT_<name>`` parsed, else ``default``; a bad value is a clear error."""
    env = os.environ if env is None else env
    raw = env.get(f"PARROT_{name}")
    if raw is None or raw == "":
        return default
    try:
        return parse(raw)
    except ValueError as error:
        raise ValueError(f"PARROT_{name}={raw!r}: {error}") from None


def _flag(raw: str) -> bool:
    return raw.strip().lower() not in ("", "0", "false", "no", "off")


def _list(raw: str) -> list[str]:
    return [item.strip() for item in raw.split(",") if item.strip()]


def default_data_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "parrot"


@dataclass(frozen=True)
class ServeSettings:
    host: str = "127.0.0.1"
    port: int = 9000
    engine_urls: tuple[str, ...] = ()  # engines to register; none: start a builtin one
    start_engine: bool = True  # start a builtin engine when no engine URL is given
    engine_port: int = 9001  # of the builtin engine it starts
    model: str | None = None  # of the builtin engine it starts
    admin_token: str | None = None  # None: generated and shown once
    openai_api_keys: tuple[str, ...] = field(default=(), repr=False)
    session_timeout_s: float = 3600.0
    db: str | None = None  # a SQLAlchemy URL; None: SQLite in data_dir
    data_dir: Path = field(default_factory=default_data_dir)
    dashboard: bool = True
    dashboard_auth: bool = False  # the read-only pages need signing in too
    secure_cookies: bool = False  # the dashboard's cookies only over HTTPS (behind a TLS proxy)
    policy: SchedulingPolicy = field(default_factory=SchedulingPolicy)
    pressure: MemoryPressure = field(default_factory=MemoryPressure)
    health: HealthSettings = field(default_factory=HealthSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)
    server: ServerLimits = field(default_factory=ServerLimits)
    limits: Limits = field(default_factory=Limits)
    # PARROT_SECRET_KEY: keys encrypting engine secrets at rest, the first the current one;
    # none: a key file in data_dir (generated once, mode 0600).
    secret_keys: tuple[str, ...] = field(default=(), repr=False)
    transforms: TransformLimits = field(default_factory=TransformLimits)

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536 or not 0 < self.engine_port < 65536:
            raise ValueError("ports must be between 1 and 65535")
        if self.session_timeout_s <= 0:
            raise ValueError("--session-timeout must be positive")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeSettings:
        return cls(
            host=args.host,
            port=args.port,
            engine_urls=tuple(args.engine),
            start_engine=not args.no_engine,
            engine_port=args.engine_port,
            model=args.model,
            admin_token=args.admin_token,
            openai_api_keys=tuple(args.openai_api_key),
            session_timeout_s=args.session_timeout,
            db=args.db,
            data_dir=Path(args.data_dir),
            dashboard=not args.no_dashboard,
            dashboard_auth=args.dashboard_auth,
            secure_cookies=args.secure_cookies,
            policy=SchedulingPolicy(
                app_fifo=not args.no_app_fifo,
                task_groups=not args.no_task_groups,
                context_affinity=not args.no_context_affinity,
                criteria=not args.no_criteria,
                engine_roles=not args.no_engine_roles,
                cluster_min_shared=args.cluster_min_shared,
            ),
            pressure=MemoryPressure(high=args.memory_high, low=args.memory_low),
            health=HealthSettings(
                interval_s=args.ping_interval,
                timeout_s=args.ping_timeout,
                max_missed=args.max_missed_pings,
                down_grace_s=args.down_grace,
            ),
            engine=EngineSettings(
                request_timeout_s=args.engine_timeout,
                parent_wait_s=args.parent_wait,
                openai_capacity=args.openai_capacity,
            ),
            server=server_limits_from_args(args),
            limits=Limits(**{f.name: getattr(args, f.name) for f in fields(Limits)}),
            secret_keys=tuple(args.secret_keys),
            transforms=TransformLimits(budget_s=args.transform_budget, workers=args.transform_workers),
        )


def add_serve_arguments(p: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    """The flags of ``parrot serve``, their defaults from ``PARROT_*`` variables."""
    d, policy, pressure, health = ServeSettings, SchedulingPolicy(), MemoryPressure(), HealthSettings()
    engine = EngineSettings()
    limits = TransformLimits()

    def e(name: str, parse: Callable[[str], T], default: T) -> T:
        return from_env(name, parse, default, env)

    p.add_argument("--host", default=e("HOST", str, d.host))
    p.add_argument("--port", type=int, default=e("PORT", int, d.port))
    p.add_argument(
        "--engine",
        action="append",
        default=e("ENGINES", _list, []),
        metavar="URL",
        help="register a running engine (repeatable; $PARROT_ENGINES, comma-separated); "
        "without any a builtin engine is started",
    )
    p.add_argument(
        "--no-engine",
        action="store_true",
        help="start no builtin engine (register engines later with POST /v1/engines)",
    )
    p.add_argument(
        "--engine-port", type=int, default=d.engine_port, help="port of the builtin engine it starts"
    )
    p.add_argument(
        "--model",
        default=e("MODEL", str, None),
        help="model of the builtin engine it starts: a Hugging Face hub id (org/name), a model "
        "folder or a .gguf file (default: $PARROT_MODEL, else the bundled SmolLM2-135M)",
    )
    p.add_argument(
        "--admin-token",
        default=e("ADMIN_TOKEN", str, None),
        help="default: $PARROT_ADMIN_TOKEN, else generated",
    )
    p.add_argument(
        "--session-timeout",
        type=float,
        default=e("SESSION_TIMEOUT", float, d.session_timeout_s),
        help="seconds before an idle session expires (3600)",
    )
    for name, what in (
        ("app-fifo", "downstream tasks of applications in progress first"),
        ("task-groups", "schedule the tasks one consumer waits on together"),
        ("context-affinity", "prefer the engine holding the longest prompt prefix"),
        ("criteria", "latency-critical tasks first and to lightly loaded engines"),
        ("engine-roles", "with 2+ engines, keep latency-critical and throughput work apart"),
    ):
        p.add_argument(f"--no-{name}", action="store_true", help=f"scheduling policy off: {what}")
    p.add_argument(
        "--cluster-min-shared",
        type=int,
        default=e("CLUSTER_MIN_SHARED", int, policy.cluster_min_shared),
        help="a queued prompt sharing this many tokens with a task just placed goes with it (64)",
    )
    p.add_argument(
        "--transform-budget",
        type=float,
        default=e("TRANSFORM_BUDGET", float, limits.budget_s),
        help="seconds one semantic transform may compute, all its steps and values together (2)",
    )
    p.add_argument(
        "--transform-workers",
        type=int,
        default=e("TRANSFORM_WORKERS", int, limits.workers),
        help="transforms computed at once, in worker threads off the event loop (2)",
    )
    p.add_argument(
        "--openai-api-key",
        action="append",
        default=e("OPENAI_API_KEYS", _list, []),
        metavar="KEY",
        help="require this key on the OpenAI-compatible /v1 routes (repeatable; "
        "default: $PARROT_OPENAI_API_KEYS, comma-separated; none: open)",
    )
    p.add_argument(
        "--dashboard-auth",
        action="store_true",
        default=e("DASHBOARD_AUTH", _flag, False),
        help="the dashboard's read-only pages need signing in too (default: open to loopback "
        "clients; $PARROT_DASHBOARD_AUTH=1)",
    )
    p.add_argument(
        "--secure-cookies",
        action="store_true",
        default=e("SECURE_COOKIES", _flag, False),
        help="mark the dashboard's sign-in and CSRF cookies Secure: behind a TLS proxy "
        "($PARROT_SECURE_COOKIES=1)",
    )
    p.add_argument("--no-dashboard", action="store_true", help="serve the API only, no dashboard pages")
    p.add_argument(
        "--db",
        default=e("DB", str, None),
        metavar="URL",
        help="SQLAlchemy URL of the database, e.g. postgresql+asyncpg://user@host/parrot "
        "(default: $PARROT_DB, else SQLite in the data folder)",
    )
    p.add_argument(
        "--data-dir",
        default=e("DATA_DIR", str, str(default_data_dir(env))),
        help="data folder (default: $PARROT_DATA_DIR, else $XDG_DATA_HOME/parrot or ~/.local/share/parrot)",
    )
    engines = p.add_argument_group("engine health and memory")
    engines.add_argument(
        "--ping-interval", type=float, default=e("PING_INTERVAL", float, health.interval_s),
        help="seconds between two rounds of engine pings (1)",
    )
    engines.add_argument(
        "--ping-timeout", type=float, default=e("PING_TIMEOUT", float, health.timeout_s),
        help="seconds one ping may take (2)",
    )
    engines.add_argument(
        "--max-missed-pings", type=int, default=e("MAX_MISSED_PINGS", int, health.max_missed),
        help="missed pings in a row before an engine is down (2)",
    )
    engines.add_argument(
        "--down-grace", type=float, default=e("DOWN_GRACE", float, health.down_grace_s),
        help="seconds a task whose every engine is down waits for one to come back (15)",
    )
    engines.add_argument(
        "--engine-timeout", type=float, default=e("ENGINE_TIMEOUT", float, engine.request_timeout_s),
        help="seconds one request to an engine may take (600)",
    )
    engines.add_argument(
        "--parent-wait", type=float, default=e("PARENT_WAIT", float, engine.parent_wait_s),
        help="seconds a fork waits for its parent context's request to reach the engine (10)",
    )
    engines.add_argument(
        "--openai-capacity", type=int, default=e("OPENAI_CAPACITY", int, engine.openai_capacity),
        help="requests at once on an OpenAI endpoint registered without a capacity (16)",
    )
    engines.add_argument(
        "--memory-high", type=float, default=e("MEMORY_HIGH", float, pressure.high),
        help="free cached contexts above this share of an engine's KV blocks (0.9) ...",
    )
    engines.add_argument(
        "--memory-low", type=float, default=e("MEMORY_LOW", float, pressure.low),
        help="... down to this share (0.75)",
    )
    add_server_arguments(p, env)
    limits = p.add_argument_group("limits (413: too large, 429: too many, 507: values fill the server)")
    for f, what in zip(fields(Limits), _LIMIT_HELP, strict=True):
        default = e(env_name(f.name).removeprefix("PARROT_"), int, getattr(Limits(), f.name))
        limits.add_argument(flag(f.name), type=int, default=default, help=f"{what} ({f.default})")
    # No flag: a secret on a command line is visible to every user of the machine.
    p.set_defaults(secret_keys=e("SECRET_KEY", _list, []))


_LIMIT_HELP = (
    "bytes of one request body",
    "characters of one variable's value",
    "characters of a call's template or an OpenAI-front prompt",
    "characters of an output's format (a JSON schema, regex, choices, grammar)",
    "milliseconds to compile a format and prepare its first tokens at submit (400 beyond)",
    "placeholders ({{) of a call's template, counted before it is parsed",
    "bytes of all variable values the server holds (507 beyond)",
    "bytes of the variable values of one client address's sessions (429 beyond)",
    "live sessions one client address may hold",
    "variables of one session",
    "calls of one session",
    "calls not finished yet, all sessions together",
    "followers of one variable's stream at once",
    "streams of one session's variables open at once",
)
