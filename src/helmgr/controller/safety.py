"""The last step of every controller decision (SPEC 6, safety): whatever the tiers propose, the
ratio that leaves is finite, inside [r_min, r_max], and at most `max_slew` from the last one."""
from __future__ import annotations

import math


class Safety:
    def __init__(self, r_min: float = 0.05, r_max: float = 0.95, max_slew: float = 0.05):
        if not (0.0 <= r_min < r_max <= 1.0):
            raise ValueError(f"safety needs 0 <= r_min < r_max <= 1, got {r_min}, {r_max}")
        if not max_slew > 0:
            raise ValueError(f"max_slew must be > 0, got {max_slew}")
        self.r_min, self.r_max, self.max_slew = r_min, r_max, max_slew
        self.non_finite = 0             # proposals that were NaN or infinite (kept the last ratio)
        self.clamped = 0                # proposals outside [r_min, r_max]
        self.slewed = 0                 # proposals further than max_slew from the last ratio

    def apply(self, proposed: float, last: float) -> float:
        """The ratio to set, given the tiers' proposal and the last ratio set (assumed good)."""
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
