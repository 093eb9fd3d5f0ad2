"""A node's queue of waiting requests under a class table (docs/tenancy.md#node-queue).

`ClassQueue` answers the same questions as the FCFS deque it replaces — `append`, `q[0]` (the
request it would serve next), `popleft`, `len` — so the cluster's batch formation is unchanged:

- **bands** strictly, lower first, except that a backlogged band whose share of the node's
  recent service has fallen below its minimum share goes first (no starvation);
- within a band, **tenants by deficit round robin** charged by each request's predicted uncached
  work (tokens the node must compute: its new actions, its candidates, and the part of its prefix
  not in this node's KV cache when it arrived), with a quantum per tenant of `QUANTUM_TOKENS` x
  its class's weight — so a returning user whose prefix is resident costs its tenant less;
- within a tenant, **earliest deadline first**: a tenant's requests share its class's target,
  so its deadlines are in arrival order and EDF is FCFS.

With `fair=False` (the `strict` baseline) each band is one FCFS line, served strictly by band:
no minimum share, no tenants.
"""
from __future__ import annotations

import math
from collections import deque
from heapq import heappop, heappush

from helmgr.core.classes import ClassTable
from helmgr.core.records import Request

QUANTUM_TOKENS = 4096.0      # a weight-1 tenant's credit per round: more than one request's work
SHARE_TAU_S = 1.0            # the time constant of a band's recent service (min_share's memory)


class ClassQueue:
    def __init__(self, table: ClassTable, clock, fair: bool = True, count_from: float = 0.0):
        """`clock`: whatever holds the simulated time as `.now` (the cluster; a fork's copy reads its own).
        `count_from`: the time from which `own` and `during` count (the run's warm-up)."""
        k = table.tenant_class
        self.band_of = [table.classes[c].band for c in k]
        self.quantum = (QUANTUM_TOKENS * table.tenant_weight).tolist()
        bands = sorted(set(self.band_of))
        self.bands = bands
        self.min_share = {b: max(cl.min_share for cl in table.classes if cl.band == b) for b in bands}
        self.clock, self.fair = clock, fair
        self.lines: dict[int, list] = {}                    # tenant (fair) or band (strict) -> its heap
        self.active = {b: deque() for b in bands}           # the band's backlogged tenants, in DRR order
        self.deficit: dict[int, float] = {}
        self.turn = {b: False for b in bands}               # the head tenant has had this round's quantum
        self.served = {b: 0.0 for b in bands}               # recent service, decayed with SHARE_TAU_S
        self.served_at = 0.0
        self.own = {b: 0.0 for b in bands}                  # work served to band b (from count_from)
        self.during = {b: 0.0 for b in bands}               # work served to any band while b was backlogged
        self.count_from = count_from
        self.length, self.seq = 0, 0
        self._next: tuple[int, int] | None = None           # (band, line) chosen by the last peek

    # -- what the cluster asks -------------------------------------------------------------
    def append(self, req: Request, work: float) -> None:
        """Queue `req`, charged `work` tokens when it is served."""
        t = req.tenant
        band = self.band_of[t]
        line = t if self.fair else band
        if line not in self.lines or not self.lines[line]:
            self.lines[line] = []
            if self.fair:
                self.active[band].append(line)
                self.deficit[line] = 0.0
        self.seq += 1
        heappush(self.lines[line], (req.t, self.seq, req, work))
        self.length += 1
        self._next = None

    def __len__(self) -> int:
        return self.length

    def __bool__(self) -> bool:
        return self.length > 0

    def __iter__(self):
        return (e[2] for line in self.lines.values() for e in sorted(line))

    def __getitem__(self, i: int) -> Request:
        if i != 0 or not self.length:
            raise IndexError("a class queue shows only its head")
        band, line = self._choose()
        return self.lines[line][0][2]

    def popleft(self) -> Request:
        band, line = self._choose()
        waiting = [b for b in self.bands if self._backlogged(b)]      # (before the take may end one)
        _, _, req, work = heappop(self.lines[line])
        if self.clock.now >= self.count_from:
            for b in waiting:
                self.during[b] += work
            self.own[band] += work
        self.length -= 1
        self._next = None
        self._decay()
        self.served[band] += work
        if self.fair:
            self.deficit[line] -= work
            if not self.lines[line]:                       # a tenant that empties leaves with no credit
                self.active[band].popleft()
                self.deficit[line] = 0.0
                self.turn[band] = False
        return req

    # -- the choice ------------------------------------------------------------------------
    def _decay(self) -> None:
        now = self.clock.now
        if now > self.served_at:
            f = math.exp(-(now - self.served_at) / SHARE_TAU_S)
            for b in self.served:
                self.served[b] *= f
            self.served_at = now

    def _backlogged(self, band: int) -> bool:
        if self.fair:
            return bool(self.active[band])
        return bool(self.lines.get(band))

    def _band(self) -> int:
        """The first backlogged band under its minimum share (fair only), else the first backlogged band."""
        waiting = [b for b in self.bands if self._backlogged(b)]
        self._decay()
        total = sum(self.served.values())
        for b in waiting[1:] if self.fair else ():
            if total > 0 and self.served[b] < self.min_share[b] * total:
                return b
        return waiting[0]

    def _choose(self) -> tuple[int, int]:
        if self._next is None:
            band = self._band()
            self._next = (band, self._tenant(band) if self.fair else band)
        return self._next

    def _tenant(self, band: int) -> int:
        """Deficit round robin over the band's backlogged tenants: the head tenant serves while
        its credit covers its next request's work, then the next one takes its turn."""
        active = self.active[band]
        while True:
            t = active[0]
            if not self.turn[band]:
                self.deficit[t] += self.quantum[t]
                self.turn[band] = True
            if self.deficit[t] >= self.lines[t][0][3]:
                return t
            active.rotate(-1)
            self.turn[band] = False
