"""The three-tier HELM controller for one node (SPEC 6), as a plain library object.

    ctl = helmgr.Controller.default()          # the shipped base policy, adapter and recovery on
    ratio = ctl.step(stats)                    # stats: a WindowStats of the node's last window

Each step: build the observation; run the burst detector on arrival rate and miss rates; then
- no burst: the plan (the base tier's ratio) moves by the base policy's step, and the adapter's
  correction is added on top of the plan: the adapter is a bounded *offset* (±0.05 by default)
  around the base tier's trajectory, never a step of its own, so it cannot walk the ratio away;
- recovery: the plan steers toward the recovery target, at most `recovery_step` per window, and
  the adapter is left out (transients must not push the learned tiers around). It grows the
  EMB cache only while the window's EMB miss rate is above `recovery_miss` (default 0.01): a
  burst of cold users needs their rows, not their (absent) prefixes, but once the EMB cache
  holds nearly everything (H200) more of it buys nothing and costs returning users their KV.
  (A stack that does not report the EMB hit rate leaves it at 1.0: no growth.) Recovery starts
  on the detector's burst and hands back with hysteresis: only once the detector has seen the
  burst end *and* the node is back under its SLO (the backlog a burst leaves is part of it);
  after the hand-back the plan falls no faster than a floor that decays from the hand-back plan
  to r_min over `recovery_hold` windows (bursts come in clusters: keep the split just built);
then pass the proposal through Safety (finite, clamped, slew-limited: the *target*), which moves
the node's ratio to the target only once the two are `min_move` apart (a resize's churn costs
more than a small step earns; default 0.03). Only then, with the decision made and its
wall-clock latency recorded, the adapter learns from the reward of the window the previous
decision produced (never during recovery): the noise of the decision just made is credited with
the next window's reward, the window it sets. Start/end events are kept.

The learned tiers see the *plan* as the ratio feature, not the node's ratio: the base policy
closes its loop on its own trajectory, as in training (where the two were the same). Fed the
node's ratio, it read the adapter's offset as its own error and stepped the plan the other way:
an adapter held at +0.05 moved the plan to 0.397 and the node to 0.447, where the base alone
sits at 0.445 (steady, seed 1, 60 s) — the offset was cancelled, so the adapter could not change
the split at all.

`step` runs all of that up to the decision as one compiled call (`helmgr.controller.kernel`),
and the adapter's learning after it as another; `reference_step` runs the same tiers as the
readable Python objects, one by one. They decide the same ratios (tested); the objects hold the
configuration either way, and their running state advances only on the path that is used.
"""
from __future__ import annotations

import math
import time
from importlib import resources
from pathlib import Path

import numpy as np

from helmgr.controller.adapter import NOISE_BATCH, ResidualAdapter
from helmgr.controller import kernel as K
from helmgr.controller.detect import BurstDetector
from helmgr.controller.mlp import MLPPolicy
from helmgr.controller.observe import (MISS_PENALTY, MOVE_COST, N_FEATURES, Observer, WindowStats, p99_over_slo,
                                      reward)
from helmgr.controller.safety import Safety
from helmgr.core.errors import HelmInputError

DEFAULT_POLICY = "default_policy.npz"
MIN_MOVE = 0.03        # the node's ratio follows the target only in moves of at least this (Safety.settle)


class Controller:
    def __init__(self, base: MLPPolicy | None, adapter: ResidualAdapter | None = None,
                 detector: BurstDetector | None = None, safety: Safety | None = None,
                 recovery_ratio: float = 0.85, recovery_step: float = 0.1, recovery_hold: float = 60.0,
                 recovery_miss: float = 0.01):
        if base is not None and base.n_obs != N_FEATURES:
            raise ValueError(f"base policy takes {base.n_obs} observations, the controller gives {N_FEATURES}")
        self.base, self.adapter, self.detector = base, adapter, detector
        self.safety = safety or Safety(max_slew=0.1, min_move=MIN_MOVE)
        if not recovery_hold >= 0:
            raise ValueError(f"recovery_hold must be >= 0 windows, got {recovery_hold}")
        if not 0.0 <= recovery_miss <= 1.0:
            raise ValueError(f"recovery_miss must be an EMB miss rate in [0, 1], got {recovery_miss}")
        self.recovery_ratio, self.recovery_step, self.recovery_hold = recovery_ratio, recovery_step, recovery_hold
        self.recovery_miss = recovery_miss
        self.hold: float | None = None         # after a burst: the floor under the plan, decaying
        self.observer = Observer()
        self.last: float | None = None          # the last ratio this controller set
        self.target: float | None = None        # the tiers' last ratio after clamp and slew (`last` follows it in
                                                # moves of at least min_move)
        self.plan: float | None = None          # the base (or recovery) tier's ratio, before the adapter
        self.recovering = False
        self.moved = 0.0
        self.windows = 0
        self.events: list[tuple[int, str]] = []   # (window, "start" | "end")
        self.latency_ns: list[int] = []
        self._k: tuple | None = None              # the kernel's arrays, built at the first step

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def load(cls, path, adapter: bool = True, recovery: bool = True, seed: int = 0, **kw) -> "Controller":
        """A controller around the base policy in `path` (an exported .npz)."""
        base = MLPPolicy.load(path)
        return cls(base, ResidualAdapter(N_FEATURES, rng=np.random.default_rng(seed)) if adapter else None,
                   BurstDetector(3) if recovery else None, **kw)

    @classmethod
    def default(cls, **kw) -> "Controller":
        """The base policy that ships with the package (docs/controller.md says how it was trained)."""
        ref = resources.files("helmgr.controller") / DEFAULT_POLICY
        if not ref.is_file():
            raise HelmInputError("no default policy ships with this build; pass one: "
                                 "Controller.load(PATH) (make one with `helmgr train --out PATH`)")
        with resources.as_file(ref) as path:
            return cls.load(Path(path), **kw)

    # -- the decision ---------------------------------------------------------------------
    def _kernel_arrays(self) -> tuple:
        d, a, sf, b = self.detector or BurstDetector(3), self.adapter, self.safety, self.base
        if len(d.base) != K.N_SIG:
            raise ValueError(f"the compiled step watches {K.N_SIG} signals, the detector {len(d.base)}")
        flat, dims, h = (b.flat, b.dims, b.scratch) if b else (np.zeros(1), np.zeros(1, np.int64), np.zeros(2))
        mem, views = K.layout(d.exit_ticks, len(h), NOISE_BATCH if a is not None else 0)
        st, cfg, lc, _, det = views[:5]
        cfg[[K.C_OB_ALPHA, K.C_ALPHA, K.C_CLIP, K.C_K, K.C_H, K.C_Z_SPIKE, K.C_Z_EXIT, K.C_EXIT_TICKS,
             K.C_WARMUP, K.C_HAS_DET]] = (self.observer.mean_alpha, d.base[0].alpha, d.base[0].clip,
                                          d.cusum[0].k, d.cusum[0].h, d.z_spike, d.z_exit, d.exit_ticks,
                                          d.warmup_ticks, self.detector is not None)
        det[:, K.D_FLOOR] = [b.floor for b in d.base]
        cfg[[K.C_HAS_BASE, K.C_MAX_STEP, K.C_HAS_AD, K.C_BOUND, K.C_EXPLORE, K.C_R_MIN, K.C_R_MAX, K.C_SLEW,
             K.C_REC_RATIO, K.C_REC_STEP]] = (b is not None, b.max_step if b else 0.0, a is not None,
                                              a.bound if a else 0.0, bool(a and a.explore), sf.r_min, sf.r_max,
                                              sf.max_slew, self.recovery_ratio, self.recovery_step)
        cfg[K.C_REL_FLOOR] = d.base[0].rel_floor
        cfg[K.C_HOLD_STEP] = self._hold_step()
        cfg[K.C_MIN_MOVE] = sf.min_move
        cfg[K.C_REC_MISS] = self.recovery_miss
        st[[K.LAST, K.PLAN, K.HOLD, K.APPLIED]] = np.nan
        if a is not None:
            lc[[K.L_LR, K.L_SIGMA2, K.L_BASELINE_ALPHA, K.L_MISS_PENALTY, K.L_MOVE_COST, K.L_BLOCK, K.L_Z]] = (
                a.lr, a.sigma**2, a.baseline_alpha, MISS_PENALTY, MOVE_COST, a.block, a.z)
        return mem, flat, dims, np.zeros(a.params.shape if a is not None else 1), views   # spare: see step

    def _hold_step(self) -> float:
        """How far the post-burst floor falls a window: from the recovery ratio to r_min in
        `recovery_hold` windows (0: no floor)."""
        if not self.recovery_hold:
            return 0.0
        return max(self.recovery_ratio - self.safety.r_min, 0.0) / self.recovery_hold

    def step(self, stats: WindowStats) -> float:
        """The next ratio for the window `stats` describes (one compiled call up to the decision)."""
        t0 = time.perf_counter_ns()
        if self._k is None:
            self._k = self._kernel_arrays()
        mem, flat, dims, spare, views = self._k
        st, s, a = views[0], stats, self.adapter
        if a is not None and st[K.NOISE_I] == 0:         # the adapter's next batch of exploration noise
            noise = views[-1]
            noise[:] = a.rng.normal(0.0, a.sigma, len(noise))
            st[K.NOISE_I] = len(noise)
        current = s.ratio if self.last is None else self.last
        ratio = K.decide(mem, flat, dims, spare if a is None else a.params, s.ratio, s.arrival_rps,
                         math.nan if s.p99_s is None else s.p99_s, s.slo_s, s.emb_hit_rate, s.kv_hit_rate,
                         s.queue_len, s.h2d_utilization, s.new_user_share, s.emb_time_share)
        self.latency_ns.append(time.perf_counter_ns() - t0)
        event = st[K.EVENT]
        if event:
            self.events.append((self.windows, "start" if event == 1 else "end"))
            self.recovering = event == 1
        sf = self.safety
        sf.non_finite, sf.clamped, sf.slewed = int(st[K.NON_FINITE]), int(st[K.CLAMPED]), int(st[K.SLEWED])
        sf.settled = int(st[K.SETTLED])
        self.plan, self.target = st[K.PLAN], st[K.LAST]
        self.hold = None if math.isnan(st[K.HOLD]) else float(st[K.HOLD])
        if a is not None:
            a.frozen = self.recovering
            # learning, compiled too, after the decision, into the spare array (the next parameters)
            if K.learn(mem, a.params, spare, self.moved if self.windows else 0.0):
                a.params = spare                     # the atomic swap; a fresh spare for the next one
                self._k = self._k[:3] + (np.empty_like(spare), views)
            a.updates, a.applied = int(st[K.UPDATES]), int(st[K.BLOCKS_APPLIED])
            a.baseline = st[K.BASELINE] if st[K.HAS_BASELINE] else None
        return self._after(stats, current, ratio, learned=True)

    def reference_step(self, stats: WindowStats) -> float:
        """`step` through the tier objects one by one: the readable reference (~25 µs)."""
        t0 = time.perf_counter_ns()
        current = stats.ratio if self.last is None else self.last      # the ratio set last
        plan = current if self.plan is None else self.plan
        obs = self.observer(stats)
        obs[0] = plan                    # the learned tiers see the plan, not the node's ratio
        if self.detector is not None:
            self.detector.step((stats.arrival_rps, 1.0 - stats.emb_hit_rate, 1.0 - stats.kv_hit_rate))
            if self.detector.active and not self.recovering:
                self.recovering, self.hold = True, None
                self.events.append((self.windows, "start"))
            elif self.recovering and not self.detector.active and p99_over_slo(stats) <= 1.0:
                self.recovering = False
                self.hold = plan if self._hold_step() > 0 else None
                self.events.append((self.windows, "end"))
        if self.adapter is not None:
            self.adapter.frozen = self.recovering
        offset = 0.0
        if self.recovering:
            gap = self.recovery_ratio - plan
            if gap < 0 or not 1.0 - stats.emb_hit_rate <= self.recovery_miss:   # grow EMB only while it misses
                plan += max(-self.recovery_step, min(self.recovery_step, gap))
        else:
            if self.base is not None:
                plan += self.base.step(obs)
            if self.hold is not None:                 # after a burst the plan decays, no faster
                self.hold -= self._hold_step()
                if self.hold <= self.safety.r_min:
                    self.hold = None
                else:
                    plan = max(plan, self.hold)
            if self.adapter is not None:
                offset = self.adapter.decide(obs)
        ratio = self.safety.apply(plan + offset, current)
        if ratio != plan + offset:          # clamped, slewed or non-finite: the plan is what was set
            plan = ratio - offset if math.isfinite(offset) else ratio
        self.plan = min(self.safety.r_max, max(self.safety.r_min, plan))
        self.target = ratio
        ratio = self.safety.settle(ratio, current)
        self.latency_ns.append(time.perf_counter_ns() - t0)
        return self._after(stats, current, ratio)

    def _after(self, stats: WindowStats, current: float, ratio: float, learned: bool = False) -> float:
        # `current`: the ratio set before this decision; `ratio`: the one set now
        # learning, after the decision (its latency above leaves it out): the window just seen is
        # the outcome of the previous decision
        if self.adapter is not None and not learned:   # credits the previous decision, keeps this one's
            self.adapter.learn(reward(stats, self.moved) if self.windows else math.nan)
        self.moved = ratio - current
        self.last = ratio
        self.windows += 1
        return ratio
