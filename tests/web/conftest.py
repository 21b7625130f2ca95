"""Browser tests of the dashboard: a real ``parrot serve`` process on the shared engine,
Debian's chromium driven by Playwright (one browser for the test session), screenshots
of every page written to ``tests/web/artifacts/`` (or ``$PARROT_WEB_ARTIFACTS``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import REPO_ROOT, ParrotProcess, free_port, parrot_process

ADMIN = "web-admin"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WIDTHS = (1280, 390)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    folder = Path(os.environ.get("PARROT_WEB_ARTIFACTS", REPO_ROOT / "tests" / "web" / "artifacts"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:  # never skipped: `make test` installs it
        pytest.fail("Debian's chromium is not on the PATH: run `make test` (or apt-get install -y chromium)")
    return path


@pytest.fixture(scope="module")
def browser(chromium):
    """Per module: Playwright's sync API keeps an event loop running on this thread while it
    is open, which would break every asyncio test that runs after it."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def dashboard_url(engine_server, tmp_path_factory) -> Iterator[str]:
    """``parrot serve`` as deployed, on the shared engine, with its dashboard."""
    data = tmp_path_factory.mktemp("parrot-web")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["serve", "--port", str(port), "--engine", engine_server.url, "--admin-token", ADMIN]
    args += ["--db", f"sqlite+aiosqlite:///{data / 'parrot.db'}", "--data-dir", str(data)]
    env = {k: v for k, v in os.environ.items() if k not in ("PARROT_SERVER", "PARROT_ADMIN_TOKEN")}

    def ready() -> bool:
        return httpx.get(f"{url}/healthz", timeout=2).json().get("engines") == 1

    with parrot_process(args, env, ready, "parrot serve (dashboard)"):
        yield url


@pytest.fixture(scope="session")
def second_engine(model_cache_dir) -> Iterator[str]:
    """A second real builtin engine (``parrot engine``), to register through the form."""
    port = free_port()
    env = {**os.environ, "PARROT_CACHE_DIR": str(model_cache_dir)}
    process = ParrotProcess(["engine", "--port", str(port), "--kv-cache-memory", "128MiB"], env)
    url = f"http://127.0.0.1:{port}"
    try:
        process.wait_ready(lambda: httpx.get(f"{url}/ping", timeout=2).status_code == 200, "parrot engine")
        yield url
    finally:
        if process.proc.poll() is None:
            process.stop()
