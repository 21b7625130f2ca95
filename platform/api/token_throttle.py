"""Slows down guessing of the admin token (issue 24, defect 8).

Each client address may get the token wrong a few times freely; after that, each further
failure doubles the wait before the next attempt from that address is even checked (capped,
so an operator who mistyped waits seconds, not hours), and attempts inside the wait are
answered 429 without comparing the token. A right token clears the address. Addresses are
forgotten after a quiet while, and at most ``max_clients`` are remembered (the oldest go), so
the table is bounded whatever the traffic.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class _Failures:
    count: int = 0
    last: float = 0.0
    blocked_until: float = 0.0


@dataclass
class TokenThrottle:
    free_failures: int = 5  # wrong tokens per address before any wait
    base_delay_s: float = 1.0  # the wait after the first failure past the free ones
    max_delay_s: float = 30.0
    forget_after_s: float = 900.0  # an address quiet this long starts afresh
    max_clients: int = 10_000
    clock: Callable[[], float] = time.monotonic
    _clients: OrderedDict[str, _Failures] = field(default_factory=OrderedDict)

    def retry_after(self, client: str) -> float:
        """Seconds ``client`` must wait before its next attempt is checked (0: go ahead)."""
        now = self.clock()
        entry = self._clients.get(client)
        if entry is None:
            return 0.0
        if now - entry.last > self.forget_after_s:
            del self._clients[client]
            return 0.0
        return max(0.0, entry.blocked_until - now)

    def failed(self, client: str) -> None:
        now = self.clock()
        entry = self._clients.pop(client, None) or _Failures()
        if now - entry.last > self.forget_after_s:
            entry = _Failures()
        entry.count += 1
        entry.last = now
        beyond = entry.count - self.free_failures
        if beyond > 0:
            entry.blocked_until = now + min(self.max_delay_s, self.base_delay_s * 2 ** (beyond - 1))
        self._clients[client] = entry  # most recent last
        while len(self._clients) > self.max_clients:
            self._clients.popitem(last=False)

    def succeeded(self, client: str) -> None:
        self._clients.pop(client, None)
