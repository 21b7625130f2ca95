"""``Input`` and ``Output``: what a placeholder of a call is bound to.

They annotate a semantic function's parameters (``question: Input``,
``answer: Output(max_tokens=32)``) and are the values of a raw ``Session.submit``'s
``outputs``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import msgspec

from parrot.sdk.errors import DefinitionError
from parrot.wire.sampling import SamplingParams

if TYPE_CHECKING:
    from parrot.sdk.handles import VarBase


class Input:
    """Marks a parameter as an input placeholder: its argument is a Var (sent by id, so the
    call depends on that variable's producer) or a str (sent as the value)."""


@dataclass(frozen=True, init=False)
class Output:
    """An output placeholder and how to generate it: any :class:`SamplingParams` field
    (``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ...).

    Only the fields given are sent; the server's defaults apply to the others. Wrong names
    or values raise :class:`DefinitionError` at once.
    """

    sampling: Mapping[str, Any] = field(default_factory=dict)
    target: VarBase | None = None  # an existing variable to generate into

    def __init__(self, **sampling: Any) -> None:
        try:
            msgspec.convert(sampling, SamplingParams)
        except msgspec.ValidationError as error:
            raise DefinitionError(f"Output({_args(sampling)}): {error}") from None
        object.__setattr__(self, "sampling", MappingProxyType(dict(sampling)))
        object.__setattr__(self, "target", None)

    def into(self, var: VarBase) -> Output:
        """The same output, generated into ``var`` (made with ``session.var(name)``)."""
        bound = Output(**self.sampling)
        object.__setattr__(bound, "target", var)
        return bound

    def __repr__(self) -> str:
        into = f".into({self.target!r})" if self.target is not None else ""
        return f"Output({_args(self.sampling)}){into}"


def _args(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
