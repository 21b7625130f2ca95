"""The OpenAPI schemas (``/schema``) of the ServeCore and of the builtin engine document the
error statuses each route gives, with the one error body Parrot really sends (issue 14,
item 7); the fuzz suite (``tests/fuzz``) checks real answers against them."""

from __future__ import annotations

import httpx
import pytest

ERROR = "#/components/schemas/ErrorResponse"

SERVECORE_ROUTES = {
    ("post", "/v1/session"): {429, 503},
    ("get", "/v1/session/{session_id}"): {401, 403, 404},
    ("delete", "/v1/session/{session_id}"): {401, 403, 404, 503},
    ("post", "/v1/semantic_var"): {400, 401, 403, 404, 413, 415, 429, 503},
    ("put", "/v1/semantic_var/{var_id}"): {400, 401, 403, 404, 413, 415, 503},
    ("get", "/v1/semantic_var/{var_id}"): {400, 401, 403, 404, 408, 424},
    ("post", "/v1/semantic_call"): {400, 401, 403, 404, 409, 413, 415, 429, 503},
    ("post", "/v1/semantic_transform"): {400, 401, 403, 404, 409, 413, 415, 429, 503},
    ("get", "/v1/semantic_call/{call_id}"): {400, 401, 403, 404},
    ("post", "/v1/engines"): {400, 401, 403, 409, 413, 415},
    ("delete", "/v1/engines/{engine_id}"): {401, 403, 404},
    ("get", "/v1/engines/{engine_id}/contexts"): {401, 403, 404},
    ("post", "/v1/completions"): {400, 401, 403, 404, 413, 415, 429, 503},
    ("post", "/v1/chat/completions"): {400, 401, 403, 404, 413, 415, 429, 503},
    ("get", "/v1/models"): {401, 403},
    ("post", "/v1/render_chat"): {400, 404, 413, 415},
    ("get", "/v1/session/{session_id}/usage"): {401, 403, 404},
}

ENGINE_ROUTES = {
    ("post", "/fill"): {400, 404, 409, 413, 415, 503},
    ("post", "/generate"): {400, 404, 409, 413, 415, 503},
    ("post", "/generate_stream"): {400, 404, 409, 413, 415, 503},
    ("post", "/free_context"): {400, 413, 415},
    ("post", "/abort"): {400, 413, 415},
    ("post", "/tokenize"): {400, 413, 415},
    ("post", "/render_chat"): {400, 413, 415},
    ("get", "/tokenizer"): {404},
    ("post", "/v1/completions"): {400, 413, 415},
    ("post", "/v1/chat/completions"): {400, 413, 415},
}


def assert_documented(schema: dict, expected: dict[tuple[str, str], set[int]]) -> None:
    component = schema["components"]["schemas"]
    body = component["ErrorResponse"]
    assert body["required"] == ["error"], body
    error = component[body["properties"]["error"]["$ref"].rsplit("/", 1)[1]]
    assert set(error["required"]) == {"code", "message"}, error
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            for status, response in responses.items():
                if int(status) >= 400:  # the body Parrot sends, not Litestar's default one
                    ref = response["content"]["application/json"]["schema"].get("$ref")
                    assert ref == ERROR, (method, path, status, response)
            if "application/json" in operation.get("requestBody", {}).get("content", {}):
                assert {"400", "413", "415"} <= set(responses), (method, path, sorted(responses))
    for (method, path), statuses in expected.items():
        documented = {int(s) for s in schema["paths"][path][method]["responses"]}
        assert statuses <= documented, (method, path, sorted(statuses - documented))


@pytest.fixture
def api(parrot_url):
    with httpx.Client(base_url=parrot_url, timeout=60) as client:
        yield client


def test_the_servecore_schema_documents_its_errors(api):
    assert_documented(api.get("/schema/openapi.json").json(), SERVECORE_ROUTES)


def test_the_engine_schema_documents_its_errors(client):
    assert_documented(client.get("/schema/openapi.json").json(), ENGINE_ROUTES)
