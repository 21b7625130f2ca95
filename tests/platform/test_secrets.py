"""Engine secrets (API keys, credentials inside a URL): never shown, encrypted at rest with
the server key, and still used to reach the engine after a restart.

The engine here is the real builtin engine behind a real HTTP server that demands the
credentials (Basic auth from the URL, or the Bearer API key), so a ServeCore that lost or
garbled them would find the engine down."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import sqlite3
import stat

import httpx
import pytest
from conftest import ParrotProcess, ServerThread, free_port

from parrot.engines.protocol.urls import public_url
from parrot.platform.serve.core import ServeCore
from parrot.platform.store.secret_box import KEY_FILE, SecretBox, SecretKeyError
from parrot.platform.store.store import Store, sqlite_url
from parrot.web.app import create_server_app

USER, PASSWORD, API_KEY = "parrot-user", "pw-0123456789-secret", "sk-parrot-0123456789-secret"
ADMIN = {"Authorization": "Bearer admin"}


def guarded(app, seen: list[str]):
    """``app`` behind a check of ``Authorization``: Basic USER:PASSWORD or Bearer API_KEY,
    else 401 (what a reverse proxy in front of an engine does)."""
    basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    allowed = {basic.encode(): "basic", f"Bearer {API_KEY}".encode(): "bearer"}

    async def asgi(scope, receive, send):
        if scope["type"] == "http":
            who = allowed.get(dict(scope["headers"]).get(b"authorization", b""))
            seen.append(who or "refused")
            if who is None:
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"who are you?"})
                return
        await app(scope, receive, send)

    return asgi


@pytest.fixture(scope="module")
def locked_engine(engine):
    """The session's engine on a second port that demands credentials; yields (url, seen)."""
    from parrot.engines.builtin.server.app import create_app as engine_app

    seen: list[str] = []
    with ServerThread(guarded(engine_app(engine, manage_engine=False), seen)) as server:
        yield server.url, seen


def with_credentials(url: str) -> str:
    return url.replace("http://", f"http://{USER}:{PASSWORD}@")


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert PASSWORD not in text and API_KEY not in text and USER not in text, text[:500]


def run_one_call(api: httpx.Client, model: str | None = None) -> dict:
    s = api.post("/v1/session").json()
    sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
    body = {
        "session_id": sid,
        "template": "Name a color: {{c}}",
        "parameters": [{"name": "c", "is_output": True, "sampling": {"max_tokens": 3, "temperature": 0}}],
        "models": [model] if model else [],
    }
    call = api.post("/v1/semantic_call", json=body, headers=auth)
    assert call.status_code == 201, call.text
    value = api.get(
        f"/v1/semantic_var/{call.json()['outputs']['c']}", params={"session_id": sid}, headers=auth
    )
    assert value.status_code == 200 and value.json()["value"], value.text
    info = api.get(f"/v1/semantic_call/{call.json()['call_id']}", params={"session_id": sid}, headers=auth)
    return info.json()


def served_model(url: str) -> str:
    return httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).json()["data"][0][
        "id"
    ]


# -- the key -------------------------------------------------------------------------------
def test_the_key_file_is_made_once_with_mode_0600_and_reused(tmp_path):
    first = SecretBox.load((), tmp_path)
    path = tmp_path / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    sealed = first.seal({"api_key": API_KEY})
    assert sealed.startswith("fernet:") and API_KEY not in sealed
    again = SecretBox.load((), tmp_path)  # a restart
    assert again.open(sealed) == {"api_key": API_KEY}
    assert path.read_bytes().strip().decode() not in repr(again)


def test_a_configured_key_wins_and_an_older_key_still_opens_for_rotation(tmp_path):
    from cryptography.fernet import Fernet

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    sealed = SecretBox.from_env(tmp_path, {"PARROT_SECRET_KEY": old}).seal({"api_key": API_KEY})
    assert not (tmp_path / KEY_FILE).exists()  # a configured key makes no file
    rotated = SecretBox.from_env(tmp_path, {"PARROT_SECRET_KEY": f"{new},{old}"})
    assert rotated.open(sealed) == {"api_key": API_KEY} and rotated.needs_rotation(sealed)
    with pytest.raises(SecretKeyError, match="does not decrypt"):
        SecretBox.from_env(tmp_path, {"PARROT_SECRET_KEY": new}).open(sealed)
    with pytest.raises(SecretKeyError, match="Fernet"):
        SecretBox.from_env(tmp_path, {"PARROT_SECRET_KEY": "hunter2"})


def test_public_urls_keep_no_credentials_query_or_fragment():
    assert public_url("http://u:p@127.0.0.1:9001/") == "http://127.0.0.1:9001"
    assert public_url("https://u@[::1]:8000/v1?key=s#x") == "https://[::1]:8000/v1"
    assert public_url("http://[::1") == "<invalid url>"


# -- at rest -------------------------------------------------------------------------------
def database_bytes(folder) -> bytes:
    """Everything SQLite holds on disk for the database in ``folder`` (its WAL too)."""
    return b"".join(p.read_bytes() for p in folder.iterdir() if p.name.startswith("parrot.db"))


def test_plaintext_secrets_of_an_older_version_are_encrypted_on_start(tmp_path, caplog):
    """A database written before encryption (the API key in the clear, credentials inside
    the URL) is sealed on the first start, and no plaintext is left in the file."""

    async def old_version() -> None:
        store = Store(sqlite_url(tmp_path))
        await store.migrate()
        await store.write(
            lambda db: db.save_engine("engine-1", "openai", "http://127.0.0.1:1/v1", "m", {"api": "chat"})
        )
        await store.close()
        # What the older version wrote: both secrets in the clear.
        with sqlite3.connect(tmp_path / "parrot.db") as db:
            db.execute(
                "update engines set url = ?, secret = ?",
                (f"http://{USER}:{PASSWORD}@127.0.0.1:1/v1", API_KEY),
            )

    asyncio.run(old_version())
    assert PASSWORD.encode() in database_bytes(tmp_path)

    async def new_version() -> dict:
        store = Store(sqlite_url(tmp_path))
        await store.migrate()
        try:
            (record,) = await store.engines()
            assert record.url == "http://127.0.0.1:1/v1" and record.secret.startswith("fernet:")
            return store.engine_secrets(record)
        finally:
            await store.close()

    caplog.set_level(logging.INFO)
    assert asyncio.run(new_version()) == {
        "api_key": API_KEY,
        "url": f"http://{USER}:{PASSWORD}@127.0.0.1:1/v1",
    }
    on_disk = database_bytes(tmp_path)
    assert PASSWORD.encode() not in on_disk and API_KEY.encode() not in on_disk
    assert any("encrypted the secrets of 1 stored engine" in r.getMessage() for r in caplog.records)
    assert_no_secret(*(r.getMessage() for r in caplog.records))


def test_secrets_sealed_with_an_older_key_are_re_sealed_with_the_new_one(tmp_path, monkeypatch):
    from cryptography.fernet import Fernet

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()

    async def start(keys: str) -> dict:
        monkeypatch.setenv("PARROT_SECRET_KEY", keys)
        store = Store(sqlite_url(tmp_path))
        await store.migrate()
        try:
            if not await store.engines():
                await store.write(
                    lambda db: db.save_engine("engine-1", "builtin", with_credentials("http://h:1"), "m")
                )
            (record,) = await store.engines()
            return store.engine_secrets(record)
        finally:
            await store.close()

    assert asyncio.run(start(old)) == {"url": with_credentials("http://h:1")}
    assert asyncio.run(start(f"{new},{old}")) == {"url": with_credentials("http://h:1")}  # rotates
    assert asyncio.run(start(new)) == {"url": with_credentials("http://h:1")}  # the old key is gone


# -- over HTTP, and across a restart ---------------------------------------------------------
def servecore(folder) -> tuple[ServerThread, httpx.Client]:
    server = ServerThread(create_server_app(ServeCore(store=Store(sqlite_url(folder))), admin_token="admin"))
    return server, httpx.Client(base_url=server.url, timeout=120)


def registration(kind: str, url: str) -> tuple[dict, str]:
    """The body registering the locked engine, and how it must authenticate."""
    if kind == "builtin-url":  # a builtin engine behind a proxy: credentials in its URL
        return {"url": with_credentials(url)}, "basic"
    body = {"kind": "openai", "base_url": f"{url}/v1", "model": served_model(url)}
    if kind == "openai-key":
        return {**body, "api_key": API_KEY}, "bearer"
    return {**body, "base_url": with_credentials(f"{url}/v1")}, "basic"  # openai-url


@pytest.mark.parametrize("kind", ["builtin-url", "openai-key", "openai-url"])
def test_credentials_are_never_shown_and_a_restart_still_reaches_the_engine(
    tmp_path, locked_engine, caplog, kind
):
    """Registered with credentials in its URL or with an API key: the listing, the
    dashboard, metrics, call info, errors and logs show none of them; the database holds
    them only encrypted; a new ServeCore on the same database reaches the engine with them."""
    url, seen = locked_engine
    caplog.set_level(logging.DEBUG)
    body, scheme = registration(kind, url)
    shown = url if kind == "builtin-url" else f"{url}/v1"
    pages: list[str] = []
    seen.clear()
    server, api = servecore(tmp_path)
    with server, api:
        r = api.post("/v1/engines", json=body, headers=ADMIN)
        assert r.status_code == 201, r.text
        assert r.json()["url"] == shown and r.json()["up"]
        engine_id = r.json()["engine_id"]
        # A second registration, and an unreachable one: their errors name no secret either.
        again = api.post("/v1/engines", json=body, headers=ADMIN)
        assert again.status_code == 409, again.text
        gone = (
            {**body, "url": with_credentials("http://127.0.0.1:9")}
            if "url" in body
            else {
                **body,
                "base_url": with_credentials("http://127.0.0.1:9/v1"),
            }
        )
        failed = api.post("/v1/engines", json=gone, headers=ADMIN)
        assert failed.status_code == 400, failed.text
        call = run_one_call(api)
        assert call["state"] == "done" and call["engine"] == engine_id
        listing = api.get("/v1/engines").text
        pages += [r.text, again.text, failed.text, str(call), listing, api.get("/metrics").text]
        pages += [api.get("/engines").text, api.get("/healthz").text]
        pages.append(api.get(f"/v1/engines/{engine_id}/contexts", headers=ADMIN).text)
    assert_no_secret(*pages)
    assert shown in listing  # the public URL is shown
    on_disk = database_bytes(tmp_path)
    assert PASSWORD.encode() not in on_disk and API_KEY.encode() not in on_disk
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    assert scheme in seen

    seen.clear()
    server, api = servecore(tmp_path)
    with server, api:
        (engine,) = api.get("/v1/engines").json()
        assert engine["engine_id"] == engine_id and engine["up"] and engine["url"] == shown, engine
        call = run_one_call(api)
        assert call["state"] == "done" and call["engine"] == engine_id
    assert seen and set(seen) == {scheme}, seen  # every request carried the credentials
    assert_no_secret(*(r.getMessage() for r in caplog.records))


def test_a_restart_with_another_key_skips_the_engines_it_cannot_open(tmp_path, locked_engine, caplog):
    """The wrong key: the engine is not restored (nothing is sent to it without its
    credentials), the reason is logged, and the record stays for the right key."""
    url, _ = locked_engine

    async def run() -> None:
        store = Store(sqlite_url(tmp_path))
        core = ServeCore(store=store)
        await core.start((with_credentials(url),))
        await core.stop()
        (tmp_path / KEY_FILE).rename(tmp_path / "old.key")
        core = ServeCore(store=Store(sqlite_url(tmp_path)))
        await core.start()
        try:
            assert core.views.engine_views() == []
            assert len(await core.journal.store.engines()) == 1
        finally:
            await core.stop()

    caplog.set_level(logging.INFO)
    asyncio.run(run())
    assert any(
        "is not restored" in r.getMessage() and "does not decrypt" in r.getMessage() for r in caplog.records
    )
    assert_no_secret(*(r.getMessage() for r in caplog.records))


def test_parrot_serve_keeps_its_key_in_the_data_folder_and_reaches_the_engine_again(tmp_path, locked_engine):
    """``parrot serve`` as deployed: no PARROT_SECRET_KEY, so the key is generated into the
    data folder (0600) and reused by the next start, which reaches the engine again."""
    url, _ = locked_engine
    env = {k: v for k, v in os.environ.items() if k != "PARROT_SECRET_KEY"}
    env["PARROT_ADMIN_TOKEN"] = "admin"
    port = free_port()
    api_url = f"http://127.0.0.1:{port}"
    args = ["serve", "--port", str(port), "--no-engine", "--no-dashboard", "--data-dir", str(tmp_path)]
    for attempt in range(2):
        process = ParrotProcess(args, env)
        try:
            process.wait_ready(lambda: httpx.get(f"{api_url}/healthz", timeout=2).status_code == 200, "serve")
            if attempt == 0:
                r = httpx.post(f"{api_url}/v1/engines", json={"url": with_credentials(url)}, headers=ADMIN)
                assert r.status_code == 201, r.text
            (engine,) = httpx.get(f"{api_url}/v1/engines").json()
            assert engine["up"] and engine["url"] == url
        finally:
            output = process.stop()
        assert_no_secret(output)
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600


def test_the_dashboard_form_never_shows_credentials_again(tmp_path, locked_engine):
    """The registration form: a failed registration shows the URL again without its
    credentials (they are typed again, like the API key); a registered engine is listed by
    its public URL."""
    import re

    url, _ = locked_engine

    def csrf(page: str) -> str:
        return re.search(r'name="_csrf_token" value="([^"]+)"', page).group(1)

    server, browser = servecore(tmp_path)
    with server, browser:
        token = csrf(browser.get("/login").text)
        browser.post("/login", data={"token": "admin", "next": "/engines", "_csrf_token": token})
        token = csrf(browser.get("/engines").text)
        gone = with_credentials("http://127.0.0.1:9") + "/?key=" + API_KEY
        r = browser.post("/engines", data={"kind": "builtin", "url": gone, "_csrf_token": token})
        assert r.status_code == 400 and 'value="http://127.0.0.1:9"' in r.text
        r = browser.post(
            "/engines", data={"kind": "builtin", "url": with_credentials(url), "_csrf_token": token}
        )
        assert r.status_code == 303, r.text
        listing = browser.get("/engines").text
        assert url in listing
        assert_no_secret(r.text, listing, browser.get("/").text)


def test_an_engine_url_given_at_start_brings_new_credentials_for_a_stored_engine(tmp_path, locked_engine):
    """The password changed: ``--engine`` with the new one reaches the stored engine (same
    id), and the new credentials replace the stored ones."""
    url, seen = locked_engine

    async def run() -> None:
        store = Store(sqlite_url(tmp_path))
        await store.migrate()
        old = url.replace("http://", f"http://{USER}:old-password@")
        await store.write(lambda db: db.save_engine("engine-4", "builtin", old, "m", {"capacity": 2}))
        await store.close()
        core = ServeCore(store=Store(sqlite_url(tmp_path)))
        await core.start((with_credentials(url),))
        try:
            assert [(v.engine_id, v.up, v.url) for v in core.views.engine_views()] == [
                ("engine-4", True, url)
            ]
            await core.journal.flush()
            (record,) = await core.journal.store.engines()
            assert core.journal.store.engine_secrets(record) == {"url": with_credentials(url)}
        finally:
            await core.stop()

    seen.clear()
    asyncio.run(run())
    assert seen and set(seen) == {"basic"}
