"""Held probes in the simulator: does probing the split measure what the split is worth?

The shipped adapter cannot learn in a 2-minute run (docs/controller.md, tier 2); the faster
learner that suggests itself holds a probe of +delta for `hold` windows, then -delta, and steps
its offset by the reward difference. This runs that learner (a script, not shipped) where it has
something to find: H200, steady, a base policy biased to steer ~0.14 low (its ratio feature's
normalization shifted by -0.3: it settles at r ~0.31, where the sweep says higher is better),
eight nodes pooling their probe differences into one offset (8x the data of one node), half the
nodes probing +delta while the other half probe -delta. Per refill mode it prints the biased
base alone, the base with the probe learner (its blocks' mean reward difference R(+d) - R(-d),
+- its standard error; > 0 says "higher ratio is better"), and two static splits around where
the probes are, which give the true sign.

    python benchmarks/adapter_probe.py [--duration 300] [--jobs 2]
"""
from __future__ import annotations

import argparse
import math
from concurrent.futures import ProcessPoolExecutor
from importlib import resources

import numpy as np

from helmgr.cli.simulate_cmd import build_config
from helmgr.cli.workload_cmd import build_workload
from helmgr.controller import Controller
from helmgr.controller.detect import BurstDetector
from helmgr.controller.mlp import MLPPolicy
from helmgr.core.window import WindowStats
from helmgr.policy.policies import HelmPolicy
from helmgr.sim.run import simulate


class Pool:
    """What the nodes' learners share: the offset's parameter and the probe differences."""

    def __init__(self, bound: float, pairs: int, z: float, eta: float):
        self.bound, self.pairs, self.z, self.eta = bound, pairs, z, eta
        self.b, self.diffs, self.blocks = 0.0, [], []

    def add(self, diff: float) -> None:
        self.diffs.append(diff)
        if len(self.diffs) == self.pairs:
            d, self.diffs = np.asarray(self.diffs), []
            mean, se = d.mean(), d.std(ddof=1) / math.sqrt(len(d))
            if abs(mean) > self.z * se:                    # a fixed step toward the better side
                self.b = float(np.clip(self.b + self.eta * np.sign(mean), -3.0, 3.0))
            self.blocks.append((mean, se))


class ProbeLearner:
    """The adapter's interface (decide/learn/frozen) for Controller.reference_step: offset
    bound * tanh(b) plus a held probe of sign * delta; the first window of each half-pair (the
    resize) is left out of the difference."""

    updates = applied = 0                  # what HelmPolicy.report reads of an adapter

    def __init__(self, pool: Pool, sign: int, delta: float, hold: int):
        self.pool, self.sign, self.delta, self.hold = pool, sign, delta, hold
        self.frozen, self.k, self.arms = False, 0, {1: [], -1: []}
        self._latest = self._trace = None

    def decide(self, x) -> float:
        out = self.pool.bound * math.tanh(self.pool.b)
        if self.frozen:
            self._latest = None
            return out
        sign = self.sign * (1 if (self.k // self.hold) % 2 == 0 else -1)
        self._latest = (sign, self.k % self.hold == 0, self.k)
        self.k += 1
        return out + sign * self.delta

    def learn(self, reward: float) -> None:
        trace, self._trace, self._latest = self._trace, self._latest, None
        if self.frozen:
            self.k, self.arms = 0, {1: [], -1: []}
            return
        if trace is None or not math.isfinite(reward):
            return
        sign, first, k = trace
        if not first:
            self.arms[sign].append(reward)
        if (k + 1) % (2 * self.hold) == 0:
            if self.arms[1] and self.arms[-1]:
                self.pool.add(np.mean(self.arms[1]) - np.mean(self.arms[-1]))
            self.arms = {1: [], -1: []}


def biased_base(shift: float) -> MLPPolicy:
    with resources.as_file(resources.files("helmgr.controller") / "default_policy.npz") as path:
        b = MLPPolicy.load(path)
    mean = b.obs_mean.copy()
    mean[0] += shift
    return MLPPolicy(b.w, b.b, mean, b.obs_var, b.obs_clip, b.obs_eps, b.max_step, b.meta)


class Probed(HelmPolicy):
    """The biased base, burst recovery on, and (probe=True) the pooled probe learner."""

    name = "helm-biased"

    def __init__(self, probe: bool, shift: float = -0.3, delta: float = 0.03, hold: int = 5, pairs: int = 32,
                 z: float = 2.5, eta: float = 0.4):
        super().__init__()
        self.probe, self.shift, self.delta, self.hold = probe, shift, delta, hold
        self.pool = Pool(0.05, pairs, z, eta)

    def attach(self, index, node):
        ad = ProbeLearner(self.pool, 1 if index % 2 == 0 else -1, self.delta, self.hold) if self.probe else None
        self.ctl[index] = ctl = Controller(biased_base(self.shift), ad, BurstDetector(3))
        ctl.safety.r_min, ctl.safety.r_max = node.config.r_min, node.config.r_max
        self.slo[index] = node.profile.model.slo_ms * 1e-3

    def observe(self, index, w, node):
        self.target[index] = self.ctl[index].reference_step(WindowStats.from_window(w, self.slo[index]))


def run(job: tuple) -> str:
    refill, what, duration = job
    static = isinstance(what, float)
    cfg = build_config(nodes=8, policy="static" if static else "helm", ratio=what if static else 0.5, router="helm",
                       hardware="h200-141g", model="large", slo_ms=None, refill=refill, faults=(), tick_ms=10.0,
                       refresh_s=2.0, max_batch=1, seed=1)
    wl = build_workload(regime="steady", duration=duration, seed=1, rps=None, trace=None, trace_format="inter",
                        time_compression=None, clone_users=1, overlay=())
    policy = None if static else Probed(what == "probe")
    s = simulate(cfg, wl, policy).summary
    name = f"static {what}" if static else ("biased base + probe learner" if what == "probe" else "biased base alone")
    row = f"| {refill} | {name} | {s['p99_ms']:.2f} | {s['mean_ratio']:.3f} |"
    if what == "probe":
        blocks = " ".join(f"{m:+.4f}±{se:.4f}" for m, se in policy.pool.blocks)
        row += f" {blocks} | {0.05 * math.tanh(policy.pool.b):+.3f} |"
    else:
        row += " | |"
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=300.0)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    jobs = [(refill, what, a.duration) for refill in ("lazy", "background") for what in ("base", "probe")]
    jobs += [("lazy", r, a.duration) for r in (0.25, 0.35)]     # statics never grow a cache: either refill
    print("| refill | policy | P99 ms | mean r | probe blocks: mean R(+d) - R(-d) ± se | final offset |")
    print("|---|---|---:|---:|---|---:|")
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        for row in pool.map(run, jobs):
            print(row, flush=True)


if __name__ == "__main__":
    main()
