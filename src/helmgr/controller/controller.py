"""The three-tier HELM controller for one node (SPEC 6), as a plain library object.

    ctl = helmgr.Controller.default()          # the shipped base policy, adapter and recovery on
    ratio = ctl.step(stats)                    # stats: a WindowStats of the node's last window

Each step: build the observation; run the burst detector on arrival rate and miss rates; then
- no burst: ratio + base policy step + adapter correction;
- burst: steer toward the recovery target, at most `recovery_step` per window (the base and the
  adapter are not consulted: transients must not push the learned tiers around);
and pass the proposal through Safety (finite, clamped, slew-limited). Only then, with the
decision made and its wall-clock latency recorded, the adapter learns from the reward of the
window the previous decision produced (never during a burst). Burst start/end events are kept.
"""
from __future__ import annotations

import time
from importlib import resources
from pathlib import Path

import numpy as np

from helmgr.controller.adapter import ResidualAdapter
from helmgr.controller.detect import BurstDetector
from helmgr.controller.mlp import MLPPolicy
from helmgr.controller.observe import N_FEATURES, Observer, WindowStats, reward
from helmgr.controller.safety import Safety
from helmgr.errors import HelmInputError

DEFAULT_POLICY = "default_policy.npz"


class Controller:
    def __init__(self, base: MLPPolicy | None, adapter: ResidualAdapter | None = None,
                 detector: BurstDetector | None = None, safety: Safety | None = None,
                 recovery_ratio: float = 0.85, recovery_step: float = 0.1):
        if base is not None and base.n_obs != N_FEATURES:
            raise ValueError(f"base policy takes {base.n_obs} observations, the controller gives {N_FEATURES}")
        self.base, self.adapter, self.detector = base, adapter, detector
        self.safety = safety or Safety(max_slew=0.1)
        self.recovery_ratio, self.recovery_step = recovery_ratio, recovery_step
        self.observer = Observer()
        self.last: float | None = None          # the last ratio this controller set
        self.moved = 0.0
        self.windows = 0
        self.events: list[tuple[int, str]] = []   # (window, "start" | "end")
        self.latency_ns: list[int] = []

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
    def step(self, stats: WindowStats) -> float:
        t0 = time.perf_counter_ns()
        current = stats.ratio if self.last is None else self.last
        obs = self.observer(stats)
        burst = False
        if self.detector is not None:
            event = self.detector.step((stats.arrival_rps, 1.0 - stats.emb_hit_rate, 1.0 - stats.kv_hit_rate))
            if event is not None:
                self.events.append((self.windows, event))
            burst = self.detector.active
        if self.adapter is not None:
            self.adapter.frozen = burst
        if burst:
            gap = self.recovery_ratio - current
            proposed = current + max(-self.recovery_step, min(self.recovery_step, gap))
        else:
            proposed = current + (self.base.step(obs) if self.base is not None else 0.0)
            if self.adapter is not None:
                proposed += self.adapter.decide(obs)
        ratio = self.safety.apply(proposed, current)
        self.latency_ns.append(time.perf_counter_ns() - t0)
        # learning, after the decision (its latency above leaves it out): the window just seen is
        # the outcome of the previous decision
        if self.adapter is not None and self.windows:
            self.adapter.learn(reward(stats, self.moved))
        self.moved = ratio - current
        self.last = ratio
        self.windows += 1
        return ratio
