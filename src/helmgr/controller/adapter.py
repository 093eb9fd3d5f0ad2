"""The controller's tier 2, adapter v2: a bounded offset around the base tier's plan, learned
from the counterfactual marginal value of memory (`MarginalAdapter`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from helmgr.controller.layout import C_BOUND, C_HAS_AD, C_HOLD_BASE


@dataclass(slots=True, eq=False)
class MarginalAdapter:
    """Adapter v2: a bounded offset around the base tier's plan, learned from the counterfactual
    marginal value of memory (not from window rewards: one window's P99 is far too noisy a
    reward to follow, and a reward-driven adapter took no step in any measured run).

    A sample is the latency a larger EMB share would save, in seconds per request per unit of r
    (positive: grow EMB), priced from the two caches' shadows over a stretch of windows
    (`policy.policies.marginal_value`; the simulator's HELM policies hand one over per EMB
    refresh, when the EMB shadow's hits are folded in). Every `block` samples, if their mean is
    more than `z` standard errors from zero, the offset steps toward its sign, within ±`bound`;
    otherwise it stays. The step starts at `step`; each step in the same direction as the last
    one is `grow` times longer, up to `max_step`, and a turn starts again from `step` (Rprop's
    rule on the sign: far from the optimum the signal keeps its sign and the offset speeds up,
    at the optimum it turns and the steps shrink back; `grow` 1: a fixed step). So it needs no
    exploration noise (the decision adds the offset and nothing else) and, gated on the sign's
    significance, it holds still on the plateau where the signal is noise. It is a sign-stepped
    integrator: the signal is a slope at the current split, not a distance to the optimum (its
    size stays ≈ 1 ms/request/unit on the way to trend's 0.9), so a step proportional to it would
    move as fast far from and near to the optimum. It learns bias only: one scalar a sample says which way to go now, not how
    that depends on the features, and the base tier already moves with them.

    One such offset per load level (`load_width`: levels 20 % of arrival rate apart, a level
    left with a hysteresis): the split that is best moves with the load (trend's per-block best
    is 0.5 in its trough and 0.95 at its peak, docs/results/2026-12-02-trend-peak.md), and a
    single offset learned at one load was carried to the next: on trend it held −0.25 into the
    peak where the base alone was right, and cost 5 % of P99. A level not seen before starts at
    0, the base alone; steady traffic stays on one level and learns as with a single offset.
    The load is the caller's (`learn`'s `load`): HELM hands over the cluster's mean rate, since
    a node's own swings with the users the router homes on it (`HelmPolicy.level_load`).

    The bound is ±0.25: a wrong base to correct is one biased by ±0.15, the shipped base sits
    ≈ 0.2 above steady's best split, and a step here is taken on evidence, not on a noisy reward.
    The defaults (bound 0.25, steps 0.02 growing ×1.5 to 0.06; load levels 0.2 wide) were chosen
    on the tuning seeds 101-102
    (docs/results/2026-12-02-tiers.md, 2026-12-02-trend-peak.md).
    `params` (`[offset]`, what the compiled decision reads) is swapped whole, never edited:
    learning runs off the decision path, and a decision sees the old offset or the new one.

    `hold_base` (anti-windup): a base step against the offset (of the other sign) is scaled by
    1 - |offset| / bound, so nothing is left of it at the bound. The base is a relative policy,
    an integrator of its own steps; it sees its plan as the ratio feature, but the hit rates,
    the P99 and the link load it sees are those of plan + offset, so it reads the offset as its
    own error and steps against it. Two integrators with different rests wind up: on 720-s
    steady runs without the hold, every offset sat at the bound while the plan climbed past
    0.9, and the split drifted to 0.66 where static-best is 0.55-0.6
    (docs/results/2026-12-05-anti-windup.md)."""

    bound: float = 0.25
    step: float = 0.02
    block: int = 5
    z: float = 2.5
    grow: float = 1.5
    max_step: float | None = 0.06                    # None: step (a fixed step)
    load_width: float | None = 0.2                   # one offset per load level this wide (log scale); None: one
    load_alpha: float = 0.3                          # the level's rate: EWMA weight per sample (one EMB refresh, 2 s)
    load_hysteresis: float = 0.75                    # a level is left this many widths from its centre
    hold_base: bool = True                           # the base's steps against the offset shrink with it
    params: np.ndarray = field(init=False)
    offset: float = field(init=False, default=0.0)
    frozen: bool = field(init=False, default=False)
    updates: int = field(init=False, default=0)      # samples taken
    applied: int = field(init=False, default=0)      # blocks that moved the offset
    samples: list = field(init=False, default_factory=list)
    level: int | None = field(init=False, default=None)      # the load level whose offset is in effect
    levels: dict = field(init=False, default_factory=dict)   # level -> (offset, last_step) of the others
    _load: float | None = field(init=False, default=None)    # the arrival rate, EWMA over samples
    last_step: float = field(init=False, default=0.0)  # the last move (signed; 0 before any)

    def __post_init__(self):
        if not (self.bound > 0 and 0 < self.step <= self.bound):
            raise ValueError(f"adapter v2 needs bound > 0 and 0 < step <= bound, got {self.bound}, {self.step}")
        if not (self.block >= 2 and self.z >= 0):
            raise ValueError(f"adapter v2 needs block >= 2 samples and z >= 0, got {self.block}, {self.z}")
        self.block = int(self.block)
        if self.max_step is None:
            self.max_step = self.step
        if not (self.grow >= 1.0 and self.step <= self.max_step <= self.bound):
            raise ValueError(f"adapter v2 needs grow >= 1 and step <= max_step <= bound, got grow {self.grow}, "
                             f"max_step {self.max_step}")
        if not ((self.load_width is None or self.load_width > 0) and 0 < self.load_alpha <= 1
                and self.load_hysteresis >= 0.5):     # below 0.5 widths, leaving a level could round back to it
            raise ValueError(f"adapter v2 needs load_width > 0 (or None), 0 < load_alpha <= 1 and load_hysteresis "
                             f">= 0.5, got {self.load_width}, {self.load_alpha}, {self.load_hysteresis}")
        self.params = np.zeros(1)

    def configure(self, cfg) -> None:
        """Write the constants the decision reads into the kernel's `cfg` (it learns in Python)."""
        cfg[[C_HAS_AD, C_BOUND, C_HOLD_BASE]] = True, self.bound, self.hold_base

    def learn(self, sample: float | None, load: float | None = None) -> bool:
        """Take one sample (None or non-finite: none; frozen: ignored). True when a block moved
        the offset (or another load level's was swapped in), and `params` was swapped for the new
        one. `load`: the node's arrival rate now; with `load_width`, each load level (log(rate) /
        log(1 + width), rounded, left with a hysteresis) learns its own offset, and moving to
        another level swaps its offset in and drops the open block."""
        if self.frozen or sample is None or not math.isfinite(sample):
            return False
        swapped = self._relevel(load) if self.load_width is not None else False
        self.updates += 1
        self.samples.append(float(sample))
        if len(self.samples) < self.block:
            return swapped
        x = np.asarray(self.samples)
        self.samples = []
        mean, se = float(x.mean()), float(x.std(ddof=1)) / math.sqrt(len(x))
        if not abs(mean) > self.z * se:
            return swapped
        size = self.step
        if self.last_step and (self.last_step > 0) == (mean > 0):
            size = min(abs(self.last_step) * self.grow, self.max_step)
        offset = min(self.bound, max(-self.bound, self.offset + math.copysign(size, mean)))
        if offset == self.offset:
            return swapped
        self.last_step = math.copysign(size, mean)
        self.set(offset)
        self.applied += 1
        return True

    def set(self, offset: float) -> None:
        """Put `offset` (within ±bound) in effect: a new `params`, swapped in with one assignment."""
        self.offset = min(self.bound, max(-self.bound, float(offset)))
        self.params = np.array([self.offset])          # the swap

    def _relevel(self, load: float | None) -> bool:
        """Follow the load to its level; True when another level's offset was swapped in. A level
        not seen before starts at 0: the base alone, until its own evidence says otherwise."""
        if load is None or not (math.isfinite(load) and load > 0):
            return False
        self._load = load if self._load is None else self._load + self.load_alpha * (load - self._load)
        x = math.log(self._load) / math.log1p(self.load_width)
        if self.level is None:
            self.level = round(x)
            return False
        if abs(x - self.level) <= self.load_hysteresis:
            return False
        self.levels[self.level] = (self.offset, self.last_step)
        self.level = round(x)
        offset, self.last_step = self.levels.pop(self.level, (0.0, 0.0))
        self.samples = []
        if offset == self.offset:
            return False
        self.set(offset)
        return True
