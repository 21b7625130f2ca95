"""One error hierarchy for client and server (issue 34, item 4): every error class the server
can raise is the wire contract's, and a client that has only the SDK (no server module
loaded) maps its (status, code) back to that very class."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from parrot.wire.errors import (
    BY_CODE,
    BY_STATUS,
    BadRequestError,
    ConflictError,
    EngineUnavailableError,
    NoEngineError,
    NotFoundError,
    ParrotError,
    PayloadTooLargeError,
    ServiceUnavailableError,
    StoreError,
    TemplateError,
    WaitTimeoutError,
    error_for,
)

SERVER_PACKAGES = ("parrot.platform", "parrot.engines", "parrot.web", "parrot.cli")
CLIENT = ("parrot.sdk", "parrot.adapters")


def subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | subclasses(sub)
    return found


@pytest.fixture(scope="module")
def server_errors() -> list[type[ParrotError]]:
    """Every ParrotError class of Parrot's code once all of the server's modules are imported
    (the SDK's own client-side errors, and classes that tests make up, left out)."""
    for name in SERVER_PACKAGES:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            importlib.import_module(module.name)
    found = {ParrotError} | subclasses(ParrotError)
    ours = (c for c in found if c.__module__.startswith("parrot.") and not c.__module__.startswith(CLIENT))
    return sorted(ours, key=lambda c: c.__name__)


def mapping_problems(classes: list[type[ParrotError]], mapped: dict[str, str]) -> list[str]:
    """What is wrong with how a client maps these classes' answers (``mapped``: each class's
    name -> the module and name of the class the client raised for its status and code)."""
    problems = []
    for cls in classes:
        module, name = mapped[cls.__name__].rsplit(".", 1)
        got = getattr(importlib.import_module(module), name)
        if not module.startswith("parrot.wire"):
            problems.append(f"{cls.__name__}: the client raised {module}.{name}, not a wire class")
        elif not issubclass(cls, got) or got.code != cls.code or got.status_code != cls.status_code:
            problems.append(f"{cls.__name__} ({cls.status_code}, {cls.code}) comes back as {name}")
    return problems


MAP_IN_A_CLIENT = """
import json, sys
from parrot.sdk import errors  # what an application imports: the SDK, nothing of the server
answers = json.loads(sys.argv[1])
server = [m for m in sys.modules if m.startswith(("parrot.platform", "parrot.engines", "parrot.web"))]
mapped = {}
for name, (status, code) in answers.items():
    error = errors.error_for(status, code, "a message")
    assert (error.status, error.code, error.message) == (status, code, "a message")
    mapped[name] = f"{type(error).__module__}.{type(error).__name__}"
print(json.dumps({"mapped": mapped, "server_modules": server}))
"""


def map_in_a_client(classes: list[type[ParrotError]]) -> dict[str, str]:
    answers = json.dumps({c.__name__: (c.status_code, c.code) for c in classes})
    out = subprocess.run(
        [sys.executable, "-c", MAP_IN_A_CLIENT, answers],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result = json.loads(out.stdout)
    assert result["server_modules"] == []
    return result["mapped"]


def test_every_server_error_comes_back_to_an_sdk_client_as_its_own_class(server_errors):
    assert len(server_errors) >= 35
    assert {c.__module__ for c in server_errors} == {"parrot.wire.errors"}  # none defined twice
    assert mapping_problems(server_errors, map_in_a_client(server_errors)) == []


def test_a_server_class_with_a_code_of_its_own_is_found():
    """The check above can fail: a server-side subclass that makes up a code (or a status)
    is answered as its wire base, which is not the class the server raised."""

    class MadeUpError(BadRequestError):
        code = "made_up"

    class MovedError(NotFoundError):
        status_code = 410

    made_up = [MadeUpError, MovedError]
    mapped = {cls.__name__: _qualified(type(error_for(cls.status_code, cls.code, "m"))) for cls in made_up}
    assert mapping_problems(made_up, mapped) == [
        "MadeUpError (400, made_up) comes back as BadRequestError",
        "MovedError (410, not_found) comes back as ParrotError",
    ]


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__name__}"


def test_a_subclass_answers_its_base_status_and_each_status_has_one_base():
    for cls in BY_CODE.values():
        base = cls.__mro__[1]
        if base is not ParrotError and issubclass(base, ParrotError) and "status_code" not in vars(cls):
            assert cls.status_code == base.status_code
        assert issubclass(cls, BY_STATUS[cls.status_code]), cls
    assert BY_STATUS[413] is PayloadTooLargeError and not issubclass(PayloadTooLargeError, BadRequestError)
    assert issubclass(NoEngineError, EngineUnavailableError)
    assert issubclass(StoreError, ServiceUnavailableError)
    assert not issubclass(StoreError, EngineUnavailableError)


@pytest.mark.parametrize(
    ("status", "code", "kind", "kept_code"),
    [
        (400, "bad_template", TemplateError, "bad_template"),
        (409, "bad_template", ConflictError, "bad_template"),  # a code at another status: the status wins
        (404, "no_such_code", NotFoundError, "no_such_code"),  # a newer server's code: its status's class
        (422, None, BadRequestError, "bad_request"),
        (503, "store_unavailable", StoreError, "store_unavailable"),
        (503, None, ServiceUnavailableError, "service_unavailable"),
        (418, "teapot", ParrotError, "teapot"),  # a status no class has
        (408, "timeout", WaitTimeoutError, "timeout"),
    ],
)
def test_error_for_answers_that_do_not_fit_the_hierarchy(status, code, kind, kept_code):
    error = error_for(status, code, "the message")
    assert type(error) is kind
    assert (error.status, error.status_code, error.code) == (status, status, kept_code)
    assert str(error) == error.message == "the message"


def test_an_error_raised_here_has_no_status_and_its_class_code():
    error = TemplateError("unclosed placeholder", 3)
    assert (error.status, error.status_code, error.code) == (None, 400, "bad_template")
    assert str(error) == error.message == "unclosed placeholder (at character 3)" and error.position == 3
    assert isinstance(WaitTimeoutError("late"), TimeoutError)
    error = ParrotError("plain", status=502, code="upstream")
    assert (error.status, error.status_code, error.code) == (502, 502, "upstream")
    assert (ParrotError.status_code, ParrotError.code) == (500, "internal_error")  # the class is untouched
