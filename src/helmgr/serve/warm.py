"""When the ingress is ready, without Ray: after warm-up requests sent the way real ones
go (through the handle: the router's first decisions and compiled kernel, the replica set it
learns, the hop to each replica). Until then `/healthz` is 503. Each replica warms its own model
and kernels before Ray starts it (`ServeNode.warm_up`)."""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable


class Warmup:
    def __init__(self, replicas: int, rounds: int = 8, pause_s: float = 0.2):
        self.replicas, self.rounds, self.pause_s = replicas, rounds, pause_s
        self.seen: set[str] = set()
        self.answered = 0
        self.ready = False

    async def run(self, call: Callable[[int], Awaitable[dict]]) -> None:
        """`call(k)` sends warm-up request number k and returns the backend's answer (its `node`).
        One at a time (the handle's very first calls, sent together, can wait on a replica set the
        router has not seen yet); ready after `replicas` answers and either every replica seen or
        `rounds` requests sent, trying on (every `pause_s`) while nothing answers."""
        k = 0
        while not (self.answered >= self.replicas and (len(self.seen) >= self.replicas or k >= self.rounds)):
            try:
                out = await call(k)
            except Exception:                     # a replica still starting or replaced: try again
                out = None
            if isinstance(out, dict) and "scores" in out:
                self.answered += 1
                self.seen.add(out["node"])
            else:
                await asyncio.sleep(self.pause_s)
            k += 1
        self.ready = True

    def health(self) -> tuple[int, dict]:
        """HTTP status and body of `/healthz`."""
        body = {"status": "ok" if self.ready else "warming", "replicas": self.replicas,
                "replicas_warm": len(self.seen)}
        return (200 if self.ready else 503), body
