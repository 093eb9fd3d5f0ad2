"""The online residual adapter (the controller's tier 2): a small correction added to the base tier's plan.

`output = bound * tanh(w . x + b)`, so it never moves the ratio by more than `bound` (default
0.05) on its own, and with `w = b = 0` at start it is an exact no-op. It learns from window
rewards by REINFORCE on a Gaussian exploration: each decision adds noise `eps ~ N(0, sigma^2)`
to the output and remembers it; when the reward of the window that decision set arrives, the
gradient estimate is `(reward - baseline) * eps / sigma^2 * d output / d params` (baseline: an
EWMA of rewards). The controller learns right after a decision, from the window just seen: the
outcome of the *previous* decision, which is the one credited.

It moves only on evidence: the estimates are summed over a block of `block` windows (default
60), and a parameter takes its block's step (`lr` times the sum, what per-window steps would
have added up to) only where the block's mean estimate is more than `z` (default 4) standard
errors from zero. One window's P99 is far too noisy a reward to follow step by step: ungated,
the parameters random-walk on noise, and an offset that moves the node costs P99; gated, an
adapter that has seen no consistent signal stays an exact no-op. The z is high because each
estimate is a product of two Gaussians, heavy-tailed, so the normal approximation's tails are
too thin.

Learning runs off the decision path: it writes a new parameter array (`[w..., b]`) that the
controller swaps in with one assignment (atomic under the GIL), and a decision reads the current
array once, so it never sees half an update. The recovery tier freezes learning during bursts.

`ResidualAdapter` holds the constants, the parameters and the exploration rng; `offset` and
`learn` are the compiled code, on the controller's memory (helmgr.controller.layout).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from helmgr.controller.layout import (BASELINE, BLOCKS_APPLIED, C_BOUND, C_EXPLORE, C_HAS_AD, C_HOLD_BASE, DZ, EPS,
                                      G_K, G_SQ, G_SUM, HAS_BASELINE, L_BASELINE_ALPHA, L_BLOCK, L_LR, L_MISS_PENALTY,
                                      L_MOVE_COST, L_SIGMA2, L_Z, N_FEATURES, NOISE_I, OBS, RECOVERING, T_DZ, T_EPS,
                                      T_HAS, T_OBS, UPDATES)

NOISE_BATCH = 4096      # exploration noise is drawn this many at a time


@dataclass(slots=True, eq=False)
class ResidualAdapter:
    """The adapter's constants and state: `params` is swapped whole, never edited; `updates`
    (gradient estimates taken), `applied` (blocks that changed the parameters), `baseline` and
    `frozen` are the controller's report of its running state."""

    n_features: int
    bound: float = 0.05
    lr: float = 0.01
    sigma: float = 0.005
    baseline_alpha: float = 0.1
    block: int = 60
    z: float = 4.0
    rng: np.random.Generator | None = None
    explore: bool = True
    params: np.ndarray = field(init=False)
    frozen: bool = field(init=False, default=False)
    baseline: float | None = field(init=False, default=None)
    updates: int = field(init=False, default=0)
    applied: int = field(init=False, default=0)

    def __post_init__(self):
        if not self.bound > 0 or not self.sigma > 0:
            raise ValueError(f"adapter needs bound > 0 and sigma > 0, got {self.bound}, {self.sigma}")
        if not (self.block >= 2 and self.z >= 0):
            raise ValueError(f"adapter needs block >= 2 windows and z >= 0, got {self.block}, {self.z}")
        self.block = int(self.block)
        self.params = np.zeros(self.n_features + 1)
        if self.rng is None:
            self.rng = np.random.default_rng(0)

    def configure(self, cfg, lc, miss_penalty: float, move_cost: float) -> None:
        """Write the constants into the kernel's `cfg` and `lc`."""
        cfg[[C_HAS_AD, C_BOUND, C_EXPLORE]] = True, self.bound, self.explore
        lc[[L_LR, L_SIGMA2, L_BASELINE_ALPHA, L_MISS_PENALTY, L_MOVE_COST, L_BLOCK, L_Z]] = (
            self.lr, self.sigma**2, self.baseline_alpha, miss_penalty, move_cost, self.block, self.z)


@njit(cache=True, nogil=True, inline="always")
def offset(obs, ad, st, cfg, noise):
    """The correction for `obs` under parameters `ad`, with the next exploration noise added
    (and noted for learning) while exploring."""
    n = obs.shape[0]
    z = ad[n]
    for i in range(n):
        z += ad[i] * obs[i]
    t = math.tanh(z)
    out = cfg[C_BOUND] * t
    if cfg[C_EXPLORE] != 0.0:
        k = int(st[NOISE_I]) - 1                # the batch is used from its end
        st[NOISE_I] = k
        eps = noise[k]
        st[EPS], st[DZ] = eps, cfg[C_BOUND] * (1.0 - t * t)
        out += eps
    return out


@njit(cache=True, nogil=True)
def _estimate(st, lc, r, n):
    """The previous decision's gradient estimate for reward r, into the block (False: r set the
    first baseline)."""
    if st[HAS_BASELINE] == 0.0:
        st[BASELINE], st[HAS_BASELINE] = r, 1.0
        return False
    advantage = r - st[BASELINE]
    st[BASELINE] += lc[L_BASELINE_ALPHA] * advantage
    g = advantage * st[T_EPS] / lc[L_SIGMA2] * st[T_DZ]
    for i in range(n + 1):
        gi = g * st[T_OBS + i] if i < n else g
        st[G_SUM + i] += gi
        st[G_SQ + i] += gi * gi
    st[UPDATES] += 1
    st[G_K] += 1
    return True


@njit(cache=True, nogil=True)
def _close_block(st, lc, old, new):
    """A full block: each parameter steps by lr times the block's sum where the block's mean is
    significant, into `new`; 1 if any did."""
    k = st[G_K]
    updated = 0
    for i in range(old.shape[0]):
        total = st[G_SUM + i]
        mean = total / k
        se = math.sqrt(max(st[G_SQ + i] - k * mean * mean, 0.0) / (k - 1) / k)
        if abs(mean) > lc[L_Z] * se:
            updated = 1
            new[i] = old[i] + lc[L_LR] * total
        else:
            new[i] = old[i]
        st[G_SUM + i] = st[G_SQ + i] = 0.0
    st[G_K] = 0.0
    st[BLOCKS_APPLIED] += updated
    return updated


@njit(cache=True, nogil=True)
def learn(st, lc, r, old, new):
    """Credit reward r to the previous decision's noise; then the decision just made becomes the
    one awaiting a reward. Writes the next parameters into `new` and returns 1 when a block
    changes them; otherwise returns 0 (`new` is scratch)."""
    updated = 0
    if st[T_HAS] != 0.0 and st[RECOVERING] == 0.0 and math.isfinite(r):
        if _estimate(st, lc, r, old.shape[0] - 1) and st[G_K] >= lc[L_BLOCK]:
            updated = _close_block(st, lc, old, new)
    if math.isnan(st[EPS]):                 # no exploration in this decision: nothing to credit
        st[T_HAS] = 0.0
    else:
        st[T_HAS], st[T_EPS], st[T_DZ] = 1.0, st[EPS], st[DZ]
        for i in range(N_FEATURES):
            st[T_OBS + i] = st[OBS + i]
    return updated


@dataclass(slots=True, eq=False)
class MarginalAdapter:
    """Adapter v2: the same bounded offset around the base tier's plan, learned from the
    counterfactual marginal value of memory instead of from window rewards.

    A sample is the latency a larger EMB share would save, in seconds per request per unit of r
    (positive: grow EMB), priced from the two caches' shadows over a stretch of windows
    (`policy.policies.marginal_value`; the simulator's HELM policies hand one over per EMB
    refresh, when the EMB shadow's hits are folded in). Every `block` samples, if their mean is
    more than `z` standard errors from zero, the offset steps toward its sign, within ±`bound`;
    otherwise it stays. The step starts at `step`; each step in the same direction as the last
    one is `grow` times longer, up to `max_step`, and a turn starts again from `step` (Rprop's
    rule on the sign: far from the optimum the signal keeps its sign and the offset speeds up,
    at the optimum it turns and the steps shrink back; `grow` 1: a fixed step). So it needs no
    exploration noise (`explore` is False: the decision adds the offset and nothing else) and,
    gated on the sign's significance, it holds still on the plateau where the signal is noise. It is a sign-stepped integrator: the signal is
    a slope at the current split, not a distance to the optimum (its size stays ≈ 1 ms/request/unit
    on the way to trend's 0.9), so a step proportional to it would move as fast far from and near
    to the optimum. It learns bias only: one scalar a sample says which way to go now, not how
    that depends on the features, and the base tier already moves with them.

    One such offset per load level (`load_width`: levels 20 % of arrival rate apart, a level
    left with a hysteresis): the split that is best moves with the load (trend's per-block best
    is 0.5 in its trough and 0.95 at its peak, docs/results/2026-12-02-trend-peak.md), and a
    single offset learned at one load was carried to the next: on trend it held −0.25 into the
    peak where the base alone was right, and cost 5 % of P99. A level not seen before starts at
    0, the base alone; steady traffic stays on one level and learns as with a single offset.
    The load is the caller's (`learn`'s `load`): HELM hands over the cluster's mean rate, since
    a node's own swings with the users the router homes on it (`HelmPolicy.level_load`).

    The bound is ±0.25 (v1: ±0.05): issue 22's test of a wrong base is one biased by ±0.15,
    the shipped base sits ≈ 0.2 above steady's best split, and a step here is taken on evidence,
    not on a noisy reward. The defaults (bound 0.25, steps 0.02 growing ×1.5 to 0.06; load levels
    0.2 wide) were chosen on the tuning seeds 101-102
    (docs/results/2026-12-02-tiers.md, 2026-12-02-trend-peak.md).
    `params` is swapped whole (`[0..., atanh(offset / bound)]`, what the kernel's `offset`
    reads), never edited.

    `hold_base` (anti-windup): a base step against the offset (of the other sign) is scaled by
    1 - |offset| / bound, so nothing is left of it at the bound. The base is a relative policy,
    an integrator of its own steps; it sees its plan as the ratio feature, but the hit rates,
    the P99 and the link load it sees are those of plan + offset, so it reads the offset as its
    own error and steps against it. Two integrators with different rests wind up: on 720-s
    steady runs without the hold, every offset sat at the bound while the plan climbed past
    0.9, and the split drifted to 0.66 where static-best is 0.55-0.6
    (docs/results/2026-12-05-anti-windup.md)."""

    n_features: int
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
    explore: bool = field(init=False, default=False)
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
        self.params = np.zeros(self.n_features + 1)

    def configure(self, cfg, lc, miss_penalty: float, move_cost: float) -> None:
        """Write the constants the decision reads into the kernel's `cfg` (it learns in Python)."""
        cfg[[C_HAS_AD, C_BOUND, C_EXPLORE, C_HOLD_BASE]] = True, self.bound, False, self.hold_base

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
        self.offset = offset
        self._swap()
        self.applied += 1
        return True

    def _swap(self) -> None:
        params = np.zeros(self.n_features + 1)
        params[-1] = math.atanh(max(-1.0 + 1e-12, min(1.0 - 1e-12, self.offset / self.bound)))
        self.params = params                   # the swap

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
        self.offset = offset
        self._swap()
        return True
