"""The REST API of a ServeCore, served in a thread, for the API tests (test_api*.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from conftest import DATABASES, ServerThread, database_url

from parrot.platform.api.app import create_app
from parrot.platform.serve.core import ServeCore
from parrot.platform.store.store import Store

ADMIN = "admin-token"


@contextmanager
def served_api(
    request: pytest.FixtureRequest, database: str, engine_url: str, folder: Path
) -> Iterator[httpx.Client]:
    """A client of the API on a real server, its store a new database of ``database`` (a
    DATABASES id: SQLite, or PostgreSQL for the PostgreSQL tier), one engine registered."""
    store = Store(database_url(request, database, folder))
    app = create_app(ServeCore(store=store), engine_urls=(engine_url,), admin_token=ADMIN)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module", params=DATABASES, name="api")
def api_on_fake_engine(request, tmp_path_factory):
    """``api``: the API on the fake engine, its store on SQLite and on PostgreSQL (the
    PostgreSQL tier). A test module imports it to use it."""
    from fake_engine import FakeEngineServer

    with (
        FakeEngineServer() as engine,
        served_api(request, request.param, engine.url, tmp_path_factory.mktemp("api-db")) as client,
    ):
        yield client


def new_session(api: httpx.Client) -> tuple[str, dict]:
    r = api.post("/v1/session")
    assert r.status_code == 201
    body = r.json()
    return body["session_id"], {"Authorization": f"Bearer {body['session_auth']}"}


def out(name: str, max_tokens: int = 8) -> dict:
    return {"name": name, "is_output": True, "sampling": {"max_tokens": max_tokens, "temperature": 0}}
