"""``Input`` and ``Output``: what a placeholder of a call is bound to.

They annotate a semantic function's parameters (``question: Input``,
``answer: Output(max_tokens=32)``, ``plan: Output(schema=Plan)``) and are the values of a
raw ``Session.submit``'s ``outputs``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import msgspec

from parrot.sdk.errors import DefinitionError
from parrot.sdk.formats import ValueType, value_type
from parrot.wire.bodies import CallParameter
from parrot.wire.formats import OutputFormat
from parrot.wire.sampling import SamplingParams

if TYPE_CHECKING:
    from parrot.sdk.handles import VarBase


class Input:
    """Marks a parameter as an input placeholder: its argument is a Var (sent by id, so the
    call depends on that variable's producer) or a str (sent as the value)."""


@dataclass(frozen=True, init=False)
class Output:
    """An output placeholder, what its value must be, and how to generate it.

    The format (at most one): ``schema=`` a pydantic model class or a JSON schema dict (the
    value is JSON of that schema; ``var.get()`` returns the model instance, or the parsed
    dict), ``json_object=True`` (any JSON object; ``get()`` returns the dict), ``regex=``
    (the whole value matches it), ``choice=[...]`` (the value is one of these strings),
    ``grammar=`` (a Lark grammar), or ``format=`` an :class:`OutputFormat` (or its dict).
    The server constrains the generation to it and checks the value.

    Sampling: any other :class:`SamplingParams` field (``max_tokens``, ``temperature``,
    ``top_p``, ``top_k``, ``seed``, ``stop``, ...); the others keep :class:`SamplingParams`'
    defaults (the server's: it decodes the same type). Wrong names or values, or two formats
    at once, raise :class:`DefinitionError` at once.
    """

    sampling: Mapping[str, Any] = field(default_factory=dict)
    target: VarBase | None = None  # an existing variable to generate into
    value_type: ValueType | None = None

    def __init__(
        self,
        *,
        schema: Any = None,
        json_object: bool = False,
        regex: str | None = None,
        choice: Sequence[str] | None = None,
        grammar: str | None = None,
        format: OutputFormat | Mapping[str, Any] | None = None,
        **sampling: Any,
    ) -> None:
        given = {"schema": schema, "json_object": json_object, "regex": regex, "choice": choice}
        typed = value_type(given | {"grammar": grammar, "format": format})
        try:
            msgspec.convert(sampling, SamplingParams)
        except msgspec.ValidationError as error:
            raise DefinitionError(f"Output({_args(sampling)}): {error}") from None
        object.__setattr__(self, "sampling", MappingProxyType(dict(sampling)))
        object.__setattr__(self, "target", None)
        object.__setattr__(self, "value_type", typed)

    @property
    def format(self) -> OutputFormat | None:
        """The format the value must have (None: free text)."""
        return None if self.value_type is None else self.value_type.format

    def into(self, var: VarBase) -> Output:
        """The same output, generated into ``var`` (made with ``session.var(name)``)."""
        bound = copy.copy(self)
        object.__setattr__(bound, "target", var)
        return bound

    def parameter(self, name: str) -> CallParameter:
        """This output as an entry of the API's ``parameters`` list."""
        sampling = msgspec.convert(dict(self.sampling), SamplingParams) if self.sampling else None
        var_id = None if self.target is None else self.target.var_id
        return CallParameter(name=name, is_output=True, var_id=var_id, sampling=sampling, format=self.format)

    def __repr__(self) -> str:
        into = f".into({self.target!r})" if self.target is not None else ""
        typed = self._format_arg()
        return f"Output({', '.join(a for a in (typed, _args(self.sampling)) if a)}){into}"

    def _format_arg(self) -> str:
        if self.value_type is None:
            return ""
        if self.value_type.model is not None:
            return f"schema={self.value_type.model.__name__}"
        kind = self.format.kind
        value = getattr(self.format, kind)
        return f"{'schema' if kind == 'json_schema' else kind}={value!r}"


def _args(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
