"""The EMB cache's selection (`EmbCache` is one): which rows are wanted, re-selected inside the
*window* of scores around the capacity edge after a refresh raises some scores (`_raise`), the
window re-centred or rebuilt before the edge leaves it (`_slide`, `_select`), and the *shadow*,
the rows ranked just below the wanted set (`_rows_below`). The compiled passes they call are in
`emb_kernels.py`; emb.py says how the window and the shadow work."""
from __future__ import annotations

import numpy as np

from helmgr.memory.emb_kernels import (
    ABSENT, RESIDENT, UNFILLED, _NO_ROWS, _absent_from, _add, _cut, _settle, _split, value_at_rank, values_at_ranks)


class EmbSelect:
    """The window and shadow upkeep of `EmbCache`: every method reads and sets the cache's
    scores, states, counts and window fields."""

    def _raise(self, accesses: np.ndarray) -> None:
        """Age, score the rows in `accesses` and re-select: inside the window while it holds the
        capacity edge and the policy adds accesses to scores (LFU), else anew."""
        c, policy = self.n_wanted, self.policy
        rescales = policy.rescales
        policy.age(self.scores)                    # (lazy: the next accesses weigh more)
        if not policy.additive:
            counts = np.bincount(accesses, minlength=self.n_items)
            self.shadow_hits += int(counts[self._shadow].sum())
            rows = np.flatnonzero(counts)
            self.scores[rows] = policy.priority(self.scores[rows], counts[rows].astype(np.float32), self.epoch)
            self._flat = False
            self._select(c)
            return
        rose, joined, shadow_hits = _add(accesses, self.scores, self.state, self._shadow,
                                            np.float32(policy.weight), self._lo, self._hi)
        if shadow_hits < 0:
            raise IndexError(f"EMB access ids must be in [0, {self.n_items})")
        self.shadow_hits += shadow_hits
        self._above += len(rose)
        self._flat = False
        if self._window is None or policy.rescales != rescales or self._above > c:   # (every score moved,
            self._select(c)                                                         # or the edge left)
            return
        self._window, _, dropped, edge, self._settled = _settle(self.scores, self.state, self._window, joined,
                                                                self._hi, c - self._above, self._shadow_rank(c))
        self._n_resident -= dropped
        self._fill_queue = None                    # found when first asked for
        near_top = self._hi < np.inf and c - self._above < 2 * len(rose)   # (len(rose): how far it moved)
        if 0 < c < self.n_items and (near_top or len(self._window) > 4 * self._span(c)):
            self._slide(c, edge)                   # before the next refresh pushes the edge out
        elif self._settled is None and self._shadow_rank(c) > len(self._window):
            self._select(c)                        # the shadow reaches past the window (EMB grew): one
                                                   # rebuild, not a rank of the whole table each refresh

    def _slide(self, c: int, edge: np.float32) -> None:
        """Re-centre the window on the capacity edge (score `edge`) in one pass over the rows, no
        ranking: any bounds around the edge select exactly, so they are estimated from the window
        itself. Below the edge its rows are every row in [lo, edge]: the new floor is the score
        `band_rows` (and the shadow) below it. Above, the rows between the edge and the ceiling
        tell how fast rank grows with score: the new ceiling is where that growth reaches
        `_reach_up` ranks (at most twice the edge)."""
        k = c - self._above
        if k == 0:                                 # the edge is the window's ceiling: no estimate
            self._select(c)
            return
        down = self.band_rows + self.shadow_rows
        lo = self._lo
        if len(self._window) - k > down:
            lo, _ = _cut(self.scores[self._window], self._window, k + down)
        ratio = float(self._hi) / float(edge) if edge > 0 else 2.0
        hi = max(edge, np.float32(float(edge) * min(max(ratio, 1.0001) ** (self._reach_up(c) / k), 2.0)))
        self._above, window, dropped = _split(self.scores, self.state, lo, hi)
        self._window, _, dropped_in, _, self._settled = _settle(self.scores, self.state, window, _NO_ROWS, hi,
                                                                c - self._above, self._shadow_rank(c))
        self._lo, self._hi = lo, hi
        self._n_resident -= dropped + dropped_in

    def _select(self, c: int) -> None:
        """Wanted <- the top c rows by (score desc, row id asc); evict the rest; rows newly
        wanted are unfilled. Rebuilds the window around the capacity edge: the ranks from
        `_reach_up(c)` above it to `band_rows` (and the shadow) below it, rows tied at either edge
        included. Three passes over the rows (the two ranks share theirs), then the window's;
        before any score, one pass over the states (the window is built at the first selection
        with scores)."""
        n = self.n_items
        c = min(c, n)
        if self._flat:
            st = self.state
            self._n_resident -= int(np.count_nonzero(st[c:] == RESIDENT))
            st[c:] = ABSENT
            st[:c][st[:c] == ABSENT] = UNFILLED
            self.n_wanted, self._window, self._fill_queue = c, None, None
            self._lo = self._hi = np.float32(np.inf)
            self._above = 0
            return
        top, bottom = c - self._reach_up(c), min(c + self.band_rows + self.shadow_rows, n) - 1
        if top > 0:
            hi, lo = values_at_ranks(self.scores, top, bottom)
        else:
            hi, lo = np.float32(np.inf), value_at_rank(self.scores, bottom)
        self._above, window, dropped = _split(self.scores, self.state, lo, hi)
        self._window, _, dropped_in, _, self._settled = _settle(self.scores, self.state, window, _NO_ROWS, hi,
                                                                c - self._above, self._shadow_rank(c))
        self._lo, self._hi = lo, hi
        self.n_wanted = c
        self._n_resident -= dropped + dropped_in
        self._fill_queue = None                    # found when first asked for

    def _span(self, c: int) -> int:
        """Rows a window rebuilt at capacity c holds (about)."""
        return self._reach_up(c) + self.band_rows + self.shadow_rows

    def _reach_up(self, c: int) -> int:
        """Ranks above the edge a rebuilt window spans: each row a refresh raises over the window
        moves the edge up one rank, so this sets how many refreshes the window lasts."""
        return min(c, max(self.band_rows, c // 4))

    def _shadow_rank(self, c: int) -> int:
        """For `_settle` re-selecting the window at capacity c: the rank in the window (from 1)
        of the shadow's last row, 0 where `_rows_below(c)` would not read the window (no shadow,
        c at or past the table's end, or the window does not reach it)."""
        if not self.shadow_rows or c >= self.n_items or self._above > c:
            return 0
        return min(c + self.shadow_rows, self.n_items) - self._above

    def _rows_below(self, c: int) -> np.ndarray:
        """The `shadow_rows` rows ranked just below the top c (and rows tied with the last)."""
        n = self.n_items
        if c >= n or not self.shadow_rows:
            return _NO_ROWS
        last = min(c + self.shadow_rows, n) - 1
        if self._window is not None and self._above <= c and last < self._above + len(self._window):
            floor, _ = _cut(self.scores[self._window], self._window, last - self._above + 1)
            return _absent_from(self.scores, self.state, self._window, floor)
        floor = value_at_rank(self.scores, last)
        return np.flatnonzero((self.state == ABSENT) & (self.scores >= floor))
