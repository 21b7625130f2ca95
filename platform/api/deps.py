"""How a handler gets the ServeCore and its session: Litestar dependencies, declared once
on the app, used by every handler of the API, the OpenAI front and the dashboard.

- ``core``: the app's :class:`ServeCore` (:func:`provide_core`);
- ``sessions``: a :class:`~parrot.platform.api.auth.SessionAccess` bound to the request's
  bearer token (:mod:`parrot.platform.api.auth`).
"""

from __future__ import annotations

from litestar import Request
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide

from parrot.platform.api.auth import SessionAccess, bearer_token
from parrot.platform.serve.core import ServeCore

Core = NamedDependency[ServeCore]  # a handler's ``core`` parameter


def provide_core(state: State) -> ServeCore:
    return state.core


def provide_sessions(request: Request, core: Core) -> SessionAccess:
    return SessionAccess(core, bearer_token(request))


DEPENDENCIES = {
    "core": Provide(provide_core, sync_to_thread=False),
    "sessions": Provide(provide_sessions, sync_to_thread=False),
}
