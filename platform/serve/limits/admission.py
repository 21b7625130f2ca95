"""Admission: the ServeCore's :class:`Limits` checked before anything is created.

Counts are kept here (sessions per client address, calls not finished yet, and in
:attr:`Admission.budget` the bytes of values held) so a check is a dictionary lookup, not a
scan of every session. A check and the count it guards change in
the same step of the event loop (no ``await`` between them), so concurrent requests cannot
both slip under a limit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from parrot.engines.protocol import text
from parrot.engines.protocol.errors import BadRequestError, PayloadTooLargeError, TooManyRequestsError
from parrot.platform.serve.limits.settings import Limits, describe
from parrot.platform.serve.limits.value_budget import ValueBudget

if TYPE_CHECKING:
    from parrot.platform.serve.calls.graph import RequestChain


class Admission:
    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._clients: dict[str, set[str]] = {}  # client address -> its live session ids
        self._client_of: dict[str, str] = {}  # session id -> client address
        self._pending: dict[str, RequestChain] = {}  # call id -> call not finished yet
        self.budget = ValueBudget(self.limits)  # the bytes of values, per session and client

    # -- sizes (413), and text that can be stored (400) ------------------------------------
    def check_value(self, value: str | None, what: str) -> None:
        limit = self.limits.max_value_chars
        if value is not None and len(value) > limit:
            raise PayloadTooLargeError(
                f"{what} has {len(value)} characters, over the limit {describe('max_value_chars', limit)}"
            )
        self.check_text(value, what)

    @staticmethod
    def check_text(value: str | None, what: str) -> None:
        """400 for text no store keeps (a NUL; a lone surrogate, which JSON bodies cannot bring)."""
        why = None if value is None else text.problem(value)
        if why is not None:
            raise BadRequestError(f"{what} is not valid text: {why}")

    def check_prompt(self, chars: int, what: str) -> None:
        limit = self.limits.max_prompt_chars
        if chars > limit:
            raise PayloadTooLargeError(
                f"{what} has {chars} characters, over the limit {describe('max_prompt_chars', limit)}"
            )

    def check_placeholders(self, template: str, what: str) -> None:
        """413 before parsing a template with more ``{{`` than ``max_placeholders`` (a count
        in C: a template at the size limit is counted in milliseconds)."""
        count, limit = template.count("{{"), self.limits.max_placeholders
        if count > limit:
            raise PayloadTooLargeError(
                f"{what} has {count} placeholders, over the limit {describe('max_placeholders', limit)}"
            )

    # -- sessions per client (429) -------------------------------------------------------
    def open_session(self, session_id: str, client: str | None) -> None:
        """Count a new session of ``client`` (None: not counted, e.g. a restored session;
        its values count for the server's bound only)."""
        if client is not None:
            live = self.sessions_of(client)
            limit = self.limits.max_sessions_per_client
            if live >= limit:
                raise TooManyRequestsError(
                    f"client {client} has {live} live sessions: the limit is "
                    f"{describe('max_sessions_per_client', limit)}; delete sessions it no longer uses"
                )
            self._clients.setdefault(client, set()).add(session_id)
            self._client_of[session_id] = client
        self.budget.open(session_id, client)

    def close_session(
        self, session_id: str, calls: Iterable[str] = (), variables: Iterable[str] = ()
    ) -> None:
        """A session is gone: it no longer counts for its client, nor do its calls and the
        values of its ``variables`` (ids)."""
        self.budget.close(session_id, variables)
        client = self._client_of.pop(session_id, None)
        if client is not None:
            live = self._clients.get(client, set())
            live.discard(session_id)
            if not live:
                self._clients.pop(client, None)
        for call_id in calls:
            self._pending.pop(call_id, None)

    def sessions_of(self, client: str) -> int:
        return len(self._clients.get(client, ()))

    # -- variables and calls per session, pending calls (429) ----------------------------
    def check_session_growth(
        self, session_id: str, vars_now: int, new_vars: int, calls_now: int, new_calls: int
    ) -> None:
        vars_limit, calls_limit = self.limits.max_vars_per_session, self.limits.max_calls_per_session
        if new_vars and vars_now + new_vars > vars_limit:
            raise TooManyRequestsError(
                f"session {session_id} has {vars_now} variables; {new_vars} more would pass the limit "
                f"{describe('max_vars_per_session', vars_limit)}"
            )
        if new_calls and calls_now + new_calls > calls_limit:
            raise TooManyRequestsError(
                f"session {session_id} has {calls_now} calls: the limit is "
                f"{describe('max_calls_per_session', calls_limit)}"
            )

    def admit_call(self, call: RequestChain) -> None:
        """Count a call as pending, or refuse it when the server has too many."""
        limit = self.limits.max_pending_calls
        if len(self._pending) >= limit:
            self._prune()
        if len(self._pending) >= limit:
            raise TooManyRequestsError(
                f"the server has {len(self._pending)} calls not finished yet: the limit is "
                f"{describe('max_pending_calls', limit)}; try again when some have finished"
            )
        self._pending[call.call_id] = call

    def track_call(self, call: RequestChain) -> None:
        """Count a call without a check (one restored after a restart)."""
        self._pending[call.call_id] = call

    def call_settled(self, call_id: str) -> None:
        self._pending.pop(call_id, None)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _prune(self) -> None:
        # A call settles through the ServeCore's progress hook; this catches one that
        # settled on a path that does not report (so a count never leaks for good).
        for call_id in [c for c, r in self._pending.items() if r.state.settled]:
            del self._pending[call_id]
