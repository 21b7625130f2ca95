"""``parrot serve`` behind TLS: ``--secure-cookies`` (or PARROT_SECURE_COOKIES=1) marks the
dashboard's cookies Secure, so a browser never sends the sign-in over plain HTTP."""

from __future__ import annotations

import os

import httpx
import pytest
from conftest import free_port, parrot_process

pytestmark = pytest.mark.spawns  # child processes


def csrf_cookie(url: str) -> str:
    r = httpx.get(f"{url}/login")
    return next(c for c in r.headers.get_list("set-cookie") if c.startswith("parrot_csrf="))


def test_secure_cookies_mark_the_dashboard_cookies_secure(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PARROT_SECURE_COOKIES": "1"}
    args = ["serve", "--port", str(port), "--no-engine", "--data-dir", str(tmp_path)]
    with parrot_process(args, env, lambda: httpx.get(f"{url}/healthz", timeout=2).is_success, "serve"):
        cookie = csrf_cookie(url)
        assert "Secure" in cookie and "HttpOnly" in cookie, cookie
    env.pop("PARROT_SECURE_COOKIES")
    with parrot_process(args, env, lambda: httpx.get(f"{url}/healthz", timeout=2).is_success, "serve"):
        assert "Secure" not in csrf_cookie(url)  # the default: plain HTTP on loopback works
