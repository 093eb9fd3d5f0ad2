"""The HELM memory policy: the three-tier controller (helmgr.controller), one per node, and its
two ablations."""
from __future__ import annotations

import numpy as np

from helmgr.core.window import WindowStats
from helmgr.memory.refill import RecoveryRefill
from helmgr.policy.base import MemoryPolicy
from helmgr.policy.marginal import MarginalSampler


class HelmPolicy(MemoryPolicy):
    """The three-tier HELM controller (helmgr.controller), one per node, deciding at the end of
    every window; `path` names an exported base policy (default: the one shipped)."""

    name = "helm"
    # adapter: "marginal" (adapter v2, from the shadows) or False
    adapter, recovery = "marginal", True
    shadow_share = 0.05                     # adapter v2: each cache's shadow, of the pool
    level_load = "cluster"                  # adapter v2's load levels follow: "cluster" (mean rate) or "node" (its own)
    value = "tail"                          # adapter v2's samples price: "tail" (the P99's requests) or "mean" (all)
    adapter_preset: dict = {}               # adapter v2's settings over MarginalAdapter's defaults

    def __init__(self, path: str | None = None, seed: int = 0, bias: float = 0.0, adapter_kw: dict | None = None,
                 controller_kw: dict | None = None, level_load: str | None = None, value: str | None = None):
        """`bias`: set each node `bias` above the controller's decision (clamped): a base policy
        deliberately wrong by that much, for measuring what the adapter corrects (0: none).
        `adapter_kw`: adapter v2's settings (`MarginalAdapter`; default: its own, with the
        class's `adapter_preset` over them);
        `controller_kw`: the recovery tier's (`Controller`'s recovery_* arguments);
        `level_load`: the arrival rate adapter v2's load levels follow, "cluster" (default: the
        mean over the nodes that reported a window lately) or "node" (the node's own). The
        cluster's: under the HELM router a node's own rate swings with the users homed on it
        (117-189 req/s on steady seed 1), each swing changed level and restarted from the base
        alone, and steady seed 1 lost 5.7 % of P99 (5.19 against 4.91 ms); the split that is
        best follows the cluster's load (docs/results/2026-12-03-levels.md).
        `value`: what adapter v2's samples price, "tail" (default) or "mean" (`MarginalSampler`)."""
        if level_load is not None and level_load not in ("node", "cluster"):
            raise ValueError(f"level_load must be 'node' or 'cluster', got {level_load!r}")
        if value is not None:
            MarginalSampler.check_value(value)
        self.value = value or self.value
        self.path, self.seed, self.bias = path, seed, bias
        self.adapter_kw = {**self.adapter_preset, **(adapter_kw or {})} or None
        self.level_load = level_load or self.level_load
        self.controller_kw = controller_kw or {}
        self.rates: dict[int, tuple[float, float]] = {}     # node -> (window end s, arrival rate): "cluster"
        self.ctl: dict = {}
        self.slo: dict[int, float] = {}
        self.target: dict[int, float] = {}
        self.events: list[tuple[int, float, str]] = []     # (node, window end s, "start" | "end")
        self.retired: list = []                              # controllers of nodes that went down
        self.sampler: MarginalSampler | None = None          # adapter v2 (or a base reading "marginal_ms"): samples
        self.peers: list = []                                # adapter v2: the nodes sharing KV ghosts

    def attach(self, index, node):
        from helmgr.controller import Controller
        kw = {"adapter": self.adapter, "recovery": self.recovery, **self.controller_kw}
        if self.adapter_kw and self.adapter == "marginal":
            kw["adapter_kw"] = self.adapter_kw
        if index in self.ctl:                               # a node restarting: a fresh controller
            self.retired.append(self.ctl[index])
        self.ctl[index] = Controller.load(self.path, **kw) if self.path else Controller.default(**kw)
        self.ctl[index].safety.r_min, self.ctl[index].safety.r_max = node.config.r_min, node.config.r_max
        self.slo[index] = node.profile.model.slo_ms * 1e-3
        if self.adapter == "marginal" or self.ctl[index].reads_marginal:
            if self.sampler is None:
                self.sampler = MarginalSampler(self.shadow_share, self.value)
            self.sampler.attach(index, node, self.peers)

    def observe(self, index, w, node):
        ctl = self.ctl[index]
        seen = len(ctl.events)
        stats = WindowStats.from_window(w, self.slo[index])
        target = ctl.step(stats, self._sample(index, w, node), self._load(index, w.t, w.span_s, stats.arrival_rps))
        if isinstance(node.refill, RecoveryRefill):       # refill in the background while recovering
            node.refill.active = bool(ctl.recovering)
        if self.bias:
            target = min(node.config.r_max, max(node.config.r_min, target + self.bias))
        self.target[index] = target
        self.events += [(index, w.t, e) for _, e in ctl.events[seen:]]

    def _load(self, index: int, t: float, span: float, rate: float) -> float | None:
        """The rate adapter v2's load levels follow: None (the node's own) or, for "cluster", the
        mean rate of the nodes whose latest window ended within two windows of this one (a node
        that went down drops out)."""
        if self.level_load == "node":
            return None
        self.rates[index] = (t, rate)
        live = [r for u, r in self.rates.values() if u > t - 2.0 * span]
        return sum(live) / len(live)

    def _sample(self, index, w, node) -> float | None:
        """The node's counterfactual sample, if one closed with window `w` (`MarginalSampler`;
        None without shadows)."""
        return None if self.sampler is None else self.sampler.sample(index, w, node)

    def report(self):
        """Burst start/end events per node, the controllers' decisions and their wall-clock
        latency, the safety step's counts (settled: targets under min_move, not moved to), and the
        adapters' samples taken and the blocks of them that moved their offsets."""
        ctls = list(self.ctl.values()) + self.retired
        us = np.asarray([t for c in ctls for t in c.latency_ns], float) / 1e3
        return {"controller": {
            "decisions": int(us.size),
            "decision_us_p50": float(np.percentile(us, 50)) if us.size else None,
            "decision_us_p99": float(np.percentile(us, 99)) if us.size else None,
            "burst_events": [{"node": n, "t": round(t, 3), "event": e} for n, t, e in self.events],
            "non_finite": sum(c.safety.non_finite for c in ctls), "clamped": sum(c.safety.clamped for c in ctls),
            "slewed": sum(c.safety.slewed for c in ctls), "settled": sum(c.safety.settled for c in ctls),
            "adapter_estimates": sum(c.adapter.updates for c in ctls if c.adapter),
            "adapter_steps": sum(c.adapter.applied for c in ctls if c.adapter)}
            | ({"adapter_offsets": [round(c.adapter.offset, 4) for c in self.ctl.values()]}
               if self.adapter == "marginal" else {})}

    def decide(self, index, node, now):
        return self.target.pop(index, None)


class HelmBase(HelmPolicy):
    """Ablation: the frozen base policy alone (and the safety step)."""

    name = "helm-base"
    adapter, recovery = False, False


class HelmBaseAdapter(HelmPolicy):
    """Ablation: base policy + adapter v2, no burst recovery."""

    name = "helm-base+adapter"
    adapter, recovery = "marginal", False


def helm_revision(policy: type = HelmPolicy) -> str:
    """What a HELM policy's results depend on besides its name and the package's version: the
    shipped base policy's hash, its adapter and its recovery tier, each with its default
    settings (evaluate's keys; `experiments.showcase.stack_revision` adds the router's), e.g.
    `3f02.../adapter=marginal(bound=0.15,...,shadow=0.05)/recovery=True(ratio=0.85,...)`."""
    from helmgr.controller.controller import default_policy_digest, tier_settings
    adapter, recovery = tier_settings(policy.adapter_preset)
    value = "" if policy.value == "mean" else f",value={policy.value}"     # (revisions before it had none)
    a = (f"({adapter},shadow={policy.shadow_share},levels={policy.level_load}{value})"
         if policy.adapter == "marginal" else "")
    r = f"({recovery})" if policy.recovery else ""
    return f"{default_policy_digest()}/adapter={policy.adapter}{a}/recovery={policy.recovery}{r}"
