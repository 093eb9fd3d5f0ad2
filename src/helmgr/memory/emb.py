"""The embedding hot cache: which item rows sit in HBM.

Each row has a state (absent, resident, or wanted-but-unfilled) in one uint8 array indexed by
item id: checking a request's hundreds of ids is one compiled pass over them (`_check`). Rows
enter and leave at *refresh* (every refresh interval, from the accesses recorded since the last
one) and at *resize*. Between the two, the cache has a *wanted* set (the top `capacity` rows by
score, ties to the lower row id) and a *resident* subset of it: wanted rows that are not resident
yet are "unfilled" and are filled by the node's refill mode, or by a miss that fetched them anyway.

Scores come from an eviction policy (`helmgr.memory.eviction`, shared with the device cache):
decayed access frequency (LFU with aging) or last-access epoch (LRU); each refresh interval is
one epoch. LFU ages lazily (an access weighs 1/decay more each epoch instead of every score
shrinking), so a refresh raises the scores of the rows it saw and leaves every other score as it
was: only those rows can cross the capacity edge. The cache keeps a *window*, every row whose
score lies in a band of values around the edge, and how many rows are above it. A refresh adds
its accesses in one compiled pass that also catches the rows crossing the window's bounds (a
score only grows, so it crosses each at most once), then re-selects inside the window; a
resize re-selects inside it too. Before the edge leaves the window (every few refreshes) one pass
over the rows re-centres it. Work is proportional to the accesses and the window, not to the
catalogue; LRU, whose every touched row jumps to the top, selects anew at each refresh. The
selection and the shadow are `EmbSelect`'s (`emb_select.py`).

Sampling (`sample_shift` s > 0, the simulator's `--emb-sample 2**s`): the cache tracks only the
item ids whose low s bits are 0, one in 2**s, as rows id >> s, each standing for 2**s rows
(`row_bytes` is then 2**s rows' bytes, so capacity in rows is 1/2**s of the items'). A lookup
checks and records only its sampled ids and scales their misses up by 2**s (unbiased, not
capped): the spatial sampling of SHARDS (Waldspurger et al., FAST '15) applied to this cache. Every
sampled row is scored, admitted and evicted as it would be unsampled; state, scores and the
refresh's work shrink 2**s times, and a request's hits become an estimate.
"""
from __future__ import annotations

import numpy as np

from helmgr.memory.emb_kernels import (  # noqa: F401  (ABSENT, RESIDENT, UNFILLED, _check, value_at_rank: re-exported)
    ABSENT, RESIDENT, UNFILLED, _NO_ROWS, _check, _check_sampled, _settle, sampled_counts, value_at_rank)
from helmgr.memory.emb_select import EmbSelect
from helmgr.memory.eviction import make_eviction
from helmgr.memory.pool import SizeInfo


class EmbCache(EmbSelect):
    def __init__(self, n_items: int, row_bytes: int, policy: str = "lfu", band_rows: int = 65536,
                 decay: float = 0.99, state: np.ndarray | None = None, sample_shift: int = 0):
        """`state`: a caller's uint8 array of n_items (e.g. a row of a cluster-wide table) to hold
        the rows' states in place of the cache's own; it is set to absent, and never replaced.
        `sample_shift` > 0: the cache tracks one item id in 2**sample_shift (n_items and row_bytes
        are then the tracked rows' count and 2**sample_shift rows' bytes; `lookup` takes item ids)."""
        if n_items <= 0 or row_bytes <= 0 or not 0 <= sample_shift < 31:
            raise ValueError(f"EMB cache needs n_items > 0, row_bytes > 0 and sample_shift in [0, 31), got "
                             f"{n_items}, {row_bytes}, {sample_shift}")
        if state is None:
            state = np.zeros(n_items, np.uint8)
        elif state.dtype != np.uint8 or state.shape != (n_items,):
            raise ValueError(f"EMB state must be uint8 of shape ({n_items},), got {state.dtype} {state.shape}")
        else:
            state[:] = ABSENT
        self.n_items = n_items
        self.row_bytes = row_bytes
        self.sample_shift = sample_shift
        self.policy = make_eviction(policy, decay, lazy=True)   # untouched scores never change
        self.band_rows = max(1, band_rows)
        self.capacity_rows = 0
        self.scores = np.zeros(n_items, np.float32)
        self.state = state
        self.n_wanted = 0
        self.n_resident = 0
        self.epoch = 0
        self._pending: list[np.ndarray] = []
        self._flat = True                  # every score is 0 (nothing seen): the top c is rows 0 .. c-1
        self._window: np.ndarray | None = None   # rows with a score in [_lo, _hi], any order ...
        self._lo = self._hi = np.float32(np.inf)
        self._above = 0                    # ... and how many rows are above it (all wanted)
        self._fill_queue: np.ndarray | None = np.zeros(0, np.int64)  # unfilled rows (hottest first once sorted)
        self._fill_pos = 0
        self._fill_sorted = True
        self._as_warmed = False            # nothing has changed since `warm` (`warm_from` copies it)
        self.lookups = 0
        self.hits = 0
        self.unfilled_misses = 0
        self.filled_rows = 0
        self.access_log = None                     # callable(ids): the interval's accesses, in order
        self.shadow_rows = 0                       # > 0: count accesses to the rows just outside
        self.shadow_hits = 0                       # ... summed over refresh intervals
        self._shadow = _NO_ROWS
        self._settled = None                       # the shadow the last re-selection found (`_settle`)

    def track_shadow(self, rows: int) -> None:
        """Count, at every refresh, the accesses that went to the `rows` rows ranked just below
        the wanted set: the hits a cache that much larger would have had."""
        self.shadow_rows = rows
        self._shadow = self._rows_below(self.n_wanted)
        self._as_warmed = False

    @property
    def resident(self) -> np.ndarray:
        return self.state == RESIDENT

    @property
    def wanted(self) -> np.ndarray:
        return self.state != ABSENT

    # -- the hot path ---------------------------------------------------------------------
    def lookup(self, ids: np.ndarray) -> tuple[int, int]:
        """Count resident rows among item `ids` and record the accesses for the next refresh.

        Returns (hits, misses on unfilled rows). A miss on a wanted-but-unfilled row brings the
        row over PCIe anyway, so it is admitted (this is the `lazy` refill). Sampled: hits and
        unfilled misses estimated from the sampled ids (`emb_kernels.sampled_counts`)."""
        if len(ids) == 0:
            return 0, 0
        shift = self.sample_shift
        self.record(ids[(ids & ((1 << shift) - 1)) == 0] >> shift if shift else ids)
        hits, unfilled = sampled_counts(len(ids), *_check_sampled(self.state, ids, shift), shift)
        self.add_counts(len(ids), hits, unfilled)
        return hits, unfilled

    def record(self, ids: np.ndarray) -> None:
        """Accesses to count at the next refresh, as `lookup` records them, for a caller that
        checks residency on `state` itself. `ids` are rows (in [0, n_items): sampled, the sampled
        ids >> sample_shift), kept, not copied."""
        if len(ids):
            self._pending.append(ids)
            self._as_warmed = False

    def add_counts(self, lookups: int, hits: int, unfilled: int) -> None:
        """Counters of lookups checked outside (`_check`'s answers for `lookups` ids)."""
        self.lookups += lookups
        self.hits += hits
        if unfilled:
            self._stale_count = True          # duplicates make the exact count a recount
            self.unfilled_misses += unfilled

    @property
    def n_resident(self) -> int:
        if self._stale_count:
            self.n_resident = int(np.count_nonzero(self.state == RESIDENT))
        return self._n_resident

    @n_resident.setter
    def n_resident(self, value: int) -> None:
        self._n_resident = value
        self._stale_count = False

    # -- filling --------------------------------------------------------------------------
    @property
    def unfilled_rows(self) -> int:
        return self.n_wanted - self.n_resident

    def next_unfilled(self, max_rows: int) -> np.ndarray:
        """Up to `max_rows` unfilled wanted rows, hottest first (not yet marked resident). Taking
        them all needs no order; taking a few sorts the queue once (ties: lower row id first)."""
        if self._fill_queue is None:
            self._fill_queue = np.flatnonzero(self.state == UNFILLED)
            self._fill_pos, self._fill_sorted = 0, False
        if not self._fill_sorted and max_rows < self.unfilled_rows:
            q = self._fill_queue[self._fill_pos:]
            self._fill_queue = q[np.lexsort((q, -self.scores[q]))]
            self._fill_pos, self._fill_sorted = 0, True
        self._as_warmed = False
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
        self._as_warmed = False
        return len(rows)

    # -- resize and refresh ---------------------------------------------------------------
    def resize(self, capacity_bytes: int) -> None:
        """Change capacity. Shrinking evicts the coldest wanted rows at once; growing marks the
        next hottest rows as wanted (unfilled until the refill mode or a miss brings them)."""
        new = min(capacity_bytes // self.row_bytes, self.n_items)
        self.capacity_rows = new
        if new == self.n_wanted:
            return
        self._as_warmed = False
        if self._window is None or not self._above <= new <= self._above + len(self._window):
            self._select(new)               # beyond the window: select anew
            return
        self._window, add, dropped, _, self._settled = _settle(self.scores, self.state, self._window, _NO_ROWS,
                                                               self._hi, new - self._above, self._shadow_rank(new))
        self.n_wanted = new
        self._n_resident -= dropped
        if len(add) and self._fill_queue is not None:   # else it is found (add included) when asked for
            rest = self._fill_queue[self._fill_pos:]
            add = add[np.lexsort((add, -self.scores[add]))]
            self._fill_queue, self._fill_pos = np.concatenate([rest, add]), 0
            self._fill_sorted = self._fill_sorted and len(rest) == 0

    def refresh(self) -> None:
        """Fold the accesses since the last refresh into the scores and re-select: rows that fell
        out of the top `capacity` are evicted, rows that rose into it become unfilled."""
        self.epoch += 1
        self._as_warmed = False
        self._settled = None
        if self._pending:
            accesses = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
            self._pending.clear()
            if self.access_log is not None:
                self.access_log(accesses)
            self._raise(accesses)
        if self.shadow_rows:            # the last re-selection's shadow, else found anew
            self._shadow = self._rows_below(self.n_wanted) if self._settled is None else self._settled

    def warm(self, scores: np.ndarray, per_refresh: float | None = None) -> None:
        """Start from known scores (e.g. yesterday's popularity) with the wanted set filled, the
        way production caches are loaded before taking traffic. With `per_refresh`, `scores` are
        access shares and are scaled to the decayed counts that many accesses per refresh interval
        would settle at, so that the first refreshes neither forget nor overweight them."""
        if per_refresh is not None:
            scores = self.policy.settled(scores, per_refresh)
        scores = np.asarray(scores, np.float32)
        if scores.shape != self.scores.shape or not np.all(np.isfinite(scores) & (scores >= 0)):
            raise ValueError(f"EMB warm-start scores must be {self.n_items} finite scores >= 0")
        self.scores[:] = scores + np.float32(0)   # (-0.0 -> +0.0: the selection reads sign bits)
        self._flat = False
        self._pending.clear()
        self._select(self.capacity_rows)
        self.state[self.state == UNFILLED] = RESIDENT
        self.n_resident = self.n_wanted
        self._fill_queue, self._fill_pos = np.zeros(0, np.int64), 0
        self._as_warmed = True

    def warm_items(self, shares: np.ndarray, per_refresh: float) -> None:
        """`warm` from per-item access shares and item accesses per refresh: with sampling, the
        sampled items' shares, and their part of the accesses (what `lookup` records of them)."""
        if not self.sample_shift:
            return self.warm(shares, per_refresh=per_refresh)
        rows = np.asarray(shares, np.float64)[::1 << self.sample_shift]
        self.warm(rows, per_refresh=per_refresh * float(rows.sum()) / max(float(np.sum(shares)), 1e-300))

    # what `warm` sets, beyond the scores and the state: `warm_from` copies these
    _WARM_FIELDS = ("_flat", "n_wanted", "_n_resident", "_stale_count", "_window", "_lo", "_hi", "_above", "_shadow",
                    "_fill_queue", "_fill_pos", "_fill_sorted")

    def can_warm_from(self, other: "EmbCache") -> bool:
        """Whether `warm_from(other)` applies: `other` was warmed and has changed in no way since,
        and has this cache's size, capacity, window band, shadow and policy."""
        same = ("n_items", "sample_shift", "capacity_rows", "band_rows", "shadow_rows", "epoch")
        return (other._as_warmed and all(getattr(self, f) == getattr(other, f) for f in same)
                and type(self.policy) is type(other.policy) and vars(self.policy) == vars(other.policy))

    def warm_from(self, other: "EmbCache") -> None:
        """Start exactly as `other` started (it was warmed and has seen nothing since): the result
        of warming this cache with the same scores, copied instead of selected again."""
        if not self.can_warm_from(other):
            raise ValueError("warm_from needs a cache of the same size, capacity and policy, just warmed")
        self.scores[:] = other.scores
        self.state[:] = other.state
        self._pending.clear()
        for f in self._WARM_FIELDS:
            v = getattr(other, f)
            setattr(self, f, v.copy() if isinstance(v, np.ndarray) else v)
        self._as_warmed = True

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
