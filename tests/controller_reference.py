"""The controller's slow, readable reference: each tier as a plain Python object, one step at a
time, from the same configuration objects the package's compiled controller reads
(helmgr.controller.{detect,safety,mlp}); adapter v2 learns in Python, so its object is
copied and fed the same samples. The compiled kernel is checked against it
decision for decision (tests/test_controller_kernel.py); the tiers' own properties are tested on
it (tests/test_detect.py, tests/test_controller_parts.py)."""
from __future__ import annotations

import copy
import math
import statistics
from collections import deque

import numpy as np

from helmgr.controller import detect as detect_cfg
from helmgr.controller import safety as safety_cfg
from helmgr.controller.mlp import MLPPolicy
from helmgr.controller.layout import MARGINAL_ALPHA
from helmgr.controller.observe import MEAN_ALPHA, MISS_PENALTY, MOVE_COST, N_FEATURES, P99_CAP
from helmgr.core.window import WindowStats


# -- observation and reward -------------------------------------------------------------------
def p99_over_slo(s: WindowStats) -> float:
    if s.p99_s is None or not math.isfinite(s.p99_s):
        return 0.0
    return min(s.p99_s / s.slo_s, P99_CAP)


def reward(s: WindowStats, moved: float, miss_penalty: float = MISS_PENALTY, move_cost: float = MOVE_COST) -> float:
    tail = p99_over_slo(s)
    return -tail - (miss_penalty if tail > 1.0 else 0.0) - move_cost * abs(moved)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else (0.0 if x != x else math.copysign(P99_CAP, x))


class Observer:
    """WindowStats -> the observation vector; keeps the long-run mean and the last arrival rate."""

    def __init__(self, mean_alpha: float = MEAN_ALPHA):
        self.mean_alpha = mean_alpha
        self.mean_rps: float | None = None
        self.prev_rps: float | None = None
        self.marginal_ms = 0.0                  # the counterfactual samples' EWMA, ms
        self.obs = np.zeros(N_FEATURES)

    def __call__(self, s: WindowStats, marginal: float | None = None) -> np.ndarray:
        rps = s.arrival_rps if math.isfinite(s.arrival_rps) and s.arrival_rps >= 0 else 0.0
        if self.mean_rps is None:
            self.mean_rps = self.prev_rps = rps
        scale = max(self.mean_rps, 1e-6)
        q = s.queue_len if math.isfinite(s.queue_len) and s.queue_len > 0 else 0.0
        values = (s.ratio, s.emb_hit_rate, s.kv_hit_rate, rps / scale, (rps - self.prev_rps) / scale,
                  math.log1p(q), p99_over_slo(s), s.h2d_utilization, s.new_user_share, s.emb_time_share)
        self.mean_rps += self.mean_alpha * (rps - self.mean_rps)
        self.prev_rps = rps
        if marginal is not None and math.isfinite(marginal):
            self.marginal_ms += MARGINAL_ALPHA * (min(P99_CAP, max(-P99_CAP, marginal * 1e3)) - self.marginal_ms)
        self.obs[:] = [_finite(v) for v in values] + [self.marginal_ms]
        return self.obs


# -- detection --------------------------------------------------------------------------------
class EwmaZ:
    """Running baseline of one signal: EWMA mean and variance with weight `alpha` per update."""

    def __init__(self, alpha: float = 0.1, floor: float = 1e-9, clip: float = 4.0, rel_floor: float = 0.1):
        self.alpha, self.floor, self.clip, self.rel_floor = alpha, floor, clip, rel_floor
        self.mean = self.var = 0.0
        self.n = 0

    def z(self, x: float) -> float:
        if self.n < 2:
            return 0.0
        return (x - self.mean) / math.sqrt(max(self.var, self.floor, (self.rel_floor * self.mean) ** 2))

    def update(self, x: float) -> None:
        if self.n == 0:
            self.mean = x
        else:
            d = x - self.mean
            if self.n >= 1 / self.alpha:                        # winsorize: outliers count as clip sigma
                lim = self.clip * math.sqrt(max(self.var, self.floor))
                d = -lim if d < -lim else (lim if d > lim else d)
            a = self.alpha if self.n >= 1 / self.alpha else 1.0 / (self.n + 1)   # plain mean while young
            self.mean += a * d
            self.var = (1 - a) * (self.var + a * d * d)
        self.n += 1


class Cusum:
    """One-sided (upward) CUSUM on z-scores: S = max(0, S + z - k); alarm when S > h."""

    def __init__(self, k: float = 1.0, h: float = 6.0):
        self.k, self.h, self.s = k, h, 0.0

    def step(self, z: float) -> bool:
        self.s = max(0.0, self.s + z - self.k)
        return self.s > self.h

    def reset(self) -> None:
        self.s = 0.0


class BurstDetector:
    """Burst on/off from several signals. `step(values)` returns "start", "end" or None. Takes the
    package's thresholds (`config`) or the same arguments."""

    def __init__(self, n_signals: int = 3, config: detect_cfg.BurstDetector | None = None, **kw):
        c = config or detect_cfg.BurstDetector(n_signals, **kw)
        self.base = [EwmaZ(c.alpha, floor=f, clip=c.clip, rel_floor=c.rel_floor) for f in c.floors]
        self.cusum = [Cusum(c.k, c.h) for _ in range(c.n_signals)]
        self.z_spike, self.z_exit = c.z_spike, c.z_exit
        self.exit_ticks, self.warmup_ticks = c.exit_ticks, c.warmup_ticks
        self.active = False
        self.recent: deque[float] = deque(maxlen=c.exit_ticks)    # the first signal's z, while active
        self.ticks = 0
        self.z = [0.0] * c.n_signals

    def step(self, values) -> str | None:
        self.ticks += 1
        zs = self.z
        warm = self.ticks > self.warmup_ticks          # before that the baseline is still forming
        for i, x in enumerate(values):
            zs[i] = z = self.base[i].z(x) if math.isfinite(x) else 0.0
            alarm = self.cusum[i].step(z) and i == 0 if warm else False
            if not self.active and warm and (alarm or z > self.z_spike):
                self.active = True
                self.recent.clear()
                return self._finish("start", values)
        if self.active:
            self.recent.append(zs[0])
            if len(self.recent) == self.exit_ticks and sum(self.recent) < self.z_exit * self.exit_ticks:
                self.active = False
                for c in self.cusum:
                    c.reset()
                return "end"
            return None
        return self._finish(None, values)

    def _finish(self, event, values):
        if not self.active:                 # the baseline learns only outside bursts
            for b, x in zip(self.base, values):
                if math.isfinite(x):
                    b.update(x)
        return event


# -- base policy ------------------------------------------------------------------------------
def forward(p: MLPPolicy, obs: np.ndarray) -> float:
    """The base policy's action, in plain numpy (a policy of fewer inputs reads the first ones)."""
    x = np.clip((obs[:p.n_obs] - p.obs_mean) / p.obs_std, -p.obs_clip, p.obs_clip)
    for k, (w, b) in enumerate(zip(p.w, p.b)):
        x = w @ x + b
        x = np.tanh(x) if k < len(p.w) - 1 else x
    return float(np.clip(x[0], -1.0, 1.0))


# -- safety -----------------------------------------------------------------------------------
def _within(v: float, lo: float, hi: float) -> bool:
    try:
        return math.isfinite(v) and lo <= v <= hi
    except (OverflowError, ValueError):     # an int too large for a float, a signaling NaN: not finite
        return False


def stats_ok(s: WindowStats) -> bool:
    """Whether a window's stats can be learned from: every value finite; ratio, hit rates, H2D
    utilization and EMB time share in [0, 1]; rates, P99 (None: no request) and queue >= 0; SLO > 0."""
    return (_within(s.ratio, 0.0, 1.0) and _within(s.arrival_rps, 0.0, math.inf)
            and (s.p99_s is None or _within(s.p99_s, 0.0, math.inf)) and _within(s.slo_s, 0.0, math.inf)
            and s.slo_s > 0.0 and _within(s.emb_hit_rate, 0.0, 1.0) and _within(s.kv_hit_rate, 0.0, 1.0)
            and _within(s.queue_len, 0.0, math.inf) and _within(s.h2d_utilization, 0.0, 1.0)
            and _within(s.new_user_share, 0.0, math.inf) and _within(s.emb_time_share, 0.0, 1.0))


class Safety:
    """Clamp, slew limit, non-finite fallback (`apply`), the min_move hysteresis (`settle`) and the
    answer to a refused window (`fallback`). Takes the package's limits (`config`) or the same
    arguments."""

    def __init__(self, config: safety_cfg.Safety | None = None, **kw):
        c = config or safety_cfg.Safety(**kw)
        self.r_min, self.r_max, self.max_slew, self.min_move = c.r_min, c.r_max, c.max_slew, c.min_move
        self.start = (c.r_min + c.r_max) / 2 if c.start is None else c.start
        self.non_finite = self.clamped = self.slewed = self.settled = self.bad_input = 0

    def clamp(self, r: float) -> float:
        return min(max(r, self.r_min), self.r_max)

    def fallback(self, reported: float, last: float | None) -> float:
        """A refused window: the ratio set last; before any, the reported ratio if it is one
        (clamped), else the start."""
        self.bad_input += 1
        if last is not None:
            return last
        return self.clamp(reported) if _within(reported, 0.0, 1.0) else self.clamp(self.start)

    def apply(self, proposed: float, last: float) -> float:
        if not math.isfinite(proposed):
            self.non_finite += 1
            return self.clamp(last)
        lo, hi = last - self.max_slew, last + self.max_slew
        if proposed < lo or proposed > hi:
            self.slewed += 1
            proposed = lo if proposed < lo else hi
        if proposed < self.r_min or proposed > self.r_max:
            self.clamped += 1
            proposed = self.r_min if proposed < self.r_min else self.r_max
        return proposed

    def settle(self, target: float, applied: float) -> float:
        if (target != applied and abs(target - applied) < self.min_move and self.r_min < target < self.r_max
                and self.r_min <= applied <= self.r_max):     # a node's ratio outside the bounds is never kept
            self.settled += 1
            return applied
        return target


# -- the controller ---------------------------------------------------------------------------
class ReferenceController:
    """`Controller.step` through the tier objects above, one by one, from a compiled controller's
    configuration (read before its first step; its own state is left alone)."""

    def __init__(self, ctl):
        self.base = ctl.base
        self.adapter = copy.deepcopy(ctl.adapter)
        self.detector = BurstDetector(config=ctl.detector) if ctl.detector is not None else None
        self.safety = Safety(config=ctl.safety)
        self.recovery_ratio, self.recovery_step = ctl.recovery_ratio, ctl.recovery_step
        self.recovery_hold, self.recovery_miss = ctl.recovery_hold, ctl.recovery_miss
        self.recovery_signal, self.stepped = ctl.recovery_signal, False
        self.recovery_samples, self.recovery_z = ctl.recovery_samples, ctl.recovery_z
        self.samples: list[float] = []          # the counterfactual samples since the plan last moved in a burst
        self.observer = Observer()
        self.hold: float | None = None
        self.last = self.target = self.plan = None
        self.recovering = False
        self.moved = 0.0
        self.windows = 0
        self.events: list[tuple[int, str]] = []

    def _hold_step(self) -> float:
        if not self.recovery_hold:
            return 0.0
        return max(self.recovery_ratio - self.safety.r_min, 0.0) / self.recovery_hold

    def _switch(self, stats: WindowStats, plan: float) -> None:
        self.detector.step((stats.arrival_rps, 1.0 - stats.emb_hit_rate, 1.0 - stats.kv_hit_rate))
        if self.detector.active and not self.recovering:
            self.recovering, self.hold, self.stepped, self.samples = True, None, False, []
            self.events.append((self.windows, "start"))
        elif self.recovering and not self.detector.active and p99_over_slo(stats) <= 1.0:
            self.recovering = False
            self.hold = plan if self._hold_step() > 0 else None
            self.events.append((self.windows, "end"))

    def _base_plan(self, plan: float, obs: np.ndarray, offset: float) -> float:
        if self.base is not None:
            step = forward(self.base, obs) * self.base.max_step
            if self.adapter is not None and self.adapter.hold_base and step * offset < 0:   # anti-windup
                step *= max(0.0, 1.0 - abs(offset) / self.adapter.bound)
            plan += step
        if self.hold is not None:                 # after a burst the plan decays, no faster
            self.hold -= self._hold_step()
            if self.hold <= self.safety.r_min:
                self.hold = None
            else:
                plan = max(plan, self.hold)
        return plan

    def _recover(self, stats: WindowStats, plan: float, marginal: float | None) -> float:
        if self.recovery_signal > 0 and marginal is not None:     # test the counterfactual samples
            self.samples.append(marginal)
            n = len(self.samples)
            if n >= self.recovery_samples:
                mean = statistics.fmean(self.samples)
                se = statistics.stdev(self.samples) / math.sqrt(n)
                if mean < -self.recovery_z * se:     # a larger EMB share would cost time: step down
                    self.stepped, self.samples = True, []
                    return plan - self.recovery_signal
        if self.stepped:
            return plan
        gap = self.recovery_ratio - plan
        if gap < 0 or not 1.0 - stats.emb_hit_rate <= self.recovery_miss:   # grow EMB only while it misses
            step = max(-self.recovery_step, min(self.recovery_step, gap))
            if step:
                self.samples = []               # taken at another split
            plan += step
        return plan

    def step(self, stats: WindowStats, marginal: float | None = None, load: float | None = None) -> float:
        if not stats_ok(stats):             # refused: counted, answered, and nothing else changes
            self.windows += 1
            return self.safety.fallback(stats.ratio, self.last)
        current = stats.ratio if self.last is None else self.last      # the ratio set last
        plan = current if self.plan is None else self.plan
        obs = self.observer(stats, marginal)
        obs[0] = plan                    # the learned tiers see the plan, not the node's ratio
        if self.detector is not None:
            self._switch(stats, plan)
        offset = 0.0
        if self.recovering:
            plan = self._recover(stats, plan, marginal)
        else:
            offset = self.adapter.offset if self.adapter is not None else 0.0
            plan = self._base_plan(plan, obs, offset)
        ratio = self.safety.apply(plan + offset, current)
        if ratio != plan + offset:          # clamped, slewed or non-finite: the plan is what was set
            plan = ratio - offset if math.isfinite(offset) else ratio
        self.plan = min(self.safety.r_max, max(self.safety.r_min, plan))
        self.target = ratio
        ratio = self.safety.settle(ratio, current)
        if self.adapter is not None:        # learning after the decision
            self.adapter.frozen = self.recovering
            self.adapter.learn(marginal, stats.arrival_rps if load is None else load)
        self.moved = ratio - current
        self.last = ratio
        self.windows += 1
        return ratio
