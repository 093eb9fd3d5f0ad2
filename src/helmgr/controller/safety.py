"""The last step of every controller decision: whatever the tiers propose, the
ratio that leaves is finite, inside [r_min, r_max], and at most `max_slew` from the last one.

Then a hysteresis (`settle`): a node's ratio moves only when the tiers' target has moved at least
`min_move` away from it. A resize is not free: shrinking a cache drops the rows or prefixes at its
margin, and growing it back fetches them again, so a ratio that wanders a little every window pays
for churn and buys nothing. The target keeps moving underneath, so small steps add up to one move.

Before any of that, the window's stats are checked (`stats_ok`). A window with a non-finite or
impossible value (the bounds are in `stats_ok`) is refused: it is counted (`bad_input`), answered
by `fallback` — the ratio set last, or before any, the node's reported ratio clamped to
[r_min, r_max] if it is a ratio at all, else `start` (default: the middle of [r_min, r_max]) —
and nothing learns from it: the observer, detector, plan, post-burst floor and adapter are left
exactly as they were, so the windows after it decide as if it had never come.

`Safety` holds the limits and the controller's report of its counters; `stats_ok`, `fallback`,
`limit` and `settle` are the compiled code, on the controller's memory (helmgr.controller.layout).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from numba import njit

from helmgr.controller.layout import (APPLIED, BAD_INPUT, C_MIN_MOVE, C_R_MAX, C_R_MIN, C_SLEW, C_START, CLAMPED, EVENT,
                                      NON_FINITE, SETTLED, SLEWED)


@dataclass(slots=True, eq=False)
class Safety:
    r_min: float = 0.05
    r_max: float = 0.95
    max_slew: float = 0.05
    min_move: float = 0.0
    start: float | None = None                        # the answer to a bad window before any good one, when the
                                                      # node's ratio is no ratio either (None: mid-range)
    non_finite: int = field(init=False, default=0)   # proposals that were NaN or infinite (kept the last ratio)
    clamped: int = field(init=False, default=0)      # proposals outside [r_min, r_max]
    slewed: int = field(init=False, default=0)       # proposals further than max_slew from the last ratio
    settled: int = field(init=False, default=0)      # targets under min_move from the node's ratio (not moved)
    bad_input: int = field(init=False, default=0)    # windows whose stats were refused (`stats_ok`): fallback

    def __post_init__(self):
        if not (0.0 <= self.r_min < self.r_max <= 1.0):
            raise ValueError(f"safety needs 0 <= r_min < r_max <= 1, got {self.r_min}, {self.r_max}")
        if not self.max_slew > 0:
            raise ValueError(f"max_slew must be > 0, got {self.max_slew}")
        if not 0.0 <= self.min_move <= self.max_slew:
            raise ValueError(f"min_move must be in [0, max_slew = {self.max_slew}], got {self.min_move}")
        if self.start is not None and not self.r_min <= self.start <= self.r_max:
            raise ValueError(f"start must be in [r_min, r_max] = [{self.r_min}, {self.r_max}], got {self.start}")

    def configure(self, cfg) -> None:
        """Write the limits into the kernel's constants."""
        start = (self.r_min + self.r_max) / 2 if self.start is None else self.start
        cfg[[C_R_MIN, C_R_MAX, C_SLEW, C_MIN_MOVE]] = self.r_min, self.r_max, self.max_slew, self.min_move
        cfg[C_START] = min(max(start, self.r_min), self.r_max)     # r_min, r_max may have changed since

    def report(self, st) -> None:
        """Take the counters from the kernel's scalars."""
        self.non_finite, self.clamped, self.slewed = int(st[NON_FINITE]), int(st[CLAMPED]), int(st[SLEWED])
        self.settled, self.bad_input = int(st[SETTLED]), int(st[BAD_INPUT])


@njit(cache=True, nogil=True, inline="always")
def stats_ok(ratio, rps, p99, slo, emb, kv, queue, h2d, new_users, emb_time):
    """Whether a window's stats can be learned from (p99 NaN: no request completed). Every value
    finite; the ratio, hit rates, H2D utilization and EMB time share in [0, 1]; rates, P99 and
    queue >= 0, the SLO > 0. The share of new users has no upper bound: a window counts them as
    requests start and divides by the requests that completed in it."""
    inf = math.inf
    return (0.0 <= ratio <= 1.0 and 0.0 <= rps < inf and (p99 != p99 or 0.0 <= p99 < inf) and 0.0 < slo < inf
            and 0.0 <= emb <= 1.0 and 0.0 <= kv <= 1.0 and 0.0 <= queue < inf and 0.0 <= h2d <= 1.0
            and 0.0 <= new_users < inf and 0.0 <= emb_time <= 1.0)


@njit(cache=True, nogil=True, inline="always")
def fallback(ratio, st, cfg):
    """The answer to a refused window (counted; no other state touched): the ratio set last; before
    any, the reported `ratio` clamped to [r_min, r_max] if it is in [0, 1], else the start."""
    st[BAD_INPUT] += 1
    st[EVENT] = 0.0
    if not math.isnan(st[APPLIED]):
        return st[APPLIED]
    if 0.0 <= ratio <= 1.0:
        return min(max(ratio, cfg[C_R_MIN]), cfg[C_R_MAX])
    return cfg[C_START]


@njit(cache=True, nogil=True, inline="always")
def limit(proposed, current, st, cfg):
    """The target, given the tiers' proposal and the ratio set last (a checked ratio in [0, 1])."""
    if not math.isfinite(proposed):
        st[NON_FINITE] += 1
        return min(max(current, cfg[C_R_MIN]), cfg[C_R_MAX])
    lo, hi = current - cfg[C_SLEW], current + cfg[C_SLEW]
    if proposed < lo or proposed > hi:
        st[SLEWED] += 1
        proposed = lo if proposed < lo else hi
    if proposed < cfg[C_R_MIN] or proposed > cfg[C_R_MAX]:
        st[CLAMPED] += 1
        proposed = cfg[C_R_MIN] if proposed < cfg[C_R_MIN] else cfg[C_R_MAX]
    return proposed


@njit(cache=True, nogil=True, inline="always")
def settle(target, current, st, cfg):
    """The ratio to set: `target`, or the node's ratio `current` while the target is within
    `min_move` of it (a target on r_min or r_max is always reached, and a node's ratio outside
    them is never kept)."""
    if (target != current and abs(target - current) < cfg[C_MIN_MOVE] and cfg[C_R_MIN] < target < cfg[C_R_MAX]
            and cfg[C_R_MIN] <= current <= cfg[C_R_MAX]):
        st[SETTLED] += 1
        return current
    return target
