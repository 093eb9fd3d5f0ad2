"""What `helmgr simulate` shows when no policy or router is named: full HELM (the controller and
the HELM router) beside static-best + prefix-aware, the strongest static baseline a cache-aware
deployment would run, with each one's capacity headroom where it was measured for this HELM.

Static-best is a hindsight sweep; a sweep of the default scenario costs nine runs, so for the
runs the evaluation measured (a regime at its default rate and duration on the default
cluster, any seed) the split is the evaluation's and the capacities are those its record
measured or `helmgr capacity` measured for the same HELM (`RECORDS`: each regime from the first
record that measured it), kept in `REFERENCE` and checked against the committed records by
`tests/test_showcase.py`. Any other configuration sweeps `SWEEP` here and has no stored
capacity."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from helmgr.experiments.capacity import base_rate
from helmgr.experiments.compare import run_series
from helmgr.experiments.parallel import run_all
from helmgr.experiments.sweep import static_best
from helmgr.policy.helm import helm_revision
from helmgr.routing.helm import Helm
from helmgr.sim import SimConfig
from helmgr.sim.metrics import Series
from helmgr.workload import WorkloadSpec, default_config

HELM = ("helm", "helm")
BASELINE_ROUTER = "prefix-aware"
SWEEP = (0.1, 0.3, 0.5, 0.7, 0.9)     # static ratios tried where no split is stored
# (evaluate.json's folder, `helmgr capacity --json` runs of both or None): each regime's figures
# from the first record that measured it
RECORDS: tuple[tuple[str, str | None], ...] = (
    ("docs/results/2026-12-07-evaluate-steady", None),
    ("docs/results/2026-12-07-evaluate-burst", None),
    ("docs/results/2026-12-07-evaluate-trend", None),
)


@dataclass(frozen=True)
class Reference:
    """What was measured for one regime: the static split under prefix-aware with the
    lowest P99 averaged over its seeds, and capacity at SLO (lowest seed) per POLICY@ROUTER."""

    static_best: float
    capacity_rps: dict[str, float] | None = None       # None: not measured for this regime
    helm_revision: str | None = field(default=None, compare=False)   # the HELM measured (stack_revision)


# regime -> Reference: `reference_from_record` of the first of RECORDS measuring it (seeds 1-3,
# 360-s runs and probes), checked by tests/test_showcase.py
_MEASURED = ("3f024ede94ea3e49/adapter=marginal(bound=0.25,step=0.02,block=5,z=2.5,grow=1.5,max_step=0.06,"
             "load_width=0.2,load_alpha=0.3,load_hysteresis=0.75,hold_base=True,shadow=0.05,levels=cluster,"
             "value=tail)/"
             "recovery=True(ratio=0.95,step=0.1,hold=60.0,miss=0.01,signal=0.05,samples=3,z=2.5)/"
             "router=helm(d=2,kv_term=True,emb_term=True,sample=32,waste=None,link_waste=None,home_slack=None,"
             "home_slack_s=None,home_by_load=True,overlap=True,HOME_SLACK=1.0,RHO_SPAN_S=0.5,MAX_WASTE=1000.0,"
             "BLOCK=4096)")
SOURCE = {"steady": RECORDS[0][0], "burst": RECORDS[1][0], "trend": RECORDS[2][0]}    # regime -> its record
REFERENCE: dict[str, Reference] = {
    "steady": Reference(0.6, {"helm@helm": 4142.169593489894, "static-best@prefix-aware": 2866.1947166003865},
                                _MEASURED),
    "burst": Reference(0.9, {"helm@helm": 1529.3160891453658, "static-best@prefix-aware": 1372.3387318687242},
                               _MEASURED),
    "trend": Reference(0.8, {"helm@helm": 3111.269837220809, "static-best@prefix-aware": 2761.8376654543204},
                               _MEASURED),
}


def stack_revision() -> str:
    """Which full HELM a stored figure is of: the controller's tiers (`policies.helm_revision`)
    and the HELM router's defaults (`Helm.revision`)."""
    return f"{helm_revision()}/router={Helm.revision()}"


def reference_from_record(record: dict, capacity_runs: Sequence[dict] = ()) -> dict[str, Reference]:
    """REFERENCE as an evaluation's `evaluate.json` gives it (how REFERENCE is refreshed): per
    regime, the scenario check's prefix-aware ratio with the lowest P99 averaged over seeds, and
    the capacities of full HELM and static-best + prefix-aware where they were measured: by the
    evaluation, or by `helmgr capacity --json` runs (`capacity_runs`: full HELM's with policy and
    router helm, static-best's at the regime's static-best split). The HELM measured is the
    capacity run's `helm_revision` where it names one, else the evaluation's."""
    import numpy as np
    config = record["config"]
    if config["check_router"] != BASELINE_ROUTER:
        raise ValueError(f"the record's static sweeps are under {config['check_router']}, not {BASELINE_ROUTER}")
    pairs = ("@".join(HELM), f"static-best@{BASELINE_ROUTER}")
    caps = {(c["regime"], c["config"]): c["capacity_rps"] for c in record["capacity"]}
    revision = {}                          # regime -> the HELM of a capacity run that names it
    best = {}
    for regime, check in record["scenario_check"].items():
        seeds = list(check["seeds"].values())
        mean = np.mean([s["p99_ms"] for s in seeds], axis=0)
        best[regime] = float(seeds[0]["ratios"][int(np.argmin(mean))])
    for run in capacity_runs:
        regime, nodes = run["workload"], config["cluster"]["nodes"]
        if run["nodes"] != nodes or regime not in best:
            raise ValueError(f"a capacity run of {regime} on {run['nodes']} nodes is not of the record's "
                             f"cluster ({nodes} nodes, regimes {', '.join(best)})")
        if (run["policy"], run["router"]) == HELM:
            caps[(regime, pairs[0])] = run["capacity_rps"]
            if run.get("helm_revision"):
                revision[regime] = run["helm_revision"]
        elif (run["policy"], run["router"]) == ("static", BASELINE_ROUTER) and run["ratio"] == best[regime]:
            caps[(regime, pairs[1])] = run["capacity_rps"]
        else:
            raise ValueError(f"a capacity run of {run['policy']} {run['ratio']:g} + {run['router']} on {regime} is "
                             f"neither full HELM nor static-best ({best[regime]:g}) + {BASELINE_ROUTER}")
    out = {}
    for regime, ratio in best.items():
        measured = {k: caps[(regime, k)] for k in pairs if (regime, k) in caps}
        out[regime] = Reference(ratio, measured if len(measured) == len(pairs) else None,
                                                      revision.get(regime, config.get("helm_revision")))
    return out


def reference(spec: WorkloadSpec, cfg: SimConfig) -> Reference | None:
    """The stored figures for this run, if they were measured for it: a synthetic regime at its
    default rate and duration, on the default cluster (seed, initial ratio, policy, router and
    simulation path aside)."""
    ref = REFERENCE.get(spec.regime)
    if ref is None or spec.trace is not None:
        return None
    default = default_config(spec.regime)
    if spec.rps not in (None, default.rps) or spec.duration_s not in (None, default.duration_s):
        return None
    free = dict(policy="static", ratio=0.5, router=BASELINE_ROUTER, seed=0, path="auto")
    return ref if replace(cfg, **free) == replace(SimConfig(), **free) else None


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
