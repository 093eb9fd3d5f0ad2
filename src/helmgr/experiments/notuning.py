"""The no-tuning study: what a split costs where it was not tuned.

Static-best is hindsight: an operator does not have it, and a split tuned on one GPU, model or
traffic mix is wrong on another. On a grid of conditions (hardware presets x model presets x
regimes, plus replayed logs), every fixed split of a grid and full HELM run once each under the
HELM router. A condition's hindsight static-best is its lowest-P99 split; a configuration's
*regret* there is P99 / that P99 - 1. Reported over the grid, worst and mean: full HELM's regret;
each fixed split's; the minimax split's (the one fixed split with the lowest worst regret, chosen
knowing the whole grid); and the default-tuned split's (the one best on the first condition, the
default scenario). With `capacity_regimes`, capacity at SLO of full HELM, the hindsight split,
the minimax split and the default-tuned split on those conditions, each against the hindsight
split's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from helmgr.core.errors import HelmInputError
from helmgr.experiments.capacity import CapacityTask, base_rate, bisect_task
from helmgr.experiments.parallel import run_all
from helmgr.sim import SimConfig, simulate
from helmgr.sim.metrics import slim
from helmgr.workload import WorkloadSpec

ROUTER = "helm"


@dataclass(frozen=True)
class Condition:
    """One cell of the grid: a hardware and a model preset serving one workload."""

    hardware: str
    model: str
    spec: WorkloadSpec

    @property
    def name(self) -> str:
        what = self.spec.regime if self.spec.trace is None else f"trace {self.spec.trace.rsplit('/', 1)[-1]}"
        return f"{self.hardware}/{self.model}/{what}"


def grid_conditions(hardware, models, regimes, seed: int = 1, time_compression: float | None = None,
                    traces: tuple[WorkloadSpec, ...] = ()) -> list[Condition]:
    """Every hardware x model x regime (the first is the default condition), then each trace spec
    on the first hardware and model."""
    out = [Condition(h, m, WorkloadSpec(r, seed=seed, time_compression=time_compression))
           for h in hardware for m in models for r in regimes]
    return out + [Condition(hardware[0], models[0], t) for t in traces]


def _cfg(cluster: SimConfig, c: Condition, policy: str, ratio: float | None = None) -> SimConfig:
    return replace(cluster, hardware=c.hardware, model=c.model, router=ROUTER, policy=policy, seed=c.spec.seed,
                   ratio=cluster.ratio if ratio is None else float(ratio))


def _run(args: tuple[WorkloadSpec, SimConfig]) -> dict:
    spec, cfg = args
    return slim(simulate(cfg, spec.build()).summary)


def no_tuning(conditions: list[Condition], ratios, cluster: SimConfig = SimConfig(), jobs: int = 1,
              ray_address: str | None = None, on_done: Callable[[], None] | None = None,
              capacity_regimes: tuple[str, ...] = (), tol: float = 0.05, capacity_s: float | None = None,
              allow_large: bool = False) -> dict:
    """The study's runs (experiments.parallel), its per-condition table and its summary."""
    ratios = [float(r) for r in ratios]
    tasks = [(c.spec, _cfg(cluster, c, "static", r)) for c in conditions for r in ratios]
    tasks += [(c.spec, _cfg(cluster, c, "helm")) for c in conditions]
    names = [f"{c.name} static {r:g}" for c in conditions for r in ratios] + [f"{c.name} helm" for c in conditions]
    runs = run_all(_run, tasks, jobs, ray_address, names, on_done and (lambda _: on_done()))
    k = len(ratios) * len(conditions)
    p99 = np.array([r["p99_ms"] for r in runs[:k]], float).reshape(len(conditions), len(ratios))
    helm = np.array([r["p99_ms"] for r in runs[k:]], float)
    overloaded = np.array([r["overloaded"] for r in runs[:k]], bool).reshape(p99.shape)
    for c, row in zip(conditions, p99):
        if np.isnan(row).all():
            raise HelmInputError(f"{c.name}: no run completed a request after its warm-up in its {c.spec.seconds:g} "
                                 "simulated seconds, so it has no static-best; give it a longer run")
    out = summarize(p99, helm, ratios)
    out["conditions"] = [
        {"condition": c.name, "hardware": c.hardware, "model": c.model, "workload": c.spec.regime,
         "trace": c.spec.trace, "p99_ms": dict(zip(map(str, ratios), p99[i].tolist())),
         "overloaded": [str(r) for r, o in zip(ratios, overloaded[i]) if o], "helm_p99_ms": float(helm[i]),
         "helm_overloaded": bool(runs[k + i]["overloaded"]), "helm_mean_ratio": runs[k + i]["mean_ratio"],
         "best_ratio": out["best_ratio"][i], "helm_regret": out["helm_regret"][i]}
        for i, c in enumerate(conditions)]
    if capacity_regimes:
        out["capacity"] = _capacities(conditions, out, cluster, capacity_regimes, jobs, ray_address, tol,
                                      capacity_s, on_done, allow_large)
    return out


def summarize(p99: np.ndarray, helm: np.ndarray, ratios: list[float]) -> dict:
    """From P99 per condition x ratio and full HELM's per condition: each condition's hindsight
    split, the regrets, and worst and mean over the grid for HELM, every fixed split, the minimax
    split and the default-tuned split (the first condition's best)."""
    best = np.nanmin(p99, axis=1)
    regret = p99 / best[:, None] - 1.0                   # conditions x ratios
    helm_regret = helm / best - 1.0
    worst = regret.max(axis=0)
    minimax = int(np.argmin(worst))
    default = int(np.nanargmin(p99[0]))

    def over(r: np.ndarray) -> dict:
        return {"worst": float(np.max(r)), "mean": float(np.mean(r))}
    return {"ratios": ratios, "best_ratio": [ratios[i] for i in np.nanargmin(p99, axis=1)],
            "helm_regret": helm_regret.tolist(), "helm": over(helm_regret),
            "fixed": {f"{r:g}": over(regret[:, j]) for j, r in enumerate(ratios)},
            "minimax": {"ratio": ratios[minimax]} | over(regret[:, minimax]),
            "default_tuned": {"ratio": ratios[default]} | over(regret[:, default])}


def _capacities(conditions, out: dict, cluster: SimConfig, regimes, jobs, ray_address, tol, capacity_s,
                on_done, allow_large: bool = False) -> list[dict]:
    """Capacity at SLO, per condition of `regimes`: full HELM, and static at the hindsight, the
    minimax and the default-tuned splits; each against the hindsight split's."""
    picks = [(i, c) for i, c in enumerate(conditions) if c.spec.trace is None and c.spec.regime in regimes]
    configs = []
    for i, c in picks:
        spec = replace(c.spec, duration_s=capacity_s) if capacity_s else c.spec
        splits = {"hindsight": out["best_ratio"][i], "minimax": out["minimax"]["ratio"],
                  "default_tuned": out["default_tuned"]["ratio"]}
        configs += [(i, "helm", CapacityTask(spec, _cfg(cluster, c, "helm"), base_rate(spec), tol,
                                             allow_large=allow_large))]
        configs += [(i, k, CapacityTask(spec, _cfg(cluster, c, "static", r), base_rate(spec), tol,
                                        allow_large=allow_large))
                    for k, r in splits.items()]
    brackets = run_all(bisect_task, [t for _, _, t in configs], jobs, ray_address,
                       [f"{conditions[i].name} capacity {k}" for i, k, _ in configs], on_done and (lambda _: on_done()))
    rows: dict[int, dict] = {}
    for (i, k, t), b in zip(configs, brackets):
        rows.setdefault(i, {"condition": conditions[i].name})[k] = b.capacity
        rows[i][f"{k}_ratio"] = None if k == "helm" else t.cfg.ratio
    for row in rows.values():
        ref = row["hindsight"]
        for k in ("helm", "minimax", "default_tuned"):
            row[f"{k}_vs_hindsight"] = None if not ref or row[k] is None else row[k] / ref - 1.0
    return list(rows.values())
