"""Shared fixtures: one real builtin engine (default model) per test session, served over HTTP,
and one real ``parrot serve`` process on it for the SDK's and the adapters' tests."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pg_cluster import PostgresCluster
from servers import REPO_ROOT as REPO_ROOT
from servers import ParrotProcess as ParrotProcess
from servers import ServerThread as ServerThread
from servers import assert_event_streams as assert_event_streams
from servers import free_port as free_port
from servers import parrot_process as parrot_process
from servers import rss_mib as rss_mib
from servers import serve_env as serve_env

pytest_plugins = ["tiers"]  # the logic tier (make test-fast)

# Under pytest-xdist (make test) each worker, and the processes its tests start, computes on
# its share of the cores: torch's default (every core) in every worker oversubscribes them,
# and OpenMP's waiting threads spin (the engine tests took 2.3x as long on 2 workers of 2
# threads each as on 2 of 1). Set before torch is first imported; an explicit setting wins.


def usable_cores() -> int:
    """The cores this process may use: its CPU affinity, within a cgroup's CPU quota (a
    container limited to 2 cores may still see every core of its host)."""
    cores = len(os.sched_getaffinity(0))
    quotas = (("/sys/fs/cgroup/cpu.max", None), ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "cpu.cfs_period_us"))
    for path, period_file in quotas:
        try:
            fields = Path(path).read_text().split()
            if period_file:
                fields.append(Path(path).with_name(period_file).read_text().strip())
            quota, period = fields[0], fields[1]
        except (OSError, IndexError):
            continue
        if quota not in ("max", "-1"):
            cores = min(cores, max(1, int(quota) // int(period)))
        break
    return cores


if workers := os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, usable_cores() // int(workers))))

# Without a GPU the Triton kernels run in Triton's interpreter; it must be chosen before
# triton is first imported.
if not os.environ.get("CUDA_VISIBLE_DEVICES", "x") or not Path("/dev/nvidia0").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def model_cache_dir(tmp_path_factory) -> Path:
    """Converted models are cached per user, as in production (conversion is slow once)."""
    return Path.home() / ".cache" / "parrot" / "models"


@pytest.fixture(scope="session")
def engine_config(model_cache_dir):
    from parrot.engines.builtin.engine_config import EngineConfig
    from parrot.engines.builtin.local_scheduler import SchedulerConfig

    # The shared engine runs the exact weights: their greedy output is token-identical to
    # transformers and the same whatever else is in the batch or how a prompt was chunked or
    # forked, which many tests compare. The default (the GGUF's own 4-bit blocks, whose
    # kernels sum in another order at other row counts) is tested in test_default_mode.py,
    # test_weight_formats.py, and by every `parrot serve`/`parrot engine` a test starts.
    return EngineConfig(
        weights="exact",
        cache_dir=str(model_cache_dir),
        kv_cache_bytes=256 * 2**20,  # 5,824 tokens: below the model's 8,192
        scheduler=SchedulerConfig(max_batched_tokens=512, max_running=32),
    )


@pytest.fixture(scope="session")
def tiny_model(model_cache_dir, tmp_path_factory) -> Path:
    """A random 2-layer Llama with the default model's tokenizer (tests/tiny_model.py), for
    the tests of processes whose engines need not be the default model."""
    from tiny_model import NAME, write_tiny_model

    from parrot.engines.builtin.model.loader import resolve_model_folder

    tokenizer = resolve_model_folder(None, model_cache_dir)
    return write_tiny_model(tmp_path_factory.mktemp("models") / NAME, tokenizer)


ENGINE = pytest.StashKey()  # the session's engine, once the ``engine`` fixture made it


@pytest.fixture(scope="session")
def engine(engine_config, pytestconfig):
    from parrot.engines.builtin.engine import BuiltinEngine

    eng = BuiltinEngine(engine_config)
    eng.check_running()
    pytestconfig.stash[ENGINE] = eng
    yield eng
    del pytestconfig.stash[ENGINE]
    eng.stop()


@pytest.fixture(scope="module", autouse=True)
def engine_integrity(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test module that used the session's engine (directly or through its
    server or ``parrot serve``), the engine's bookkeeping must still add up: every KV block
    free or held as often as counted, nothing referenced after free (``check_integrity``,
    run on the engine thread once it is idle)."""
    yield
    import asyncio

    engine = request.config.stash.get(ENGINE, None)
    module = request.node
    used = any(
        "engine" in item.fixturenames
        for item in request.session.items
        if item.getparent(pytest.Module) is module
    )
    if engine is not None and used:
        asyncio.run(engine.check_integrity())


@pytest.fixture(scope="session")
def engine_server(engine) -> Iterator[ServerThread]:
    from parrot.engines.builtin.server.app import create_app

    app = create_app(engine, manage_engine=False)
    with ServerThread(app) as server:
        yield server


@pytest.fixture(scope="session")
def fake_engine_server():
    """One HTTP server of fake engines (tests/fake_engine) for the session; each test that
    uses ``fake_engine`` gets a fresh engine behind it."""
    from fake_engine import FakeEngineServer

    with FakeEngineServer() as server:
        yield server


@pytest.fixture
def fake_engine(fake_engine_server):
    """A fresh fake engine (no model) at ``fake_engine.url``; its knobs and records are
    ``fake_engine.engine``'s."""
    from fake_engine import FakeEngine

    fake_engine_server.engine = FakeEngine()
    return fake_engine_server


@pytest.fixture
def engine_url(request) -> str:
    """The URL of an engine for a ServeCore: the fake engine (no model), or with
    ``@pytest.mark.parametrize("engine_url", ["real"], indirect=True)`` the session's real
    engine (the real-engine tests of features whose logic is tested on the fake)."""
    kind = getattr(request, "param", "fake")
    if kind not in ("fake", "real"):
        raise ValueError(f"engine_url is 'fake' or 'real', not {kind!r}")
    return request.getfixturevalue("fake_engine" if kind == "fake" else "engine_server").url


@pytest.fixture
def client(engine_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=engine_server.url, timeout=120) as c:
        yield c


ADMIN_TOKEN = "sdk-admin"


@pytest.fixture(scope="session")
def parrot_url(engine_server, tmp_path_factory) -> Iterator[str]:
    """``parrot serve`` as a child process (as deployed), with the engine that the other
    tests use registered (``--engine``), so no second model is loaded. SIGINT at the end;
    it must exit with code 0."""
    data = tmp_path_factory.mktemp("parrot-serve")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [
        "serve",
        "--port",
        str(port),
        "--engine",
        engine_server.url,
        "--admin-token",
        ADMIN_TOKEN,
        "--db",
        f"sqlite+aiosqlite:///{data / 'parrot.db'}",
        "--data-dir",
        str(data),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("PARROT_SERVER", "PARROT_ADMIN_TOKEN")}

    def ready() -> bool:
        return httpx.get(f"{url}/healthz", timeout=2).json().get("engines") == 1

    with parrot_process(args, env, ready, "parrot serve"):
        yield url


@pytest.fixture
def parrot(parrot_url):
    """An SDK client of the ``parrot serve`` process (with its admin token)."""
    from parrot.sdk import Client

    with Client(parrot_url, admin_token=ADMIN_TOKEN, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def fake_server(tmp_path_factory) -> Iterator[tuple[str, object]]:
    """A ServeCore's API (its own SQLite file, the admin token of ``parrot_url``) served in a
    thread, on a fake engine whose tokens take 20 ms (calls submitted together are all on the
    server before the first is done, as on the real engine): for the SDK's and the adapters'
    tests of what the client does. (url, the ServeCore)"""
    from fake_engine import FakeEngine, FakeEngineServer

    from parrot.platform.api.app import create_app
    from parrot.platform.serve.core import ServeCore
    from parrot.platform.store.store import Store, sqlite_url

    core = ServeCore(store=Store(sqlite_url(tmp_path_factory.mktemp("fake-serve"))))
    with FakeEngineServer(FakeEngine(step_s=0.02)) as engine:
        app = create_app(core, engine_urls=(engine.url,), admin_token=ADMIN_TOKEN)
        with ServerThread(app) as server:
            yield server.url, core


@pytest.fixture(scope="session")
def fake_server_url(fake_server) -> str:
    return fake_server[0]


@pytest.fixture
def server_url(request) -> str:
    """A Parrot server for a client's tests: the API on the fake engine (``fake_server_url``),
    or with ``@pytest.mark.parametrize("server_url", ["real"], indirect=True)`` the real
    ``parrot serve`` process on the real engine (``parrot_url``)."""
    kind = getattr(request, "param", "fake")
    if kind not in ("fake", "real"):
        raise ValueError(f"server_url is 'fake' or 'real', not {kind!r}")
    return request.getfixturevalue("fake_server_url" if kind == "fake" else "parrot_url")


@pytest.fixture
def server(server_url):
    """An SDK client of ``server_url`` (with its admin token)."""
    from parrot.sdk import Client

    with Client(server_url, admin_token=ADMIN_TOKEN, timeout=120) as client:
        yield client


# -- the PostgreSQL tier: store, restart and API tests run on SQLite and on PostgreSQL ------
DATABASES = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgresql),
]


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster (started when a test of the tier first needs it). Missing
    server binaries fail the tier's tests: ``make test`` installs them."""
    cluster = PostgresCluster(free_port()).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def database_url(request: pytest.FixtureRequest, kind: str, folder: Path) -> str:
    """A new, empty database of ``kind`` (a DATABASES id): its SQLAlchemy URL."""
    if kind == "postgresql":
        return request.getfixturevalue("postgres").create_database()
    return f"sqlite+aiosqlite:///{folder / 'parrot.db'}"


@pytest.fixture(params=DATABASES)
def db_url(request, tmp_path) -> str:
    return database_url(request, request.param, tmp_path)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    reports = [r for key in ("passed", "failed", "error") for r in terminalreporter.stats.get(key, [])]
    tier = [r for r in reports if "[postgresql" in r.nodeid and (r.when == "call" or r.failed)]
    if tier:
        failed = sum(r.failed for r in tier)
        terminalreporter.write_line(
            f"PostgreSQL tier: {len(tier)} tests ran on a throwaway PostgreSQL cluster ({failed} failed)"
        )


@pytest.fixture(scope="session")
def ids() -> Iterator[int]:
    """Context ids unique across the test session (the engine is shared by all tests)."""
    return itertools.count(10_000)


@pytest.fixture(scope="module", autouse=True)
def context_integrity() -> Iterator[None]:
    """After every test module: the context bookkeeping of each ServeCore it ran in this
    process adds up (``ContextManager.check_integrity``). A ServeCore's is checked when it
    stops (before it frees everything), one still running at the module's end once its
    scheduler is idle if its loop still runs (or after 10 s: the check is valid between any
    two awaits)."""
    import weakref

    from parrot.platform.serve.contexts.manager import ContextAccountingError
    from parrot.platform.serve.scheduler.global_scheduler import GlobalScheduler

    running: weakref.WeakSet[GlobalScheduler] = weakref.WeakSet()
    errors: list[str] = []
    init, stop = GlobalScheduler.__init__, GlobalScheduler.stop

    def check(scheduler: GlobalScheduler) -> None:
        running.discard(scheduler)
        try:
            scheduler.contexts.check_integrity()
        except ContextAccountingError as error:
            errors.append(str(error))

    def recording_init(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        running.add(self)

    async def checked_stop(self, *args, **kwargs) -> None:
        if self in running:
            check(self)
        await stop(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(GlobalScheduler, "__init__", recording_init)
        patch.setattr(GlobalScheduler, "stop", checked_stop)
        yield
    deadline = time.monotonic() + 10
    for scheduler in list(running):
        loops = [job.get_loop() for job in scheduler._loops]
        while loops and loops[0].is_running() and not scheduler.idle and time.monotonic() < deadline:
            time.sleep(0.05)  # its loop runs in another thread (a served app)
        check(scheduler)
    if errors:
        pytest.fail("\n".join(errors), pytrace=False)
