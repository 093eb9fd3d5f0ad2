"""The last step of every controller decision (SPEC 6, safety): whatever the tiers propose, the
ratio that leaves is finite, inside [r_min, r_max], and at most `max_slew` from the last one.

Then a hysteresis (`settle`): a node's ratio moves only when the tiers' target has moved at least
`min_move` away from it. A resize is not free: shrinking a cache drops the rows or prefixes at its
margin, and growing it back fetches them again, so a ratio that wanders a little every window pays
for churn and buys nothing. The target keeps moving underneath, so small steps add up to one move.

`Safety` holds the limits and the controller's report of its counters; `limit` and `settle` are
the compiled code, on the controller's memory (helmgr.controller.layout).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from numba import njit

from helmgr.controller.layout import C_MIN_MOVE, C_R_MAX, C_R_MIN, C_SLEW, CLAMPED, NON_FINITE, SETTLED, SLEWED


@dataclass(slots=True, eq=False)
class Safety:
    r_min: float = 0.05
    r_max: float = 0.95
    max_slew: float = 0.05
    min_move: float = 0.0
    non_finite: int = field(init=False, default=0)   # proposals that were NaN or infinite (kept the last ratio)
    clamped: int = field(init=False, default=0)      # proposals outside [r_min, r_max]
    slewed: int = field(init=False, default=0)       # proposals further than max_slew from the last ratio
    settled: int = field(init=False, default=0)      # targets under min_move from the node's ratio (not moved)

    def __post_init__(self):
        if not (0.0 <= self.r_min < self.r_max <= 1.0):
            raise ValueError(f"safety needs 0 <= r_min < r_max <= 1, got {self.r_min}, {self.r_max}")
        if not self.max_slew > 0:
            raise ValueError(f"max_slew must be > 0, got {self.max_slew}")
        if not 0.0 <= self.min_move <= self.max_slew:
            raise ValueError(f"min_move must be in [0, max_slew = {self.max_slew}], got {self.min_move}")

    def configure(self, cfg) -> None:
        """Write the limits into the kernel's constants."""
        cfg[[C_R_MIN, C_R_MAX, C_SLEW, C_MIN_MOVE]] = self.r_min, self.r_max, self.max_slew, self.min_move

    def report(self, st) -> None:
        """Take the counters from the kernel's scalars."""
        self.non_finite, self.clamped, self.slewed = int(st[NON_FINITE]), int(st[CLAMPED]), int(st[SLEWED])
        self.settled = int(st[SETTLED])


@njit(cache=True, nogil=True, inline="always")
def limit(proposed, current, st, cfg):
    """The target, given the tiers' proposal and the ratio set last (assumed good)."""
    if not math.isfinite(proposed):
        st[NON_FINITE] += 1
        return current
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
    `min_move` of it (a target on r_min or r_max is always reached)."""
    if target != current and abs(target - current) < cfg[C_MIN_MOVE] and cfg[C_R_MIN] < target < cfg[C_R_MAX]:
        st[SETTLED] += 1
        return current
    return target
