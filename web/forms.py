"""The engine registration form: its fields, checked into an ``EngineSpec`` or errors by field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from parrot.engines.protocol.urls import INVALID, has_secrets, public_url
from parrot.platform.serve.engines.registry import BUILTIN, OPENAI, EngineSpec

FIELDS = ("kind", "url", "base_url", "model", "api", "capacity")  # shown again (never api_key)
MAX_URL, MAX_MODEL, MAX_KEY, MAX_CAPACITY = 2048, 256, 4096, 4096


@dataclass(frozen=True)
class EngineForm:
    values: dict[str, str] = field(default_factory=lambda: {"kind": BUILTIN, "api": "chat"})
    errors: dict[str, str] = field(default_factory=dict)  # field -> message
    spec: EngineSpec | None = None

    def with_error(self, name: str, message: str) -> EngineForm:
        return EngineForm(self.values, {**self.errors, name: message}, None)


def _url_error(value: str) -> str | None:
    if not value:
        return "required"
    if len(value) > MAX_URL:
        return f"at most {MAX_URL} characters"
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "a URL such as http://127.0.0.1:9001"
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        return "the port is not a number from 0 to 65535"
    return None


def _shown(url: str) -> str:
    """A URL field as the page may show it again: credentials and query never come back
    (like the API key, they are typed again)."""
    if not url or not has_secrets(url):
        return url
    shown = public_url(url)
    return "" if shown == INVALID else shown


def parse(form: Mapping[str, str]) -> EngineForm:
    """Check the submitted fields; ``spec`` is set only when there is no error."""
    values = {name: str(form.get(name, "")).strip() for name in FIELDS}
    values["api"] = values["api"] or "chat"
    key = str(form.get("api_key", ""))
    errors: dict[str, str] = {}
    kind = values["kind"]
    if kind not in (BUILTIN, OPENAI):
        errors["kind"] = f"choose {BUILTIN!r} or {OPENAI!r}"
    capacity = None
    if values["capacity"]:
        try:
            capacity = int(values["capacity"])
        except ValueError:
            capacity = 0
        if not 1 <= capacity <= MAX_CAPACITY:
            errors["capacity"] = f"a whole number from 1 to {MAX_CAPACITY}, or empty"
    if kind == BUILTIN:
        if problem := _url_error(values["url"]):
            errors["url"] = problem
    elif kind == OPENAI:
        if problem := _url_error(values["base_url"]):
            errors["base_url"] = problem
        if not values["model"]:
            errors["model"] = "required: the model name the endpoint serves"
        elif len(values["model"]) > MAX_MODEL:
            errors["model"] = f"at most {MAX_MODEL} characters"
        if values["api"] not in ("chat", "completions"):
            errors["api"] = "choose 'chat' or 'completions'"
        if len(key) > MAX_KEY:
            errors["api_key"] = f"at most {MAX_KEY} characters"
    shown = {**values, "url": _shown(values["url"]), "base_url": _shown(values["base_url"])}
    if errors:
        return EngineForm(shown, errors)
    if kind == BUILTIN:
        spec = EngineSpec(BUILTIN, values["url"], capacity)
    else:
        spec = EngineSpec(OPENAI, values["base_url"], capacity, values["model"], values["api"], key or None)
    return EngineForm(shown, {}, spec)


def target_field(form: EngineForm) -> str:
    """The field an error of the registration itself (unreachable, already there) belongs to."""
    return "base_url" if form.values.get("kind") == OPENAI else "url"
