"""The three-tier HELM controller for one node, as a plain library object.

    ctl = helmgr.Controller.default()          # the shipped HELM: base policy, adapter v2, recovery
    ratio = ctl.step(stats, marginal, load)    # stats: a WindowStats of the node's last window;
                                               # marginal: adapter v2's sample if one closed (or None)

Each step: check the window's stats (a non-finite or impossible value: the window is refused,
counted and answered by Safety's fallback, and nothing below sees it; safety.py); build the
observation; run the burst detector on arrival rate and miss rates; then
- no burst: the plan (the base tier's ratio) moves by the base policy's step, and the adapter's
  correction is added on top of the plan: the adapter is a bounded *offset* (±0.25) around the
  base tier's trajectory, never a step of its own, so it cannot walk the ratio away;
- recovery: the plan steers toward the recovery target, at most `recovery_step` per window, and
  the adapter is left out (transients must not push the learned tiers around). It grows the
  EMB cache only while the window's EMB miss rate is above `recovery_miss` (default 0.01): a
  burst of cold users needs their rows, not their (absent) prefixes, but once the EMB cache
  holds nearly everything more of it buys nothing and costs returning users their KV. (A stack
  that does not report the EMB hit rate leaves it at 1.0: no growth.) And adapter v2's
  counterfactual samples in a burst are tested: once `recovery_samples` of them since the plan
  last moved have a mean more than `recovery_z` standard errors below zero (a larger EMB share
  would cost time), the plan steps down by `recovery_signal` and the miss rule is off for the
  rest of the burst. The miss rate's threshold reads differently on every GPU; the signal is
  priced in seconds. Recovery starts on the
  detector's burst and hands back with hysteresis: only once the detector has seen the burst
  end *and* the node is back under its SLO (the backlog a burst leaves is part of it); after
  the hand-back the plan falls no faster than a floor that decays from the hand-back plan to
  r_min over `recovery_hold` windows (bursts come in clusters: keep the split just built);
then pass the proposal through Safety (finite, clamped, slew-limited: the *target*), which moves
the node's ratio to the target only once the two are `min_move` apart (a resize's churn costs
more than a small step earns; default 0.03). Only then, with the decision made and its
wall-clock latency recorded, the adapter learns from the window's counterfactual sample (never
during recovery). Start/end events are kept.

The learned tiers see the *plan* as the ratio feature, not the node's ratio: the base policy
closes its loop on its own trajectory, as in training (where the two were the same); fed the
node's ratio, it would read the adapter's offset as its own error and cancel it. Its other
features still come from the node's split, so adapter v2 also scales down the base's steps
against its offset (`MarginalAdapter.hold_base`: anti-windup).

The decision is one compiled call (`helmgr.controller.kernel.decide`) on one array of running
state built at the first step; the adapter learns after it, in Python, off the decision's
clock. The tier objects (`base`, `adapter`, `detector`, `safety`) hold the configuration; after
each step the controller copies the kernel's counters back into them (`safety.slewed`...).
"""
from __future__ import annotations

import math
import time
from importlib import resources
from pathlib import Path

import numpy as np

from helmgr.controller import kernel as K
from helmgr.controller import layout as L
from helmgr.controller.adapter import MarginalAdapter
from helmgr.controller.detect import BurstDetector
from helmgr.controller.mlp import MLPPolicy
from helmgr.controller.observe import MEAN_ALPHA, N_FEATURES
from helmgr.controller.safety import Safety
from helmgr.core.errors import HelmInputError
from helmgr.core.window import WindowStats

DEFAULT_POLICY = "default_policy.npz"
MIN_MOVE = 0.03        # the node's ratio follows the target only in moves of at least this (Safety.min_move)


def default_policy_file():
    """The shipped base policy's file in the package (a resource: `is_file`, `read_bytes`)."""
    return resources.files("helmgr.controller") / DEFAULT_POLICY


def default_policy_digest() -> str:
    """A short hash of the shipped base policy's bytes (what a stored HELM run depends on)."""
    return policy_digest(default_policy_file())


def policy_digest(path) -> str:
    """A short hash of a policy file's bytes: the first 16 hex digits of its SHA-256."""
    import hashlib
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def tier_settings(adapter_kw: dict | None = None) -> tuple[str, str]:
    """Adapter v2's (its defaults, with `adapter_kw` over them) and the recovery tier's default
    settings, as `name=value,...` strings (what a stored HELM result depends on besides the base
    policy: `policies.helm_revision`)."""
    import dataclasses
    import inspect
    kw = adapter_kw or {}
    fields = [(f.name, kw.get(f.name, f.default)) for f in dataclasses.fields(MarginalAdapter)
              if f.init and f.name != "n_features"]
    adapter = ",".join(f"{k}={v}" for k, v in fields)
    params = inspect.signature(Controller.__init__).parameters
    recovery = ",".join(f"{k.removeprefix('recovery_')}={p.default}" for k, p in params.items()
                        if k.startswith("recovery_"))
    return adapter, recovery


def _floats(s: WindowStats) -> list[float]:
    """The slow path of `Controller.step`: the stats as the kernel's ten floats (`as_floats`), a
    reported NaN P99 refused as -inf; TypeError naming a field that is not a number."""
    x = WindowStats.as_floats(s)
    if s.p99_s is not None and x[2] != x[2]:
        x[2] = -math.inf
    return x


class Controller:
    def __init__(self, base: MLPPolicy | None, adapter: MarginalAdapter | None = None,
                 detector: BurstDetector | None = None, safety: Safety | None = None,
                 recovery_ratio: float = 0.95, recovery_step: float = 0.1, recovery_hold: float = 60.0,
                 recovery_miss: float = 0.01, recovery_signal: float = 0.05, recovery_samples: int = 3,
                 recovery_z: float = 2.5):
        if base is not None and base.n_obs not in (L.N_FEATURES_V1, N_FEATURES):
            raise ValueError(f"base policy takes {base.n_obs} observations, the controller gives {N_FEATURES} "
                             f"(or the first {L.N_FEATURES_V1})")
        if detector is not None and detector.n_signals != L.N_SIG:
            raise ValueError(f"the compiled step watches {L.N_SIG} signals, the detector {detector.n_signals}")
        self.base, self.adapter, self.detector = base, adapter, detector
        self.safety = safety or Safety(max_slew=0.1, min_move=MIN_MOVE)
        if not recovery_hold >= 0:
            raise ValueError(f"recovery_hold must be >= 0 windows, got {recovery_hold}")
        if not 0.0 <= recovery_miss <= 1.0:
            raise ValueError(f"recovery_miss must be an EMB miss rate in [0, 1], got {recovery_miss}")
        self.recovery_ratio, self.recovery_step, self.recovery_hold = recovery_ratio, recovery_step, recovery_hold
        if not 0.0 <= recovery_signal <= 1.0:
            raise ValueError(f"recovery_signal must be a step of the ratio in [0, 1], got {recovery_signal}")
        if not (recovery_samples >= 2 and recovery_z >= 0):
            raise ValueError(f"recovery_samples must be >= 2 and recovery_z >= 0, got {recovery_samples}, {recovery_z}")
        self.recovery_miss, self.recovery_signal = recovery_miss, recovery_signal
        self.recovery_samples, self.recovery_z = recovery_samples, recovery_z
        self.hold: float | None = None         # after a burst: the floor under the plan, decaying
        self.last: float | None = None          # the last ratio this controller set (for a window it took)
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
    def load(cls, path, adapter: str | None = "marginal", recovery: bool = True, adapter_kw: dict | None = None,
             **kw) -> "Controller":
        """A controller around the base policy in `path` (an exported .npz); `adapter`
        "marginal" (the default) adapter v2 (`adapter_kw`: its settings, e.g. bound; it learns
        from the counterfactual samples passed to `step`), None (or False) none."""
        base = MLPPolicy.load(path)
        if adapter == "marginal":
            tier = MarginalAdapter(**(adapter_kw or {}))
        elif adapter is False or adapter is None:
            tier = None
        else:
            raise ValueError(f"unknown adapter {adapter!r} (known: 'marginal', or None)")
        return cls(base, tier, BurstDetector(3) if recovery else None, **kw)

    @classmethod
    def default(cls, **kw) -> "Controller":
        """The shipped HELM, the controller `--policy helm` runs on every node: the base policy that
        ships with the package (docs/controller.md says how it was trained), adapter v2 with its
        default settings and the recovery tier (the serving replicas run it too, their caches'
        shadows giving adapter v2 its samples). A stack that cannot give adapter v2 its samples
        asks for `adapter=None` by name."""
        ref = default_policy_file()
        if not ref.is_file():
            raise HelmInputError("no default policy ships with this build; pass one: "
                                 "Controller.load(PATH) (make one with `helmgr train --out PATH`)")
        with resources.as_file(ref) as path:
            return cls.load(Path(path), **kw)

    @property
    def reads_marginal(self) -> bool:
        """The base policy reads the counterfactual feature ("marginal_ms"), so `step` needs the
        samples even without adapter v2 (a base trained before it reads the first ten features)."""
        return self.base is not None and self.base.n_obs > L.N_FEATURES_V1

    @property
    def hold_step(self) -> float:
        """How far the post-burst floor falls a window: from the recovery ratio to r_min in
        `recovery_hold` windows (0: no floor)."""
        if not self.recovery_hold:
            return 0.0
        return max(self.recovery_ratio - self.safety.r_min, 0.0) / self.recovery_hold

    # -- the decision ---------------------------------------------------------------------
    def _kernel_arrays(self) -> tuple:
        """The kernel's memory, configured from the tiers: (mem, the policy's flat weights and
        widths, an offset of 0 for a controller without an adapter, mem's views)."""
        b, a = self.base, self.adapter
        d = self.detector or BurstDetector(3)
        flat, dims, h = (b.flat, b.dims, b.scratch) if b else (np.zeros(1), np.zeros(1, np.int64), np.zeros(2))
        mem, views = L.layout(d.exit_ticks, len(h))
        st, cfg, _, det = views[:4]
        cfg[L.C_OB_ALPHA] = MEAN_ALPHA
        d.configure(cfg, det, on=self.detector is not None)
        cfg[[L.C_HAS_BASE, L.C_MAX_STEP]] = b is not None, b.max_step if b else 0.0
        if a is not None:
            a.configure(cfg)
        self.safety.configure(cfg)
        rec = [L.C_REC_RATIO, L.C_REC_STEP, L.C_HOLD_STEP, L.C_REC_MISS, L.C_REC_SIGNAL, L.C_REC_SIG_N, L.C_REC_SIG_Z]
        cfg[rec] = (self.recovery_ratio, self.recovery_step, self.hold_step, self.recovery_miss, self.recovery_signal,
                    self.recovery_samples, self.recovery_z)
        st[[L.TARGET, L.PLAN, L.HOLD, L.APPLIED]] = np.nan
        return mem, flat, dims, np.zeros(1), views

    def step(self, stats: WindowStats, marginal: float | None = None, load: float | None = None) -> float:
        """The next ratio for the window `stats` describes (one compiled call up to the decision).
        `marginal`: adapter v2's sample, if one closed with this window (MarginalAdapter.learn;
        with `recovery_signal`, recovery tests it);
        `load`: the arrival rate its load levels follow (default: the node's, `stats.arrival_rps`).

        Whatever the numbers, the ratio is finite and in [r_min, r_max]. Stats the safety layer
        refuses (non-finite or out of range, `safety.stats_ok`; a P99 of NaN too: say None) are
        counted in `safety.bad_input` and answered by `safety.fallback`; nothing learns from them.
        A field that is not a number raises TypeError naming it."""
        t0 = time.perf_counter_ns()
        if self._k is None:
            self._k = self._kernel_arrays()
        mem, flat, dims, zero, views = self._k
        st, s, a = views[0], stats, self.adapter
        bad, ad = st[L.BAD_INPUT], zero if a is None else a.params
        signal = math.nan if marginal is None else float(marginal)
        try:
            p99 = s.p99_s                                # None: NaN to the kernel; a NaN is refused (-inf)
            p99 = math.nan if p99 is None else p99 if p99 == p99 else -math.inf
            ratio = K.decide(mem, flat, dims, ad, s.ratio, s.arrival_rps, p99, s.slo_s, s.emb_hit_rate,
                             s.kv_hit_rate, s.queue_len, s.h2d_utilization, s.new_user_share, s.emb_time_share,
                             signal)
        except (TypeError, ValueError, ArithmeticError):  # a number numba does not take (or none at all)
            ratio = K.decide(mem, flat, dims, ad, *_floats(s), signal)
        self.latency_ns.append(time.perf_counter_ns() - t0)
        self._report(st)
        self.windows += 1
        if st[L.BAD_INPUT] != bad:                       # refused: the window never happened, but for the count
            return ratio
        if a is not None:                                # learning, off the decision's clock
            a.frozen = self.recovering
            a.learn(marginal, s.arrival_rps if load is None else load)
        self.moved = ratio - (float(s.ratio) if self.last is None else self.last)
        self.last = ratio
        return ratio

    def _report(self, st) -> None:
        """The decision's events and state, from the kernel's scalars."""
        event = st[L.EVENT]
        if event:
            self.events.append((self.windows, "start" if event == 1 else "end"))
            self.recovering = event == 1
        self.safety.report(st)
        self.plan, self.target = st[L.PLAN], st[L.TARGET]
        self.hold = None if math.isnan(st[L.HOLD]) else float(st[L.HOLD])
