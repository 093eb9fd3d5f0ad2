"""The embedding hot cache (SPEC 2.2): which item rows sit in HBM.

Each row has a state (absent, resident, or wanted-but-unfilled) in one uint8 array indexed by
item id: checking a request's hundreds of ids is one compiled pass over them (`_check`). Rows enter and leave at *refresh* (every refresh
interval, from scores accumulated since the last one) and at *resize*. Between the two, the
cache has a *wanted* set (the top `capacity` rows by score) and a *resident* subset of it:
wanted rows that are not resident yet are "unfilled" and are filled by the node's refill mode,
or by a miss that fetched them anyway.

Scores come from an eviction policy (`helmgr.memory.eviction`, shared with the device cache):
decayed access frequency (LFU with aging, eagerly aged at each refresh) or last-access epoch
(LRU); each refresh interval is one epoch. Uniform decay keeps the order of untouched rows:
between refreshes, a sorted *frontier* of rows around the capacity edge is enough to resize
without ranking everything again.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from helmgr.memory.eviction import keep_top, make_eviction
from helmgr.memory.eviction import value_at_rank as eviction_value_at_rank
from helmgr.memory.pool import SizeInfo


ABSENT, RESIDENT, UNFILLED = 0, 1, 2


@njit(cache=True, nogil=True)
def _radix_rank(bits, r):
    """The bit pattern of the value at rank r (0 = highest) of float32 scores seen as uint32, by
    two 16-bit radix passes; -1 if a score has its sign bit set (the patterns' order is the
    floats' order only for x >= +0)."""
    hist = np.zeros(65536, np.int64)
    for b in bits:
        hist[b >> 16] += 1
    if hist[32768:].sum():
        return -1
    need, hi = r + 1, 32767
    while hist[hi] < need:
        need -= hist[hi]
        hi -= 1
    hist[:] = 0
    for b in bits:
        if b >> 16 == hi:
            hist[b & 0xFFFF] += 1
    lo = 65535
    while hist[lo] < need:
        need -= hist[lo]
        lo -= 1
    return (hi << 16) | lo


def value_at_rank(scores: np.ndarray, r: int):
    """`eviction.value_at_rank` for the float32 scores of this cache, compiled: two linear passes
    instead of a partition (the same value: the rank's value is unique)."""
    if scores.dtype == np.float32 and 0 <= r < len(scores):
        pattern = _radix_rank(scores.view(np.uint32), r)
        if pattern >= 0:
            return np.array([pattern], np.uint32).view(np.float32)[0]
    return eviction_value_at_rank(scores, r)


@njit(cache=True, nogil=True)
def _check(state, ids):
    """`ids`' resident and unfilled rows (a repeated id counts each time); the unfilled ones then
    become resident (the miss fetched them). Returns (hits, unfilled)."""
    hits = unfilled = 0
    for s in ids:
        st = state[s]
        if st == RESIDENT:
            hits += 1
        elif st == UNFILLED:
            unfilled += 1
    if unfilled:
        for s in ids:
            if state[s] == UNFILLED:
                state[s] = RESIDENT
    return hits, unfilled


class EmbCache:
    def __init__(self, n_items: int, row_bytes: int, policy: str = "lfu", band_rows: int = 65536,
                 decay: float = 0.99):
        if n_items <= 0 or row_bytes <= 0:
            raise ValueError(f"EMB cache needs n_items > 0 and row_bytes > 0, got {n_items}, {row_bytes}")
        self.n_items = n_items
        self.row_bytes = row_bytes
        self.policy = make_eviction(policy, decay)    # eager aging: a refresh touches every row anyway
        self.band_rows = max(1, band_rows)
        self.capacity_rows = 0
        self.scores = np.zeros(n_items, np.float32)
        self.state = np.zeros(n_items, np.uint8)
        self.n_wanted = 0
        self.n_resident = 0             # (also clears _maybe_unfilled: no wanted row is unfilled)
        self.epoch = 0
        self._pending: list[np.ndarray] = []
        self._frontier: np.ndarray | None = None  # rows around the capacity edge, sorted
        self._frontier_lo = 0                      # rank of _frontier[0]
        self._fill_queue: np.ndarray | None = np.zeros(0, np.int64)  # unfilled rows (hottest first once sorted)
        self._fill_pos = 0
        self._fill_sorted = True
        self.lookups = 0
        self.hits = 0
        self.unfilled_misses = 0
        self.filled_rows = 0
        self.access_log = None                     # callable(ids): the interval's accesses, in order
        self.shadow_rows = 0                       # > 0: count accesses to the rows just outside
        self.shadow_hits = 0                       # ... summed over refresh intervals
        self._shadow = np.zeros(0, np.int64)

    def track_shadow(self, rows: int) -> None:
        """Count, at every refresh, the accesses that went to the `rows` rows ranked just below
        the wanted set: the hits a cache that much larger would have had."""
        self.shadow_rows = rows
        self._shadow = self._rows_below(self.state != ABSENT, self.n_wanted)

    @property
    def resident(self) -> np.ndarray:
        return self.state == RESIDENT

    @property
    def wanted(self) -> np.ndarray:
        return self.state != ABSENT

    # -- the hot path ---------------------------------------------------------------------
    def lookup(self, ids: np.ndarray) -> tuple[int, int]:
        """Count resident rows among `ids` and record the accesses for the next refresh.

        Returns (hits, misses on unfilled rows). A miss on a wanted-but-unfilled row brings the
        row over PCIe anyway, so it is admitted (this is the `lazy` refill)."""
        n = len(ids)
        if n == 0:
            return 0, 0
        self._pending.append(ids)
        hits, unfilled = _check(self.state, ids)
        self.lookups += n
        self.hits += hits
        if unfilled:
            self._stale_count = True          # duplicates make the exact count a recount
            self.unfilled_misses += unfilled
        return hits, unfilled

    @property
    def n_resident(self) -> int:
        if self._stale_count:
            self.n_resident = int(np.count_nonzero(self.state == RESIDENT))
        return self._n_resident

    @n_resident.setter
    def n_resident(self, value: int) -> None:
        self._n_resident = value
        self._stale_count = False
        self._maybe_unfilled = value < self.n_wanted

    # -- filling --------------------------------------------------------------------------
    @property
    def unfilled_rows(self) -> int:
        return self.n_wanted - self.n_resident

    def next_unfilled(self, max_rows: int) -> np.ndarray:
        """Up to `max_rows` unfilled wanted rows, hottest first (not yet marked resident). Taking
        them all needs no order; taking a few sorts the queue once."""
        if self._fill_queue is None:
            self._fill_queue = np.flatnonzero(self.state == UNFILLED)
            self._fill_pos, self._fill_sorted = 0, False
        if not self._fill_sorted and max_rows < self.unfilled_rows:
            q = self._fill_queue[self._fill_pos:]
            self._fill_queue = q[np.argsort(-self.scores[q], kind="stable")]
            self._fill_pos, self._fill_sorted = 0, True
        out = []
        taken = 0
        q = self._fill_queue
        while taken < max_rows and self._fill_pos < len(q):
            chunk = q[self._fill_pos:self._fill_pos + (max_rows - taken)]
            self._fill_pos += len(chunk)
            chunk = chunk[self.state[chunk] == UNFILLED]
            out.append(chunk)
            taken += len(chunk)
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def fill(self, rows: np.ndarray) -> int:
        """Make `rows` resident where they are still wanted; return how many were filled."""
        rows = np.unique(rows)
        rows = rows[self.state[rows] == UNFILLED]
        self.state[rows] = RESIDENT
        self.n_resident = self.n_resident + len(rows)
        self.filled_rows += len(rows)
        return len(rows)

    # -- resize and refresh ---------------------------------------------------------------
    def resize(self, capacity_bytes: int) -> None:
        """Change capacity. Shrinking evicts the coldest wanted rows at once; growing marks the
        next hottest rows as wanted (unfilled until the refill mode or a miss brings them)."""
        new = min(capacity_bytes // self.row_bytes, self.n_items)
        old, self.capacity_rows = self.n_wanted, new
        if new == old:
            return
        if not self._frontier_covers(old, new):
            self._build_frontier(new)
        if not self._frontier_covers(old, new):   # a jump wider than the frontier: select anew
            self._select(new)
            return
        f, lo = self._frontier, self._frontier_lo
        if new < old:
            drop = f[new - lo:old - lo]
            resident = self.n_resident - int(np.count_nonzero(self.state[drop] == RESIDENT))
            self.state[drop] = ABSENT
            self.n_wanted = new
            self.n_resident = resident
        else:
            add = f[old - lo:new - lo]
            self.state[add] = UNFILLED
            self.n_wanted = new
            self._maybe_unfilled = True
            if self._fill_queue is not None:       # else it is found (add included) when asked for
                rest = self._fill_queue[self._fill_pos:]
                self._fill_queue, self._fill_pos = np.concatenate([rest, add]), 0
                self._fill_sorted = self._fill_sorted and len(rest) == 0   # frontier order is hot-first

    def refresh(self) -> None:
        """Fold the accesses since the last refresh into the scores and re-select: rows that fell
        out of the top `capacity` are evicted, rows that rose into it become unfilled."""
        self.epoch += 1
        if self._pending:
            accesses = np.concatenate(self._pending)
            self._pending.clear()
            if self.access_log is not None:
                self.access_log(accesses)
            counts = np.bincount(accesses, minlength=self.n_items)
            if len(self._shadow):
                self.shadow_hits += int(counts[self._shadow].sum())
            self.policy.age(self.scores)
            ids = np.flatnonzero(counts)
            self.policy.touch(self.scores, ids, counts[ids].astype(np.float32), self.epoch)
        self._select(self.capacity_rows)

    def warm(self, scores: np.ndarray, per_refresh: float | None = None) -> None:
        """Start from known scores (e.g. yesterday's popularity) with the wanted set filled, the
        way production caches are loaded before taking traffic. With `per_refresh`, `scores` are
        access shares and are scaled to the decayed counts that many accesses per refresh interval
        would settle at, so that the first refreshes neither forget nor overweight them."""
        if per_refresh is not None:
            scores = self.policy.settled(scores, per_refresh)
        self.scores[:] = scores
        self._pending.clear()
        self._select(self.capacity_rows)
        self.state[self.state == UNFILLED] = RESIDENT
        self.n_resident = self.n_wanted
        self._fill_queue, self._fill_pos = np.zeros(0, np.int64), 0

    def _select(self, c: int) -> None:
        """Wanted <- the top c rows by (score desc, row id asc); evict the rest; rows newly
        wanted are unfilled (`keep_top`). Eight vectorized passes over the rows, one partition
        (two when shadow rows are tracked)."""
        c = min(c, self.n_items)
        want = keep_top(self.scores, c, value_at_rank)
        if self.shadow_rows:
            self._shadow = self._rows_below(want, c)
        keep = want & (self.state == RESIDENT)
        np.subtract(want.view(np.uint8) * np.uint8(UNFILLED), keep.view(np.uint8), out=self.state)
        self.n_wanted = c
        self.n_resident = int(np.count_nonzero(keep))
        self._fill_queue = None                    # found when first asked for
        self._frontier = None

    def _rows_below(self, want: np.ndarray, c: int) -> np.ndarray:
        """The `shadow_rows` rows ranked just below the top c."""
        n = self.n_items
        if c >= n:
            return np.zeros(0, np.int64)
        floor = value_at_rank(self.scores, min(c + self.shadow_rows, n) - 1)
        return np.flatnonzero(~want & (self.scores >= floor))

    def _build_frontier(self, c: int) -> None:
        """Sort the rows ranked about [c - band, c + band) by (score desc, row id asc); rows
        tied at either edge are included, so the frontier's ranks start at `_frontier_lo`."""
        n, s = self.n_items, self.scores
        lo, hi = max(c - self.band_rows, 0), min(c + self.band_rows, n)
        top = value_at_rank(self.scores, lo) if lo > 0 else np.inf
        bottom = value_at_rank(self.scores, hi - 1)
        band = np.flatnonzero((s <= top) & (s >= bottom))
        self._frontier = band[np.argsort(-s[band], kind="stable")]
        self._frontier_lo = int(np.count_nonzero(s > top)) if lo > 0 else 0

    def _frontier_covers(self, a: int, b: int) -> bool:
        f = self._frontier
        return f is not None and self._frontier_lo <= min(a, b) and max(a, b) <= self._frontier_lo + len(f)

    # -- the questions every cache answers ------------------------------------------------
    def size_info(self) -> SizeInfo:
        return SizeInfo(self.capacity_rows * self.row_bytes, self.n_resident * self.row_bytes, self.n_resident)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def check_integrity(self) -> None:
        st = self.state
        assert self.n_resident == int(np.count_nonzero(st == RESIDENT))
        assert self.n_wanted == int(np.count_nonzero(st != ABSENT))
        assert np.all((st == ABSENT) | (st == RESIDENT) | (st == UNFILLED)), "unknown row state"
        assert self.n_wanted <= self.capacity_rows
