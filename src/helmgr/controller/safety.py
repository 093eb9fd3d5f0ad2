"""The last step of every controller decision (SPEC 6, safety): whatever the tiers propose, the
ratio that leaves is finite, inside [r_min, r_max], and at most `max_slew` from the last one.

Then a hysteresis (`settle`): a node's ratio moves only when the tiers' target has moved at least
`min_move` away from it. A resize is not free: shrinking a cache drops the rows or prefixes at its
margin, and growing it back fetches them again, so a ratio that wanders 0.005 a window pays for
churn and buys nothing (docs/controller.md: ±0.006 of jitter a window around a fixed split costs
9 % of P99). The target keeps moving underneath, so small steps add up to one move.
"""
from __future__ import annotations

import math


class Safety:
    def __init__(self, r_min: float = 0.05, r_max: float = 0.95, max_slew: float = 0.05, min_move: float = 0.0):
        if not (0.0 <= r_min < r_max <= 1.0):
            raise ValueError(f"safety needs 0 <= r_min < r_max <= 1, got {r_min}, {r_max}")
        if not max_slew > 0:
            raise ValueError(f"max_slew must be > 0, got {max_slew}")
        if not 0.0 <= min_move <= max_slew:
            raise ValueError(f"min_move must be in [0, max_slew = {max_slew}], got {min_move}")
        self.r_min, self.r_max, self.max_slew, self.min_move = r_min, r_max, max_slew, min_move
        self.non_finite = 0             # proposals that were NaN or infinite (kept the last ratio)
        self.clamped = 0                # proposals outside [r_min, r_max]
        self.slewed = 0                 # proposals further than max_slew from the last ratio
        self.settled = 0                # targets under min_move from the node's ratio (not moved)

    def apply(self, proposed: float, last: float) -> float:
        """The target, given the tiers' proposal and the last ratio set (assumed good)."""
        if not math.isfinite(proposed):
            self.non_finite += 1
            return last
        lo, hi = last - self.max_slew, last + self.max_slew
        if proposed < lo or proposed > hi:
            self.slewed += 1
            proposed = lo if proposed < lo else hi
        if proposed < self.r_min or proposed > self.r_max:
            self.clamped += 1
            proposed = self.r_min if proposed < self.r_min else self.r_max
        return proposed

    def settle(self, target: float, applied: float) -> float:
        """The ratio to set: `target`, or the node's ratio `applied` while the target is within
        `min_move` of it (a target on r_min or r_max is always reached)."""
        if target != applied and abs(target - applied) < self.min_move and self.r_min < target < self.r_max:
            self.settled += 1
            return applied
        return target
