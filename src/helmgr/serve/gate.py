"""A replica's queue, without Ray: one request at a time, the waiting one of the lowest priority
band next (a class table's `band`; 0 without one), the cheapest within a band, and nobody served
after it can no longer finish by its deadline.

`enter(cost_s, deadline, band=0)` returns when the caller may start, or raises `Late`:
- at once, when the work predicted ahead of it (the one in service, the rest of its predicted
  time; the waiting ones of a lower band, or of its band and no dearer than it) plus its own
  would end past its deadline;
- while waiting, at its start-by time (`deadline - cost_s`), leaving the queue unserved.
A caller that is cancelled while waiting leaves the queue too. `leave()` hands the replica to
the first waiter. Cheapest first keeps small requests from queueing behind large ones; a
large one, or one of a lower band, waits its turn until its start-by time at most (the deadline
bounds how long a band waits behind the ones above it: it is cut, never starved unseen). `clock` is wall-clock time by default
(deadlines are `time.time()` values of the replica's own clock)."""
from __future__ import annotations

import asyncio
import heapq
import math
import time
from typing import Callable


class Late(Exception):
    """The request cannot be served by its deadline; the message says why."""


class Gate:
    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.busy = False
        self.heap: list[tuple[int, float, int, asyncio.Future]] = []     # (band, cost, arrival, waiter)
        self.seq = 0
        self.current = (0.0, 0.0)                 # (predicted cost, start time) of the one in service
        self.cut = 0                              # requests refused or dropped as late

    @property
    def waiting(self) -> int:
        return sum(not f.done() for *_, f in self.heap)

    def ahead_s(self, cost_s: float, band: int = 0) -> float:
        """Predicted work before a request of `cost_s` in `band` would start (if it came now)."""
        if not self.busy:
            return 0.0
        c, start = self.current
        queued = sum(c2 for b2, c2, _, f in self.heap if (b2, c2) <= (band, cost_s) and not f.done())
        return max(c - (self.clock() - start), 0.0) + queued

    async def enter(self, cost_s: float, deadline: float, band: int = 0) -> None:
        now = self.clock()
        ahead = self.ahead_s(cost_s, band)
        if now + ahead + cost_s > deadline:
            self.cut += 1
            raise Late(f"predicted to finish {(now + ahead + cost_s - deadline) * 1e3:.0f} ms past its deadline "
                       f"({ahead * 1e3:.0f} ms of work ahead, {cost_s * 1e3:.0f} ms its own)")
        if not self.busy:
            self._start(cost_s)
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        timer = loop.call_later(max(deadline - cost_s - now, 0.0), self._expire, fut) if math.isfinite(deadline) \
            else None
        self.seq += 1
        heapq.heappush(self.heap, (band, cost_s, self.seq, fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.leave()                      # handed the replica just as it was cancelled: pass it on
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _start(self, cost_s: float) -> None:
        self.busy, self.current = True, (cost_s, self.clock())

    def _expire(self, fut: asyncio.Future) -> None:
        if not fut.done():
            self.cut += 1
            fut.set_exception(Late("its deadline would pass before it could be served (queued behind others)"))

    def leave(self) -> None:
        """The one in service is done: the first live waiter (lowest band, then cheapest) starts, or
        the replica is free."""
        while self.heap:
            _, cost_s, _, fut = heapq.heappop(self.heap)
            if not fut.done():
                self.current = (cost_s, self.clock())
                fut.set_result(None)
                return
        self.busy = False
