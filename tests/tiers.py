"""The logic tier (``make test-fast``, ``pytest -m logic``): the tests that use none of the
real parts that make the full suite slow. A test is in it unless it uses the real engine
(the default model, directly or through its server or ``parrot serve``; ``engine_url`` or
``server_url`` with the parameter ``"real"``), the browser or
PostgreSQL (by their fixtures, or the ``postgresql`` mark of the PostgreSQL tier), starts
child processes itself (the ``spawns`` mark), or is one of the engine's own tests (its
numerics on tiny models, Triton's interpreter). The serve layer's tests run there on the
fake engine (tests/fake_engine).

The mark is applied here, at collection, by that rule, and nowhere else. A rule that
shrinks the tier by mistake fails the run: a full ``-m logic`` run must select at least
:data:`LOGIC_MIN` tests. Inside the tier, starting a child process fails the test
(``PARROT_TESTS_LOGIC_ONLY``, checked by ``servers.ParrotProcess``), so the tier cannot
quietly grow slow either.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REAL_PARTS = frozenset(
    {
        "engine",  # the real engine (default model) and what runs on it
        "engine_server",
        "client",
        "parrot_url",
        "parrot",
        "model_cache_dir",  # the converted default model
        "postgres",
        "browser",
        "dashboard_url",
        "second_engine",
    }
)
REAL_PARAMS = ("engine_url", "server_url")  # conftest's fixtures: "real" is the real engine
ENGINE_TESTS = Path(__file__).parent / "engines" / "builtin"
LOGIC_MIN = 450  # the tier held 486 tests when this was written
LOGIC_ONLY = "PARROT_TESTS_LOGIC_ONLY"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "logic: the logic tier (make test-fast); applied by tests/tiers.py")
    config.addinivalue_line("markers", "spawns: starts child processes itself (not in the logic tier)")
    if config.option.markexpr == "logic":
        os.environ[LOGIC_ONLY] = "1"


def in_logic_tier(item: pytest.Item) -> bool:
    if REAL_PARTS & set(getattr(item, "fixturenames", ())):
        return False
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "real" in (callspec.params.get(n) for n in REAL_PARAMS):
        return False
    if item.get_closest_marker("postgresql") or item.get_closest_marker("spawns"):
        return False
    return not item.path.is_relative_to(ENGINE_TESTS)


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if in_logic_tier(item):
            item.add_marker(pytest.mark.logic)


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword
    if config.option.markexpr == "logic" and whole and len(session.items) < LOGIC_MIN:
        raise pytest.UsageError(
            f"the logic tier selected {len(session.items)} tests, fewer than {LOGIC_MIN}: "
            "has the rule in tests/tiers.py (or a fixture's name) changed?"
        )
