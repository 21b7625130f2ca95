"""The settings that both Parrot models share: the server, the model, sampling, criteria."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SecretStr, model_validator

from parrot.sdk.config import DEFAULT_TIMEOUT_S, ClientConfig
from parrot.sdk.errors import ParrotError
from parrot.sdk.params import Output
from parrot.sdk.streams import OPENAI_FIELDS
from parrot.wire.bodies import MAX_LABEL_CHARS, MAX_TAG_CHARS, MAX_TAGS

Criteria = Literal["latency", "throughput"]
CRITERIA = ("latency", "throughput")
# The RunnableConfig metadata key that picks the performance criteria of a run.
CRITERIA_KEY = "parrot_criteria"
# Every sampling setting that both semantic calls and streams take.
SAMPLING_FIELDS = OPENAI_FIELDS


class ParrotSettings(BaseModel):
    """Where and how a Parrot model generates.

    Sampling fields left ``None`` take the server's defaults (greedy, 128 tokens).
    ``criteria`` is the performance criteria of the model's gets (``latency``: its calls
    go first; ``throughput``: they may wait to be batched); a run's RunnableConfig
    metadata ``{"parrot_criteria": ...}`` overrides it.
    """

    base_url: str | None = None
    """The Parrot server; default ``$PARROT_SERVER``, else http://127.0.0.1:9000."""
    model: str | None = None
    """The model to run on (one the server's engines serve); default: any."""
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    criteria: Criteria = "latency"
    timeout: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    """Seconds for each response of the server, besides the wait for a generation."""
    wait_timeout: float = Field(default=300.0, gt=0)
    """Seconds to wait for a generation to finish."""
    api_key: SecretStr | None = None
    """A key of the server's OpenAI-compatible routes (streaming), where it requires one."""
    session_label: str | None = Field(default=None, min_length=1, max_length=MAX_LABEL_CHARS)
    """The label of the sessions the model opens (not of an enclosing SDK session's) and of
    the requests it sends to the OpenAI-compatible routes (tools, streaming): the
    dashboard's sessions and requests pages find them by it."""
    session_tags: list[Annotated[str, Field(min_length=1, max_length=MAX_TAG_CHARS)]] = Field(
        default_factory=list, max_length=MAX_TAGS
    )
    """Tags of the sessions the model opens, found by as the label is."""

    @model_validator(mode="after")
    def _check_settings(self) -> ParrotSettings:
        self.sampling()
        self.client_config()
        return self

    def client_config(self) -> ClientConfig:
        return ClientConfig.resolve(self.base_url, self.timeout, None)

    def session_names(self) -> dict[str, Any]:
        """The label and tags of a session the model opens (``client.session(**...)``)."""
        return {"label": self.session_label, "tags": self.session_tags}

    def request_metadata(self) -> dict[str, str] | None:
        """The label and tags as OpenAI's ``metadata``, for the requests the model sends to
        the OpenAI-compatible chat route (tools, streaming), which open no session: the
        dashboard's requests page finds them by it. A tag ``key=value`` is that key, a bare
        tag a key with no value."""
        named = dict(tag.partition("=")[::2] for tag in self.session_tags)
        if self.session_label:
            named["label"] = self.session_label
        return named or None

    def api_key_value(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key else None

    def models(self) -> list[str]:
        return [self.model] if self.model else []

    def sampling(
        self, stop: Sequence[str] | None = None, overrides: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The sampling of one run: the fields, then ``overrides`` (a run's keyword
        arguments), then ``stop`` when given. Raises ValueError for a wrong name or value."""
        overrides = overrides or {}
        unknown = sorted(set(overrides) - set(SAMPLING_FIELDS))
        if unknown:
            raise ValueError(
                f"{type(self).__name__} got unknown arguments {unknown}; the sampling settings are "
                f"{list(SAMPLING_FIELDS)}"
            )
        fields = {name: getattr(self, name) for name in SAMPLING_FIELDS}
        fields.update(overrides)
        if stop is not None:
            fields["stop"] = list(stop)
        fields = {name: value for name, value in fields.items() if value is not None}
        try:
            Output(**fields)
        except ParrotError as error:
            raise ValueError(f"{type(self).__name__}: {error}") from None
        return fields

    def criteria_for(self, metadata: Mapping[str, Any] | None) -> str:
        """The criteria asked for in a run's metadata, else the model's."""
        asked = (metadata or {}).get(CRITERIA_KEY, self.criteria)
        if asked not in CRITERIA:
            raise ValueError(f"metadata {CRITERIA_KEY!r} must be one of {CRITERIA}, got {asked!r}")
        return asked

    def identifying_params(self) -> dict[str, Any]:
        params = {"base_url": self.client_config().base_url, "model": self.model}
        return params | {name: getattr(self, name) for name in SAMPLING_FIELDS}
