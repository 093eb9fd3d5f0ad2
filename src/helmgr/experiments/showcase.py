"""What `helmgr simulate` shows when no policy or router is named: full HELM (the controller and
the HELM router) beside static-best + prefix-aware, the strongest static baseline a cache-aware
deployment would run, with each one's capacity headroom where the evaluation measured it.

Static-best is a hindsight sweep; a sweep of the default scenario costs nine runs, so for the
runs the evaluation measured (a v2 regime at its default rate and duration on the scenario's
cluster, any seed) the split and the capacities are the evaluation's, kept in `REFERENCE` and
checked against the committed record by `tests/test_showcase.py`. Any other configuration sweeps
`SWEEP` here and has no stored capacity."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from helmgr.experiments.capacity import base_rate
from helmgr.experiments.compare import run_series
from helmgr.experiments.parallel import run_all
from helmgr.experiments.sweep import static_best
from helmgr.policy.policies import helm_revision
from helmgr.routing.helm import Helm
from helmgr.sim import SimConfig
from helmgr.sim.config import scenario_cluster
from helmgr.sim.metrics import Series
from helmgr.workload import WorkloadSpec, default_config

HELM = ("helm", "helm")
BASELINE_ROUTER = "prefix-aware"
SWEEP = (0.1, 0.3, 0.5, 0.7, 0.9)     # static ratios tried where no split is stored
RECORD = "docs/results/2026-12-01-evaluate-full"


@dataclass(frozen=True)
class Reference:
    """What the evaluation measured for one regime: the static split under prefix-aware with the
    lowest P99 averaged over its seeds, and capacity at SLO (lowest seed) per POLICY@ROUTER."""

    static_best: float
    capacity_rps: dict[str, float] | None = None       # None: not measured for this regime
    helm_revision: str | None = field(default=None, compare=False)   # the HELM measured (stack_revision)


# (scenario, regime) -> Reference: `reference_from_record` of RECORD's evaluate.json (seeds 1-3,
# 360-s runs; capacity measured on steady only), checked by tests/test_showcase.py
REFERENCE: dict[tuple[str, str], Reference] = {
    ("v2", "steady"): Reference(0.6, {"helm@helm": 3335.462041804824, "static-best@prefix-aware": 3025.6846328217016},
                                "849752cc1afe59d5/adapter=True/recovery=True"),
    ("v2", "burst"): Reference(0.8),
    ("v2", "trend"): Reference(0.8),
}


def stack_revision() -> str:
    """Which full HELM a stored figure is of: the controller's tiers (`policies.helm_revision`)
    and the HELM router's defaults (`Helm.revision`)."""
    return f"{helm_revision()}/router={Helm.revision()}"


def reference_from_record(record: dict) -> dict[tuple[str, str], Reference]:
    """REFERENCE as an evaluation's `evaluate.json` gives it (how REFERENCE is refreshed): per
    regime, the scenario check's prefix-aware ratio with the lowest P99 averaged over seeds, and
    the capacities of full HELM and static-best + prefix-aware where they were measured."""
    import numpy as np
    config = record["config"]
    if config["check_router"] != BASELINE_ROUTER:
        raise ValueError(f"the record's static sweeps are under {config['check_router']}, not {BASELINE_ROUTER}")
    pairs = ("@".join(HELM), f"static-best@{BASELINE_ROUTER}")
    caps = {(c["regime"], c["config"]): c["capacity_rps"] for c in record["capacity"]}
    out = {}
    for regime, check in record["scenario_check"].items():
        seeds = list(check["seeds"].values())
        mean = np.mean([s["p99_ms"] for s in seeds], axis=0)
        measured = {k: caps[(regime, k)] for k in pairs if (regime, k) in caps}
        out[(config["scenario"], regime)] = Reference(float(seeds[0]["ratios"][int(np.argmin(mean))]),
                                                      measured if len(measured) == len(pairs) else None,
                                                      config.get("helm_revision"))
    return out


def reference(spec: WorkloadSpec, cfg: SimConfig) -> Reference | None:
    """The stored figures for this run, if the evaluation measured it: a synthetic regime of the
    scenario at its default rate and duration, on the scenario's cluster (seed, initial ratio,
    policy, router and simulation path aside)."""
    ref = REFERENCE.get((spec.scenario, spec.regime))
    if ref is None or spec.trace is not None:
        return None
    default = default_config(spec.regime, spec.scenario)
    if spec.rps not in (None, default.rps) or spec.duration_s not in (None, default.duration_s):
        return None
    free = dict(policy="static", ratio=0.5, router=BASELINE_ROUTER, seed=0, path="auto")
    return ref if replace(cfg, **free) == replace(SimConfig(**scenario_cluster(spec.scenario)), **free) else None


@dataclass
class Showcase:
    helm: tuple[dict, Series]                       # full HELM's summary and series
    baseline: tuple[dict, Series]                   # static-best + prefix-aware's
    stored: bool                                    # the split is the evaluation's (else swept here)
    capacity_rps: dict[str, float] | None           # "helm" / "baseline" -> capacity at SLO, where stored (not
                                                    # "helm" when HELM changed since it was measured)
    base_rps: float | None                          # the run's base rate (for the headroom)

    @property
    def p99_reduction(self) -> float:
        return 1.0 - self.helm[0]["p99_ms"] / self.baseline[0]["p99_ms"]

    def headroom(self, which: str) -> float | None:
        """Capacity at SLO over the run's base rate, minus 1 (None where not stored)."""
        if self.capacity_rps is None or which not in self.capacity_rps or self.base_rps is None:
            return None
        return self.capacity_rps[which] / self.base_rps - 1.0


def showcase(spec: WorkloadSpec, cfg: SimConfig, jobs: int = 1,
             on_done: Callable[[int], None] | None = None) -> Showcase:
    """Full HELM and static-best + prefix-aware on `spec`, in parallel (`jobs` processes):
    the stored split where `reference` has one, else the best of `SWEEP` on this run."""
    ref = reference(spec, cfg)
    ratios = (ref.static_best,) if ref is not None else SWEEP
    tasks = [(spec, replace(cfg, policy=HELM[0], router=HELM[1]))]
    tasks += [(spec, replace(cfg, policy="static", router=BASELINE_ROUTER, ratio=r)) for r in ratios]
    names = ["helm (helm)"] + [f"static {r:g} ({BASELINE_ROUTER})" for r in ratios]
    results = run_all(run_series, tasks, jobs, None, names, on_done)
    best = static_best([summary for summary, _ in results[1:]])
    series = next(ser for summary, ser in results[1:] if summary["ratio"] == best["ratio"])
    capacity = None
    if ref is not None and ref.capacity_rps is not None:
        capacity = {"baseline": ref.capacity_rps[f"static-best@{BASELINE_ROUTER}"]}
        if ref.helm_revision == stack_revision():           # else HELM changed since: its capacity is not this one's
            capacity["helm"] = ref.capacity_rps["@".join(HELM)]
    return Showcase(results[0], (best, series), ref is not None, capacity,
                    base_rate(spec) if spec.trace is None else None)
