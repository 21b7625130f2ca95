"""The memory that variable values hold: a bound for the whole server, a share per client.

One value is bounded by ``max_value_chars``; this bounds them together, so clients cannot
fill the ServeCore's memory with many of them (24 values of 8 Mi characters took it from
448 to 640 MiB). A value is charged the memory of its text (``sys.getsizeof``: 1 byte a
character of ASCII or Latin-1 text, 2 or 4 for wider characters) to the session that holds
it, and through the session to the client address that created it: a client set or an
inline value is refused before anything is stored (429 past the client's share,
``max_value_bytes_per_client``; 507 past the server's bound, ``max_value_bytes``), and a
generated value over budget fails its variable with the same reason instead of being kept.
When the session goes (deleted, expired) or a variable is undone, its bytes are given back,
and the time of a big release is noted for the :class:`~parrot.platform.serve.ops.memory.MemoryTrimmer`.

Sessions restored after a restart count for no client (their address is not stored), as in
the sessions-per-client count; their values count for the server's bound.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

from parrot.engines.protocol.errors import TooManyRequestsError
from parrot.platform.serve.errors import InsufficientStorageError
from parrot.platform.serve.limits.settings import Limits, MiB, describe

BIG_RELEASE = 16 * MiB  # freeing this much (at once, or since the last time) is worth a malloc_trim


def value_bytes(value: str) -> int:
    """The memory a value's text takes."""
    return sys.getsizeof(value)


@dataclass(eq=False)
class _Account:
    """The values of one session."""

    client: str | None
    bytes: int = 0


@dataclass(eq=False)
class _Holding:
    account: _Account
    bytes: int | None = None  # None: no value charged yet


class ValueBudget:
    """The bytes of values held: per session, per client address, and in all (``held``)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.held = 0  # bytes of every value charged
        self.big_at: float | None = None  # time.monotonic() of the last big release
        self._freed = 0  # bytes released since the last big release
        self._sessions: dict[str, _Account] = {}
        self._vars: dict[str, _Holding] = {}  # var id -> the account it is charged to
        self._clients: dict[str, int] = {}  # client address -> bytes of its sessions' values

    def of_client(self, client: str) -> int:
        return self._clients.get(client, 0)

    def of_session(self, session_id: str) -> int:
        account = self._sessions.get(session_id)
        return 0 if account is None else account.bytes

    # -- sessions ------------------------------------------------------------------------
    def open(self, session_id: str, client: str | None) -> None:
        self._sessions.setdefault(session_id, _Account(client))

    def close(self, session_id: str, var_ids: Iterable[str]) -> int:
        """The session is gone: its values' bytes are given back (how many)."""
        account = self._sessions.pop(session_id, None)
        for var_id in var_ids:
            self._vars.pop(var_id, None)
        if account is None:
            return 0
        freed = account.bytes
        self._move(account, -freed)
        return self._released(freed)

    # -- values --------------------------------------------------------------------------
    def join(self, session_id: str, var_id: str) -> None:
        """A variable of the session, charged once it holds a value."""
        account = self._sessions.get(session_id)
        if account is not None:
            self._vars.setdefault(var_id, _Holding(account))

    def take(self, session_id: str, values: Iterable[tuple[str, str | None]]) -> list[str]:
        """Charge ``(var id, value)`` pairs to the session, all or none (raises 429 / 507
        naming the limit); the ids newly charged (give them back if what follows fails)."""
        account = self._sessions.get(session_id)
        if account is None:
            return []
        new = {}
        for var_id, value in values:
            holding = self._vars.get(var_id)
            if value is not None and (holding is None or holding.bytes is None):
                new[var_id] = value_bytes(value)
        more = sum(new.values())
        self._check(account, more, f"{len(new)} value(s) of session {session_id} ({more} bytes)")
        for var_id, size in new.items():
            holding = self._vars.setdefault(var_id, _Holding(account))
            holding.bytes = size
        self._move(account, more)
        return list(new)

    def admit(self, var_id: str, value: str) -> str | None:
        """A generated value: charged, or why it may not be kept (None: charged)."""
        holding = self._vars.get(var_id)
        if holding is None or holding.bytes is not None:
            return None
        size = value_bytes(value)
        try:
            self._check(holding.account, size, f"the value generated ({size} bytes)")
        except (TooManyRequestsError, InsufficientStorageError) as error:
            return str(error)
        holding.bytes = size
        self._move(holding.account, size)
        return None

    def give_back(self, var_ids: Iterable[str]) -> None:
        """Undo variables (their store write failed, or their call was refused)."""
        freed = 0
        for var_id in var_ids:
            holding = self._vars.pop(var_id, None)
            if holding is not None and holding.bytes is not None:
                self._move(holding.account, -holding.bytes)
                freed += holding.bytes
        self._released(freed)

    def uncharge(self, var_ids: Iterable[str]) -> None:
        """Undo :meth:`take` for variables that stay (a set the store refused)."""
        freed = 0
        for var_id in var_ids:
            holding = self._vars.get(var_id)
            if holding is not None and holding.bytes is not None:
                self._move(holding.account, -holding.bytes)
                freed, holding.bytes = freed + holding.bytes, None
        self._released(freed)

    def restore(self, session_id: str, var_id: str, value: str | None) -> None:
        """A variable restored after a restart, charged without a check (it was admitted)."""
        self.join(session_id, var_id)
        holding = self._vars.get(var_id)
        if holding is not None and value is not None and holding.bytes is None:
            holding.bytes = value_bytes(value)
            self._move(holding.account, holding.bytes)

    # -- the checks ----------------------------------------------------------------------
    def _check(self, account: _Account, more: int, what: str) -> None:
        if not more:
            return
        client, share = account.client, self.limits.max_value_bytes_per_client
        if client is not None and self.of_client(client) + more > share:
            raise TooManyRequestsError(
                f"{what} would take client {client} past {share} bytes of values (it holds "
                f"{self.of_client(client)}): the limit is {describe('max_value_bytes_per_client', share)}; "
                "delete sessions it no longer uses"
            )
        bound = self.limits.max_value_bytes
        if self.held + more > bound:
            raise InsufficientStorageError(
                f"{what} would take the server past {bound} bytes of values (it holds {self.held}): "
                f"the limit is {describe('max_value_bytes', bound)}"
            )

    def _move(self, account: _Account, change: int) -> None:
        account.bytes += change
        self.held += change
        if account.client is not None:
            now = self._clients.get(account.client, 0) + change
            if now > 0:
                self._clients[account.client] = now
            else:
                self._clients.pop(account.client, None)

    def _released(self, freed: int) -> int:
        self._freed += freed
        if self._freed >= BIG_RELEASE:  # its memory is worth giving back (serve.memory)
            self.big_at, self._freed = time.monotonic(), 0
        return freed
