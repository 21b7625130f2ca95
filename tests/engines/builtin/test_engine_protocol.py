"""``BuiltinEngine`` is an ``Engine`` (the protocol the ServeCore holds its engines by): the
same methods with the same parameters, so it can stand in-process where ``HttpEngine``
reaches a remote one. Checked on the signatures, without starting an engine."""

from __future__ import annotations

import inspect

from parrot.engines.builtin.engine import BuiltinEngine
from parrot.platform.serve.engines.client import Engine


def protocol_methods() -> dict[str, object]:
    return {
        name: member for name, member in vars(Engine).items() if inspect.isfunction(member) and name[0] != "_"
    }


def shape(fn) -> list[tuple[str, object, object]]:
    """Parameters as (name, kind, default), without ``self``."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    return [(p.name, p.kind, p.default) for p in params]


def test_the_protocol_has_the_engine_api():
    assert set(protocol_methods()) >= {"fill", "generate", "generate_stream", "free_context", "abort", "ping"}


def test_builtin_engine_has_every_protocol_method_with_the_same_parameters():
    for name, member in protocol_methods().items():
        ours = getattr(BuiltinEngine, name, None)
        assert ours is not None, f"BuiltinEngine has no {name}"
        assert shape(ours) == shape(member), name


def test_builtin_engine_is_async_where_the_protocol_is():
    for name, member in protocol_methods().items():
        ours = getattr(BuiltinEngine, name)
        if inspect.iscoroutinefunction(member):
            assert inspect.iscoroutinefunction(ours), name
        else:  # generate_stream: called without await, iterated with ``async for``
            assert inspect.isasyncgenfunction(ours), name
