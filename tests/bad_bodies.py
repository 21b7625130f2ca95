"""Bad request bodies for every JSON route of a Parrot server (the ServeCore's and the
builtin engine's): nested too deeply, invalid UTF-8, not sent as JSON. Each must get a clear
4xx JSON error and leave the server healthy (issue 14, items 5 and 7)."""

from __future__ import annotations

from collections.abc import Callable

import httpx

DEEP_ARRAY = b"[" * 10_000 + b"]" * 10_000
DEEP_OBJECT = b'{"a":' * 10_000 + b"1" + b"}" * 10_000
BAD_UTF8 = b'{"session_id": "\xff\xfe", "name": "x"}'


def json_routes(schema: dict) -> list[tuple[str, str]]:
    """(method, path) of every operation of an OpenAPI schema that takes a JSON body,
    with path parameters filled in."""
    routes = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if "application/json" in operation.get("requestBody", {}).get("content", {}):
                routes.append((method.upper(), path.replace("{", "").replace("}", "")))
    return routes


def assert_error(response: httpx.Response, status: int, *fragments: str) -> None:
    assert response.status_code == status, (response.request.url, response.text)
    message = response.json()["error"]["message"]
    for fragment in fragments:
        assert fragment in message, message


def assert_bad_bodies_rejected(client: httpx.Client, credentials: Callable[[str], dict], health: str) -> int:
    """Sends every bad body to every JSON route of the server behind ``client``, with the
    headers ``credentials(path)`` (so that guards let the request reach the body), and GET
    ``health`` after each route; returns the number of routes, so that a schema without
    JSON routes cannot pass unnoticed."""
    routes = json_routes(client.get("/schema/openapi.json").json())
    for method, path in routes:
        headers = credentials(path)
        send = {"headers": {**headers, "content-type": "application/json"}}
        for body in (DEEP_ARRAY, DEEP_OBJECT):
            assert_error(client.request(method, path, content=body, **send), 400, "nested too deeply")
        assert_error(client.request(method, path, content=BAD_UTF8, **send), 400, "not valid UTF-8")
        assert_error(client.request(method, path, content=b'{"a": [1,', **send), 400, "not valid JSON")
        plain = {"headers": {**headers, "content-type": "text/plain"}}
        assert_error(
            client.request(method, path, content=b"{}", **plain), 415, "application/json", "text/plain"
        )
        assert_error(client.request(method, path, content=b"{}", headers=headers), 415, "no Content-Type")
        assert client.get(health).status_code == 200
    return len(routes)
