"""Guessing the admin token is slowed down per client address (issue 24, defect 8): on the
API's admin routes (429) and on the dashboard's ``/login`` (429 page), with a right token
inside the wait not even compared; after the wait the operator gets in."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from conftest import ServerThread

from parrot.platform.api.token_throttle import TokenThrottle
from parrot.platform.serve.core import ServeCore
from parrot.web.app import create_server_app

ADMIN = "throttle-admin"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_free_failures_then_doubling_waits_capped():
    clock = Clock()
    t = TokenThrottle(free_failures=3, base_delay_s=1, max_delay_s=5, clock=clock)
    for _ in range(3):
        assert t.retry_after("a") == 0
        t.failed("a")
    assert t.retry_after("a") == 0  # the free failures cost nothing
    waits = []
    for _ in range(5):
        t.failed("a")
        waits.append(t.retry_after("a"))
        clock.now += waits[-1]
    assert waits == [1, 2, 4, 5, 5]
    assert t.retry_after("b") == 0  # per address
    t.succeeded("a")
    assert t.retry_after("a") == 0


def test_quiet_addresses_are_forgotten_and_the_table_is_bounded():
    clock = Clock()
    t = TokenThrottle(free_failures=0, forget_after_s=60, max_clients=100, clock=clock)
    t.failed("a")
    assert t.retry_after("a") > 0
    clock.now += 61
    assert t.retry_after("a") == 0
    for n in range(1000):
        t.failed(f"10.0.{n // 256}.{n % 256}")
    assert len(t._clients) == 100


@pytest.fixture
def server():
    with ServerThread(create_server_app(ServeCore(), admin_token=ADMIN)) as running:
        yield running


def _wrong(client: httpx.Client, times: int) -> list[int]:
    return [
        client.get("/v1/engines/e1/contexts", headers={"Authorization": "Bearer nope"}).status_code
        for _ in range(times)
    ]


def test_the_api_answers_429_after_repeated_wrong_admin_tokens(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert _wrong(client, 5) == [403] * 5
        assert _wrong(client, 1) == [403]  # the sixth failure starts a 1 s wait
        r = client.get("/v1/engines/e1/contexts", headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 429, r.text  # the right token is not even compared in the wait
        assert r.json()["error"]["code"] == "too_many_requests"
        assert "too many wrong admin tokens" in r.json()["error"]["message"]
        time.sleep(1.1)
        r = client.get("/v1/engines/e1/contexts", headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 404, r.text  # let in: no such engine
        assert _wrong(client, 5) == [403] * 5  # a right token cleared the address
        assert client.get("/healthz").status_code == 200  # other routes are untouched


def test_the_login_page_slows_down_too(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:

        def attempt(token: str) -> httpx.Response:
            page = client.get("/login").text
            csrf = re.search(r'name="_csrf_token" value="([^"]+)"', page).group(1)
            return client.post("/login", data={"token": token, "next": "/", "_csrf_token": csrf})

        assert [attempt("nope").status_code for _ in range(6)] == [401] * 6
        r = attempt(ADMIN)
        assert r.status_code == 429 and "try again in" in r.text
        time.sleep(1.1)
        assert attempt(ADMIN).status_code == 303
