"""The slots of a llama.cpp server, planned by the engine: which slot each request runs in.

``llama-server`` keeps, in each of its parallel slots, the KV of the last prompt the slot
ran, and reuses its longest common prefix with the slot's next prompt. Requests running at
once in different slots each compute their whole prompt, even when they share a long prefix:
measured on this project's peer (4 slots, 1 thread), four concurrent requests behind one
1,100-token prefix computed 4,464 prompt tokens, and 3,350 when the prefix had been computed
just before (its RAM prompt cache hands a saved prompt to one slot, and forgets it there).
The server picks a slot by prompt similarity among the free ones only, so a request whose
prefix is being computed in a busy slot computes it again elsewhere.

The engine knows the prompts it sent, so it picks the slot itself and names it (``id_slot``):

- a prompt sharing a long prefix (at least ``min_shared`` characters and half of the
  prompt) with what a slot holds, or is computing, goes to that slot, waiting for it when it
  is busy, as long as the wait is shorter than computing the prefix again in a free slot:
  both estimated from the server's own ``timings`` (milliseconds per prompt token and per
  output token, characters per token), the wait as what runs and waits in that slot (on a
  CPU replica ~0.5 s for a 32-token answer, against ~10 s for a 1,100-token prefix). A
  prefix of ``min_wait_tokens`` or more may have ``max_waiting`` requests waiting for its
  slot, a shorter one a single one: measured with agent applications (a 200-token team
  prompt), a queue behind one slot ran a whole phase one call after the other, and drew
  every call to one replica while the others idled (0.92x of round-robin on 2 replicas);
- otherwise the free slot sharing the longest prefix with it (of ``min_shared`` characters
  or more), else the least recently used;
- with no slot free, it waits for the first slot that frees.

The ServeCore asks the same estimate across replicas (:meth:`SlotPlanner.worth_queueing`):
a task whose long prefix a replica's busy slots hold waits there, past the replica's slot
count, when that is quicker than computing the prefix on another replica (with as many
requests running there); so a prompt's users do not spill onto every replica as soon as
the one holding it is full (3 replicas on the chatbot: 6,014 prompt tokens computed against
2,757 on one).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field


def shared_prefix(a: str, b: str) -> int:
    """Length of the common prefix of two strings (by halving: slices compare in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


@dataclass
class Rates:
    """The server's speed, from its ``timings`` (moving averages)."""

    prompt_ms: float = 0.0  # per prompt token computed
    output_ms: float = 0.0  # per output token
    chars: float = 4.0  # characters per prompt token
    known: bool = False

    def observe(self, timings: dict, prompt_chars: int, prompt_tokens: int) -> None:
        if prompt_tokens:
            self.chars = _average(self.chars, prompt_chars / prompt_tokens, self.known)
        if timings.get("prompt_n", 0) >= 16:  # a few tokens time mostly overhead
            self.prompt_ms = _average(self.prompt_ms, timings["prompt_ms"] / timings["prompt_n"], self.known)
        if timings.get("predicted_n", 0) >= 2:
            self.output_ms = _average(self.output_ms, timings["predicted_per_token_ms"], self.known)
        self.known = self.known or bool(self.prompt_ms and self.output_ms)

    def request_ms(self, new_chars: int, max_tokens: int) -> float:
        """A request's time in its slot, computing ``new_chars`` of its prompt."""
        return new_chars / self.chars * self.prompt_ms + max_tokens * self.output_ms


def _average(old: float, new: float, known: bool) -> float:
    return 0.7 * old + 0.3 * new if known and old else new


@dataclass(eq=False)
class Slot:
    index: int
    text: str = ""  # what its KV holds, or will hold once its running request's prompt is computed
    busy: bool = False
    used_at: float = 0.0
    ends_at: float = 0.0  # when its running request should end (clock, by the rates)
    waiting: deque[tuple[asyncio.Future[Slot], float]] = field(default_factory=deque)  # (waiter, its ms)


class SlotPlanner:
    """Slots of one llama.cpp server (see the module docstring)."""

    def __init__(
        self,
        count: int,
        min_shared: int = 512,
        max_waiting: int = 4,
        min_wait_tokens: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slots = [Slot(i) for i in range(count)]
        self.min_shared = min_shared
        self.max_waiting = max_waiting
        self.min_wait_tokens = min_wait_tokens
        self.clock = clock
        self._any: deque[tuple[asyncio.Future[Slot], float]] = deque()  # for whichever slot frees first
        self.rates = Rates()
        self.waited = 0  # requests that waited for the slot holding their prefix

    @property
    def running(self) -> int:
        return sum(s.busy for s in self.slots)

    @property
    def waiting(self) -> int:
        return len(self._any) + sum(len(s.waiting) for s in self.slots)

    @contextlib.asynccontextmanager
    async def slot(self, prompt: str, max_tokens: int) -> AsyncIterator[Slot]:
        """A slot for ``prompt``, held until the block ends. The block sets ``slot.text``
        to what the slot holds after the request (its prompt and answer); a block that
        raises leaves the slot's content unknown (empty here)."""
        slot = await self._acquire(prompt, max_tokens)
        try:
            yield slot
        except BaseException:
            slot.text = ""
            raise
        finally:
            self._release(slot)

    def kept_prefix(self, prompt: str) -> int:
        """The longest prefix of ``prompt`` that a request could use now: held by a free
        slot, or by a busy one it would wait for (a replica whose slots holding it are
        taken is no better placed than another)."""
        best = 0
        for slot in self.slots:
            shared = shared_prefix(prompt, slot.text)
            if not (slot.busy or slot.waiting) or len(slot.waiting) < self._waiters_allowed(shared):
                best = max(best, shared)
        return best

    def _waiters_allowed(self, shared: int) -> int:
        """Requests that may wait for a busy slot holding ``shared`` characters of theirs: a
        long prefix is worth a queue, a short one a single waiter (each pair computes it
        once, and the other requests of a burst spread over slots and replicas)."""
        return self.max_waiting if shared / self.rates.chars >= self.min_wait_tokens else 1

    def choose(self, prompt: str, max_tokens: int = 0) -> Slot | None:
        """The slot ``prompt`` should run in (busy or not); None: whichever frees first."""
        free = [s for s in self.slots if not s.busy and not s.waiting]
        holding = sorted(((shared_prefix(prompt, s.text), s) for s in self.slots), key=lambda p: -p[0])
        holding = [(n, s) for n, s in holding if n >= self.min_shared and 2 * n >= len(prompt)]
        for _, slot in holding:  # a free slot holding it, else a busy one worth waiting for
            if slot in free:
                return slot
        for shared, slot in holding:
            if self._worth_waiting(slot, prompt, shared, max_tokens, free):
                return slot
        if not free or self._any:
            return None
        return max(free, key=lambda s: (self._worth(shared_prefix(prompt, s.text)), -s.used_at))

    def _worth(self, shared: int) -> int:
        """A shared prefix worth keeping a slot for; a few characters are not (the least
        recently used slot goes instead, and a slot holding another long prompt stays)."""
        return shared if shared >= self.min_shared else 0

    def _worth_waiting(self, slot: Slot, prompt: str, shared: int, max_tokens: int, free: list[Slot]) -> bool:
        """Whether waiting for busy ``slot`` beats computing the shared prefix again elsewhere."""
        if len(slot.waiting) >= self._waiters_allowed(shared):
            return False
        if not self.rates.known:
            return True
        if not free and not self._any:  # (no free slot: waiting for this one is no worse)
            return True
        elsewhere = max((shared_prefix(prompt, s.text) for s in free), default=0)
        busy = sum(s.busy for s in self.slots)
        return self._wait_ms(slot, prompt, shared) < self._compute_ms(prompt, elsewhere, busy)

    def worth_queueing(self, prompt: str, elsewhere_shared: int, elsewhere_busy: int) -> bool:
        """Whether ``prompt``, sent here now, had better wait for a slot holding its prefix
        than run on another server of the same model that keeps ``elsewhere_shared``
        characters of it and runs ``elsewhere_busy`` requests (False while this server's
        speed is unknown: placement stays as it was)."""
        if not self.rates.known:
            return False
        for slot in self.slots:
            shared = shared_prefix(prompt, slot.text)
            if shared < self.min_shared or 2 * shared < len(prompt):
                continue
            if len(slot.waiting) >= self._waiters_allowed(shared):
                continue
            elsewhere_ms = self._compute_ms(prompt, elsewhere_shared, elsewhere_busy)
            if self._wait_ms(slot, prompt, shared) < elsewhere_ms:
                return True
        return False

    def _wait_ms(self, slot: Slot, prompt: str, shared: int) -> float:
        """Until ``prompt`` would have computed its new part in ``slot``, after what runs
        there and what waits for it."""
        queued = sum(ms for _, ms in slot.waiting)
        running = max(0.0, slot.ends_at - self.clock()) * 1000
        return running + queued + self.rates.request_ms(len(prompt) - shared, 0)

    def _compute_ms(self, prompt: str, shared: int, busy: int) -> float:
        """Computing ``prompt`` past ``shared`` characters beside ``busy`` requests. Its own
        answer takes as long either way. A prompt computed again shares the server's compute
        with the requests running: it takes about as many times longer as there are of them
        (measured on one thread)."""
        return (1 + busy) * self.rates.request_ms(len(prompt) - shared, 0)

    async def _acquire(self, prompt: str, max_tokens: int) -> Slot:
        slot = self.choose(prompt, max_tokens)
        if slot is not None and not (slot.busy or slot.waiting):
            return self._take(slot, prompt, max_tokens)
        queue = slot.waiting if slot is not None else self._any
        self.waited += slot is not None
        waiter: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        new = len(prompt) - (shared_prefix(prompt, slot.text) if slot is not None else 0)
        entry = (waiter, self.rates.request_ms(new, max_tokens))
        queue.append(entry)
        try:
            handed = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed over as it was cancelled
                self._release(waiter.result())
            elif entry in queue:  # (a release may have dropped it already)
                queue.remove(entry)
            raise
        return self._take(handed, prompt, max_tokens)

    def _take(self, slot: Slot, prompt: str, max_tokens: int) -> Slot:
        new = len(prompt) - shared_prefix(prompt, slot.text)
        slot.busy = True
        slot.text = prompt  # being computed: a request sharing its prefix waits for this slot
        slot.used_at = self.clock()
        slot.ends_at = slot.used_at + self.rates.request_ms(new, max_tokens) / 1000
        return slot

    def _release(self, slot: Slot) -> None:
        """The slot is free: it goes to the first request waiting for it, else to the
        first waiting for any slot."""
        slot.busy = False
        slot.used_at = self.clock()
        for queue in (slot.waiting, self._any):
            while queue:
                waiter, _ = queue.popleft()
                if not waiter.done():
                    slot.busy = True  # reserved: the waiter takes it when it resumes
                    waiter.set_result(slot)
                    return
