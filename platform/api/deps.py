"""How a handler gets the ServeCore and its session: Litestar dependencies, declared once
on the app, used by every handler of the API, the OpenAI front and the dashboard.

- ``core``: the app's :class:`ServeCore` (:func:`provide_core`);
- ``sessions``: a :class:`~parrot.platform.api.auth.SessionAccess` bound to the request's
  bearer token (:mod:`parrot.platform.api.auth`).
"""

from __future__ import annotations

from litestar.datastructures import State
from litestar.di import Provide

from parrot.platform.api.auth import provide_sessions
from parrot.platform.serve.core import ServeCore


def provide_core(state: State) -> ServeCore:
    return state.core


DEPENDENCIES = {
    "core": Provide(provide_core, sync_to_thread=False),
    "sessions": Provide(provide_sessions, sync_to_thread=False),
}
