"""One replica's serving loop without Ray: a `ServeNode` behind a `Gate`.

`serve` prices the request on this node (`ServeNode.predict_s`: the KV prefix it holds, this
machine's measured slowdown), waits its turn (its class's band first, then cheapest first), and answers `{"late": why}`
without any work when it cannot finish by `deadline`. The work runs in a thread so the event
loop stays free; the gate passes on only when that thread is done, even if the caller was
cancelled meanwhile (the ones behind it are not held past their deadlines). The replica decides
whether a request counts: one whose model work ends past its deadline, or whose caller gave up,
appends nothing and is answered `{"late": why}`, so every 504 leaves the history store as it was.
`alone` runs a short step (a controller tick, a report) ahead of the queue.
"""
from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Callable

import numpy as np

from helmgr.serve.gate import Gate, Late


class Worker:
    def __init__(self, node, clock: Callable[[], float] = time.time):
        self.node = node
        self.gate = Gate(clock)

    async def serve(self, user: int, prefix_len: int, new_items: list[int], candidates: list[int],
                    deadline: float, warmup: bool = False, band: int = 0) -> dict:
        t0 = time.perf_counter()
        try:
            await self.gate.enter(self.node.predict_s(user, prefix_len, len(new_items), len(candidates)), deadline,
                                  band)
        except Late as late:
            return {"late": str(late)}
        gone = threading.Event()

        def in_time() -> bool:                          # asked by the thread before it appends
            return not gone.is_set() and self.gate.clock() <= deadline
        work = asyncio.ensure_future(asyncio.to_thread(
            self.node.serve, user, prefix_len, np.asarray(new_items, np.int64), np.asarray(candidates, np.int64),
            not warmup, warmup, in_time, band))         # a warm-up appends nothing and leaves no K/V
        work.add_done_callback(lambda _: self._done(t0))
        try:
            out = await asyncio.shield(work)
        except asyncio.CancelledError:                  # the caller gave up: the work finishes, appends nothing
            gone.set()
            raise
        if "late" in out:
            self.gate.cut += 1
            return out
        return out | {"replica_ms": (time.perf_counter() - t0) * 1e3, "cut": self.gate.cut}

    def _done(self, t0: float) -> None:
        self.node.finished(time.perf_counter() - t0)
        self.gate.leave()

    async def alone(self, step: Callable[[], object]):
        """`step()` with the node to itself, ahead of every waiting request."""
        await self.gate.enter(0.0, math.inf)
        try:
            return step()
        finally:
            self.gate.leave()
