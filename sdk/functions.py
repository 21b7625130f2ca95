"""Semantic functions: a Python function whose docstring is a prompt template.

    @semantic_function(models=["SmolLM2-135M-Instruct.Q4_1"])
    def answer(style, question: Input, reply: Output(max_tokens=32)):
        '''Answer {{style}}. Q: {{question}} A: {{reply}}'''

- ``Input`` parameters are input placeholders: pass a Var (the call then depends on that
  variable's producer, on the server) or a str.
- ``Output(...)`` parameters are output placeholders, generated with those sampling
  settings. The caller does not pass them (or passes a Var made with ``session.var(name)``
  to generate into it).
- An ``Input`` placeholder may read a field of a JSON-typed variable (an output made with
  ``Output(schema=...)``): ``{{plan.steps[0]}}`` is filled on the server with that field
  of ``plan``'s value once it is generated, with no wait on the client.
- Other parameters are rendered with ``str()`` into the prompt text before it is sent, so
  a system prompt given that way is constant text the server shares across sessions. A
  value with a brace in it is sent as an input value instead, so it can never form a
  placeholder; the model reads the same text.

Calling the function submits the call and returns its output Var at once (a tuple of them
in declaration order when there are several); nothing waits until a ``get``. It runs in
``session=`` or else in the session of the enclosing ``with client.session()`` block.
With an :class:`AsyncSession`, use ``await func.asubmit(...)`` instead of calling it.

Definition errors (a placeholder without a parameter, a parameter without a placeholder,
two adjacent outputs, no docstring, a return annotation, ...) raise
:class:`DefinitionError` when the function is decorated.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from parrot.sdk.aclient import AsyncSession, AsyncVar
from parrot.sdk.client import Session, Var
from parrot.sdk.errors import DefinitionError, TemplateError
from parrot.sdk.handles import Call, SessionBase, VarBase, current_session
from parrot.sdk.params import Input, Output
from parrot.wire.template import (
    Chunk,
    ParameterSpec,
    PlaceholderChunk,
    TextChunk,
    check_binding,
    parse_template,
)

RESERVED = ("session", "models", "output_criteria")


@dataclass(frozen=True)
class _Param:
    name: str
    output: Output | None  # None: an input or a text parameter
    is_input: bool = False


def _param(parameter: inspect.Parameter) -> _Param:
    annotation = parameter.annotation
    if annotation is Output:
        return _Param(parameter.name, Output())
    if isinstance(annotation, Output):
        return _Param(parameter.name, annotation)
    return _Param(parameter.name, None, is_input=annotation is Input or isinstance(annotation, Input))


def _check(template: str, params: Sequence[_Param]) -> list[Chunk]:
    """Parse ``template`` and bind it to ``params`` with the server's own rules."""
    chunks = parse_template(template)
    check_binding(chunks, [ParameterSpec(p.name, p.output is not None) for p in params])
    return chunks


def _check_fields(where: str, chunks: Sequence[Chunk], params: dict[str, _Param]) -> None:
    """A placeholder that reads a field (``{{plan.steps[0]}}``) must be an input's: its
    argument is a JSON-typed Var. (An output's is refused by the template rules.)"""
    for chunk in chunks:
        if isinstance(chunk, PlaceholderChunk) and chunk.path and not params[chunk.name].is_input:
            raise DefinitionError(
                f"{where}: {{{{{chunk.ref}}}}} reads a field of {chunk.name!r}: annotate {chunk.name!r} "
                "with Input and pass it a JSON-typed Var (an Output(schema=...) of an earlier call)"
            )


class SemanticFunction:
    """A function decorated with :func:`semantic_function` (see the module's docstring)."""

    def __init__(
        self, func: Callable, models: Sequence[str] = (), output_criteria: str | None = None
    ) -> None:
        functools.update_wrapper(self, func)
        self.models = tuple(models)
        self.output_criteria = output_criteria
        where = f"semantic function {func.__qualname__!r}"
        if not func.__doc__ or not func.__doc__.strip():
            raise DefinitionError(f"{where} has no docstring: the docstring is its prompt template")
        self.template = inspect.cleandoc(func.__doc__)
        try:
            signature = inspect.signature(func, eval_str=True)
        except (NameError, AttributeError, SyntaxError) as error:
            raise DefinitionError(
                f"{where}: an annotation cannot be evaluated ({error}); Output(...) may use "
                "module-level names only"
            ) from None
        if signature.return_annotation is not inspect.Signature.empty:
            raise DefinitionError(f"{where} has a return annotation: it returns its output Vars")
        for p in signature.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise DefinitionError(f"{where}: *{p.name} and **{p.name} cannot be placeholders")
            if p.name in RESERVED:
                raise DefinitionError(
                    f"{where}: parameter name {p.name!r} is reserved ({', '.join(RESERVED)})"
                )
        self._params = {p.name: _param(p) for p in signature.parameters.values()}
        self._outputs = [p.name for p in self._params.values() if p.output is not None]
        if not self._outputs:
            raise DefinitionError(f"{where} has no Output parameter: nothing to generate")
        try:
            self._chunks = _check(self.template, list(self._params.values()))
        except TemplateError as error:
            raise DefinitionError(f"{where}: {error}") from None
        _check_fields(where, self._chunks, self._params)
        callable_params = [
            p.replace(annotation=inspect.Parameter.empty)
            for p in signature.parameters.values()
            if p.name not in self._outputs
        ]
        callable_params += [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None) for name in self._outputs
        ]
        self._call_signature = inspect.Signature(callable_params)

    def __call__(
        self,
        *args: Any,
        session: Session | None = None,
        models: Sequence[str] | None = None,
        output_criteria: str | None = None,
        **kwargs: Any,
    ) -> Var | tuple[Var, ...]:
        """Submit the call in a sync :class:`Session`; returns its output Var(s) at once."""
        target = self._session(session, Session, "call it with `await f.asubmit(...)`")
        call = target.submit(*self._prepare(args, kwargs), **self._options(models, output_criteria))
        return self._results(call)

    async def asubmit(
        self,
        *args: Any,
        session: AsyncSession | None = None,
        models: Sequence[str] | None = None,
        output_criteria: str | None = None,
        **kwargs: Any,
    ) -> AsyncVar | tuple[AsyncVar, ...]:
        """Submit the call in an :class:`AsyncSession`; returns its output AsyncVar(s)."""
        target = self._session(session, AsyncSession, "call it as `f(...)`, without asubmit")
        call = await target.submit(*self._prepare(args, kwargs), **self._options(models, output_criteria))
        return self._results(call)

    def _session(self, given: SessionBase | None, kind: type, hint: str) -> Any:
        found = given or current_session()
        if found is None:
            raise RuntimeError(
                f"{self.__name__}() has no session: call it inside `with client.session():` or pass session="
            )
        if not isinstance(found, kind):
            raise TypeError(
                f"{self.__name__}(): the current session is of type {type(found).__name__}; {hint}"
            )
        return found

    def _options(self, models: Sequence[str] | None, output_criteria: str | None) -> dict[str, Any]:
        return {
            "models": self.models if models is None else tuple(models),
            "output_criteria": output_criteria or self.output_criteria,
        }

    def _prepare(self, args: tuple, kwargs: dict) -> tuple[str, dict, dict]:
        """The template as sent (text parameters rendered in), its inputs and outputs."""
        try:
            bound = self._call_signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{self.__name__}(): {error}") from None
        bound.apply_defaults()
        arguments = bound.arguments
        pieces, inputs, outputs = [], {}, {}
        for chunk in self._chunks:
            if isinstance(chunk, TextChunk):
                pieces.append(chunk.text)
                continue
            param, value = self._params[chunk.name], arguments[chunk.name]
            if param.output is None and not param.is_input:
                if isinstance(value, VarBase):
                    raise TypeError(f"{self.__name__}(): annotate {chunk.name!r} with Input to pass a Var")
                text = str(value)
                if "{" not in text and "}" not in text:
                    pieces.append(text)
                    continue
                inputs[chunk.name] = text  # sent as a value: braces in it stay text
            pieces.append("{{" + chunk.ref + "}}")  # with its field path
        for name, param in self._params.items():
            value = arguments[name]
            if param.is_input:
                inputs[name] = value
            elif param.output is not None:
                outputs[name] = _output(name, param.output, value)
        template = "".join(pieces)
        self._check_rendered(template, inputs, outputs)
        return template, inputs, outputs

    def _check_rendered(self, template: str, inputs: dict, outputs: dict) -> None:
        """A text argument can still leave an output with no text before it (an empty
        string): say so before sending, in the server's words."""
        params = [_Param(n, None) for n in inputs] + [_Param(n, o) for n, o in outputs.items()]
        try:
            _check(template, params)
        except TemplateError as error:
            raise TemplateError(f"{self.__name__}(): the rendered template is wrong: {error}") from None

    def _results(self, call: Call) -> Any:
        found = tuple(call.outputs[name] for name in self._outputs)
        return found[0] if len(found) == 1 else found

    def __repr__(self) -> str:
        return f"<semantic function {self.__qualname__}>"


def _output(name: str, declared: Output, value: Any) -> Output:
    """An output argument: nothing (as declared), an Output (other sampling for this call)
    or a Var made with ``session.var`` (generate into it)."""
    if value is None:
        return declared
    if isinstance(value, Output):
        return value
    if isinstance(value, VarBase):
        return declared.into(value)
    raise TypeError(f"output {name!r} takes a Var, an Output or nothing, not {type(value).__name__}")


def semantic_function(
    func: Callable | None = None, *, models: Sequence[str] = (), output_criteria: str | None = None
) -> Any:
    """Decorate a function whose docstring is a prompt template (see the module docstring).

    ``models``: run only on engines serving one of these models (default: any).
    ``output_criteria``: ``"latency"`` or ``"throughput"`` for its outputs at submission.
    Both can be overridden per call. Usable as ``@semantic_function`` or with arguments.
    """
    if func is not None:
        return SemanticFunction(func, models, output_criteria)
    return lambda f: SemanticFunction(f, models, output_criteria)
