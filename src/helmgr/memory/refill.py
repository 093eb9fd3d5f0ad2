"""How a node fills EMB rows that a resize or refresh made wanted.

- `sync`: every unfilled row is copied at once, on the critical path: the node is blocked until
  the copy is done. The naive reallocation.
- `lazy`: nothing is copied ahead; a row enters when a request misses on it (the miss fetched it).
- `background`: a background stream copies the hottest unfilled rows in chunks, spaced so that
  it never uses more than `share` of the link's bandwidth, queued with miss traffic.
- `recovery`: `background` while the node's memory policy says it is recovering from a burst
  (HELM's recovery tier sets `active`), `lazy` otherwise. Background refill lowers burst P99
  but, under a controller that keeps resizing, costs steady traffic the link time of rows a
  later shrink drops again (docs/results/2026-12-03-burst-bound.md).

A mode acts through the node's link and cache. `on_grow` and `on_step` return the simulated time
at which the mode wants `on_step` to be called next, or None.
"""
from __future__ import annotations

from typing import Protocol

from helmgr.memory.emb import EmbCache
from helmgr.memory.link import REFILL, H2DLink


class RefillTarget(Protocol):
    emb: EmbCache
    link: H2DLink

    def block_until(self, t: float, now: float) -> None: ...


class RefillMode:
    name = ""

    def on_grow(self, node: RefillTarget, now: float) -> float | None:
        return None

    def on_step(self, node: RefillTarget, now: float) -> float | None:
        return None


class SyncRefill(RefillMode):
    name = "sync"

    def on_grow(self, node, now):
        rows = node.emb.next_unfilled(node.emb.unfilled_rows)
        if len(rows):
            done = node.link.transfer(now, len(rows) * node.emb.row_bytes, REFILL)
            node.emb.fill(rows)
            node.block_until(done, now)
        return None


class LazyRefill(RefillMode):
    name = "lazy"


class BackgroundRefill(RefillMode):
    name = "background"
    active = True                      # the stream runs (RecoveryRefill: only while recovering)

    def __init__(self, share: float = 0.25, chunk_bytes: int = 4 << 20):
        if not 0.0 < share <= 1.0:
            raise ValueError(f"background refill share must be in (0, 1], got {share}")
        self.share = share
        self.chunk_bytes = chunk_bytes
        self.in_flight = None          # rows of the chunk on the link, filled at the next step
        self.next_step: float | None = None

    def on_grow(self, node, now):
        if self.next_step is None:
            return self.on_step(node, now)
        return self.next_step

    def on_step(self, node, now):
        if self.in_flight is not None:           # (filled even if the stream has just stopped)
            node.emb.fill(self.in_flight)
            self.in_flight = None
        rows = node.emb.next_unfilled(max(1, self.chunk_bytes // node.emb.row_bytes)) if self.active else ()
        if len(rows) == 0:
            self.next_step = None
            return None
        nbytes = len(rows) * node.emb.row_bytes
        done = node.link.transfer(now, nbytes, REFILL)
        self.in_flight = rows
        self.next_step = max(done, now + nbytes / (self.share * node.link.bandwidth))
        return self.next_step


class RecoveryRefill(BackgroundRefill):
    """Background refill while `active` (the memory policy sets it), lazy otherwise; a chunk
    already on the link when it turns off is still filled."""

    name = "recovery"
    active = False


REFILL_MODES = {"sync": SyncRefill, "lazy": LazyRefill, "background": BackgroundRefill, "recovery": RecoveryRefill}


def make_refill(name: str, share: float = 0.25) -> RefillMode:
    """The mode named `name`; `share`: a stream's bound on the link (the modes that stream)."""
    try:
        cls = REFILL_MODES[name]
    except KeyError:
        raise ValueError(f"unknown refill mode {name!r} (known: {', '.join(REFILL_MODES)})") from None
    return cls(share=share) if issubclass(cls, BackgroundRefill) else cls()
