"""`helmgr evaluate`: the published table from one command, resumable.

An evaluation is a set of *units*, each one independent run and each kept in the results folder
(`runs/<key>.pkl`, written whole by `RunStore`) as soon as it ends; a unit already there is not
rerun. The key hashes the unit's whole configuration (its workload spec, SimConfig, grid and
helmgr's version), so a changed option is a new unit. The units, per regime and seed:

- `run`: each online policy under each router (`simulate`);
- `point`: each grid ratio, static, under each router (`scenario.phase_point`): static-best is the
  point with the lowest P99, and the points under the check's router are the scenario check;
- `capacity`: a bisection over the base rate (experiments.capacity) for full HELM and for
  static-best (held at the ratio that was best at the base rate) with least-loaded and with
  prefix-aware routing;
- `oracle`: the phase oracle under each oracle router (its blocks run in order; each block's
  replays are spread over the workers);
- `tenancy` (with a class table): full HELM under each `--tenancy`, the regime's base rate times
  each of `class_loads` (the multi-tenant section);
- `class-capacity` (with a class table and capacity): a bisection for full HELM under each
  `--tenancy`, to the highest rate at which every class keeps its own window SLO.

They run in three stages: runs, points and tenancy runs (one batch over `jobs` processes or Ray), then the
capacity bisections (they need static-best's ratio), then the oracles. `report.assemble` turns
the stored units into the tables.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from helmgr.core.classes import load_table
from helmgr.experiments.capacity import CapacityTask, base_rate, bisect_task
from helmgr.experiments.parallel import run_all
from helmgr.experiments.phase_oracle import LOOKAHEAD_S, oracle_blocks, run_phase_oracle
from helmgr.experiments.scenario import PhaseRun, phase_point
from helmgr.experiments.showcase import stack_revision
from helmgr.policy.helm import HelmPolicy, helm_revision
from helmgr.policy.policies import POLICIES
from helmgr.routing.helm import Helm
from helmgr.routing.routers import ROUTERS
from helmgr.sim import SimConfig, simulate
from helmgr.sim import class_metrics
from helmgr.sim.config import TENANCIES
from helmgr.sim.metrics import slim, window_ratios
from helmgr.workload import WorkloadSpec, default_config

# the system-level pairs whose capacity is measured: full HELM and the paper's static baselines
CAPACITY_PAIRS = (("helm", "helm"), ("static-best", "prefix-aware"), ("static-best", "least-loaded"))


# The static grid spans the ratios a controller may set (SimConfig's r_min to r_max, 0.05 to 0.95):
# static-best must be chosen over the same range, and on trend least-loaded's best is 0.95, not 0.9
# (10.54 against 10.82 ms, seed 1; docs/results/2026-12-02-trend-peak.md).
DEFAULT_GRID: tuple[float, ...] = (0.05,) + tuple(round(0.1 * k, 1) for k in range(1, 10)) + (0.95,)


@dataclass(frozen=True)
class EvalConfig:
    """What one evaluation runs. `cluster` carries nodes, hardware, model, SLO, engine, ...; its
    policy, ratio, router and seed are set per unit."""

    cluster: SimConfig
    regimes: tuple[str, ...] = ("steady", "burst", "trend")
    seeds: tuple[int, ...] = (1, 2, 3)
    policies: tuple[str, ...] = ("helm",)
    routers: tuple[str, ...] = ("least-loaded", "prefix-aware", "helm")
    grid: tuple[float, ...] = DEFAULT_GRID
    duration_s: float | None = None                # None: the regime's (360 s / time_compression)
    time_compression: float | None = None          # each regime's whole shape this many times shorter (WorkloadSpec)
    check_router: str = "prefix-aware"             # the scenario check's static runs
    oracle_routers: tuple[str, ...] = ("helm",)
    oracle_lookahead_s: float = LOOKAHEAD_S        # phase_oracle.run_phase_oracle's lookahead
    capacity: bool = True
    capacity_regimes: tuple[str, ...] | None = None    # None: every regime
    capacity_duration_s: float | None = None       # each bisection probe's simulated seconds (None: the runs')
    capacity_tol: float = 0.02
    rate_scale: float = 1.0                        # each regime's default base rate times this (4 on 32 nodes:
                                                   # the 8-node scenario's load per node)
    classes: str | None = None                     # a class table (name or TOML path): the multi-tenant section
    class_loads: tuple[float, ...] = (1.0,)        # its runs' rates, as multiples of each regime's base rate
    allow_large: bool = False                      # past the limits (--allow-large): capacity searches go to
                                                   # capacity.CEILING, and the commands quoted carry it

    def rps(self, regime: str) -> float | None:
        """The base rate a run gets: None (the regime's default) unless the rate is scaled."""
        return None if self.rate_scale == 1.0 else default_config(regime).rps * self.rate_scale

    def spec(self, regime: str, seed: int, duration: float | None = None, load: float | None = None) -> WorkloadSpec:
        """The workload of a unit; `load` (the multi-tenant section's): that multiple of the base rate."""
        rps = self.rps(regime) if load is None else self.class_rps(regime, load)
        return WorkloadSpec(regime, duration or self.duration_s, seed, rps, time_compression=self.time_compression)

    def class_rps(self, regime: str, load: float) -> float:
        """The base rate of the multi-tenant section's runs at `load`."""
        return default_config(regime).rps * self.rate_scale * load

    def cfg(self, policy: str, router: str, seed: int, ratio: float | None = None) -> SimConfig:
        return replace(self.cluster, policy=policy, router=router, seed=seed,
                       ratio=self.cluster.ratio if ratio is None else float(ratio))

    def tenancy_cfgs(self, seed: int) -> list[SimConfig]:
        """Full HELM with the class table under each tenancy (the multi-tenant section's runs)."""
        table = load_table(self.classes)
        return [replace(self.cfg("helm", "helm", seed), classes=table, tenancy=t) for t in TENANCIES]

    @property
    def point_routers(self) -> tuple[str, ...]:
        """Routers with a static sweep: every router, and the check's."""
        return tuple(dict.fromkeys(self.routers + (self.check_router,)))


@dataclass(frozen=True)
class Unit:
    kind: str                  # run | point | capacity | oracle | tenancy | class-capacity
    regime: str
    seed: int
    policy: str
    router: str
    ratio: float | None = None
    payload: object = None     # what the worker gets: (spec, cfg), a CapacityTask, or (spec, cfg, grid)
    load: float | None = None  # a tenancy unit's: its rate as a multiple of the base rate

    @property
    def name(self) -> str:
        if self.kind == "tenancy":
            return f"{self.regime} seed {self.seed}: helm, tenancy {self.payload[1].tenancy} at {self.load:g}x @ helm"
        if self.kind == "class-capacity":
            return f"{self.regime} seed {self.seed}: capacity per class, helm, tenancy {self.payload.cfg.tenancy} @ helm"
        what = f"static {self.ratio:g}" if self.kind == "point" else {
            "run": self.policy, "oracle": "oracle", "capacity": f"capacity {self.policy}"}[self.kind]
        return f"{self.regime} seed {self.seed}: {what} @ {self.router}"

    @property
    def key(self) -> str:
        from importlib.metadata import version
        parts = (self.kind, self.regime, self.seed, self.policy, self.router, self.ratio, self.payload, version("helmgr"))
        if issubclass(POLICIES.get(self.policy, object), HelmPolicy):   # a retrained base, another adapter: another run
            parts += (helm_revision(POLICIES[self.policy]),)
        if self.router in ROUTERS and issubclass(ROUTERS[self.router], Helm):   # another router default: another run
            parts += (ROUTERS[self.router].revision(),)
        if self.kind in ("tenancy", "class-capacity"):              # another definition of a class figure
            parts += (class_metrics.FIGURES_REVISION,)
        text = repr(parts)
        return hashlib.sha256(text.encode()).hexdigest()[:20]


class RunStore:
    """Finished units in `folder/runs/`: one pickle each, written to a temporary name and renamed,
    so a unit is there whole or not at all; one that cannot be read back counts as not run."""

    def __init__(self, folder: Path):
        self.dir = Path(folder) / "runs"

    def path(self, unit: Unit) -> Path:
        return self.dir / f"{unit.key}.pkl"

    def entry(self, unit: Unit) -> dict:
        """{"result": the unit's result or None, "cpu_s": the worker-seconds it took (None: not
        recorded)}."""
        try:
            with open(self.path(unit), "rb") as f:
                found = pickle.load(f)
            return {"result": found["result"], "cpu_s": found.get("cpu_s")}
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, KeyError, ImportError):
            return {"result": None, "cpu_s": None}

    def put(self, unit: Unit, result, cpu_s: float | None = None) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{unit.key}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump({"unit": unit.name, "result": result, "cpu_s": cpu_s}, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, self.path(unit))


def policy_run(args: tuple[WorkloadSpec, SimConfig]) -> dict:
    """One policy run, kept small: its scalar summary fields, its mean ratio and P99 per window."""
    spec, cfg = args
    w = spec.build()
    result = simulate(cfg, w)
    s = result.summary
    return {"summary": slim(s),
            "window_ratio": window_ratios(result.series.timeline, cfg.nodes, w.duration_s),
            "window_p99_ms": np.asarray(result.series.window_p99_ms, float)}


def tenancy_run(args: tuple[WorkloadSpec, SimConfig]) -> dict:
    """One run with a class table: its scalar summary fields with the per-class and per-tenant
    figures and the fairness."""
    spec, cfg = args
    s = simulate(cfg, spec.build()).summary
    return {"summary": slim(s) | {k: s[k] for k in ("classes", "tenants", "fairness")}}


def _execute(unit: Unit) -> tuple[object, float]:
    """A worker's job: one run, point or bisection; and the seconds it took."""
    start = time.perf_counter()
    if unit.kind == "run":
        result = policy_run(unit.payload)
    elif unit.kind == "tenancy":
        result = tenancy_run(unit.payload)
    elif unit.kind == "point":
        result = phase_point(unit.payload)
    else:
        result = bisect_task(unit.payload)
    return result, time.perf_counter() - start


def first_units(ev: EvalConfig) -> list[Unit]:
    """Stage 1: every policy under every router, every grid ratio under every sweep router."""
    out = []
    for regime in ev.regimes:
        for seed in ev.seeds:
            spec = ev.spec(regime, seed)
            out += [Unit("run", regime, seed, p, rt, None, (spec, ev.cfg(p, rt, seed)))
                    for rt in ev.routers for p in ev.policies]
            out += [Unit("point", regime, seed, "static", rt, r, (spec, ev.cfg("static", rt, seed, r)))
                    for rt in ev.point_routers for r in ev.grid]
    return out + tenancy_units(ev)


def tenancy_units(ev: EvalConfig) -> list[Unit]:
    """With a class table: full HELM under every tenancy, at each of the class loads."""
    if ev.classes is None:
        return []
    return [Unit("tenancy", regime, seed, "helm", "helm", None, (ev.spec(regime, seed, load=load), cfg), load)
            for regime in ev.regimes for load in ev.class_loads for seed in ev.seeds for cfg in ev.tenancy_cfgs(seed)]


def static_best_ratio(points: dict, regime: str, seed: int, router: str, grid) -> float:
    """The grid ratio whose static run had the lowest P99."""
    runs: list[PhaseRun] = [points[(regime, seed, router, r)] for r in grid]
    return float(min(runs, key=lambda run: run.summary["p99_ms"]).ratio)


def capacity_units(ev: EvalConfig, points: dict) -> list[Unit]:
    """Stage 2: one bisection per capacity pair, regime and seed (a pair whose router or policy
    the evaluation does not run is left out); with a class table, one per tenancy too."""
    out = []
    for regime in ev.regimes if ev.capacity_regimes is None else ev.capacity_regimes:
        for seed in ev.seeds:
            spec = ev.spec(regime, seed, ev.capacity_duration_s)
            start = base_rate(spec)
            for policy, router in CAPACITY_PAIRS:
                if router not in ev.routers or (policy != "static-best" and policy not in ev.policies):
                    continue
                ratio = static_best_ratio(points, regime, seed, router, ev.grid) if policy == "static-best" else None
                cfg = ev.cfg("static" if policy == "static-best" else policy, router, seed, ratio)
                out.append(Unit("capacity", regime, seed, policy, router, ratio,
                                CapacityTask(spec, cfg, start, ev.capacity_tol, allow_large=ev.allow_large)))
            if ev.classes is not None:
                out += [Unit("class-capacity", regime, seed, "helm", "helm", None,
                             CapacityTask(spec, cfg, start, ev.capacity_tol, allow_large=ev.allow_large))
                        for cfg in ev.tenancy_cfgs(seed)]
    return out


def oracle_units(ev: EvalConfig) -> list[Unit]:
    extra = (ev.oracle_lookahead_s,) if ev.oracle_lookahead_s else ()      # keys of lookahead-0 units unchanged
    return [Unit("oracle", regime, seed, "oracle", rt, None,
                 (ev.spec(regime, seed), ev.cfg("static", rt, seed), tuple(ev.grid)) + extra)
            for regime in ev.regimes for seed in ev.seeds for rt in ev.oracle_routers if rt in ev.routers]


def run_oracle_unit(unit: Unit, jobs: int, ray_address: str | None, on_progress=None) -> dict:
    """The phase oracle, kept as its summary, its r* and band per 1-s window, and its block table."""
    spec, cfg, grid, *lookahead = unit.payload
    o = run_phase_oracle(cfg, spec.build(), list(grid), jobs, on_progress=on_progress, ray_address=ray_address,
                         lookahead_s=lookahead[0] if lookahead else 0.0)
    star, lo, hi = o.per_window()
    return {"summary": {k: v for k, v in o.summary.items() if not isinstance(v, (list, dict))},
            "window_ratio": window_ratios(o.series.timeline, cfg.nodes, spec.build().duration_s),
            "r_star": star, "band_lo": lo, "band_hi": hi, "in_phase": o.in_phase(), "blocks": o.block_table()}


# track(label, total) -> advance(k)
Track = Callable[[str, int], Callable[[int], None]]


def _quiet(label: str, total: int) -> Callable[[int], None]:
    return lambda k=1: None


def run_units(units: list[Unit], store: RunStore, jobs: int, ray_address: str | None, track: Track,
              label: str, seconds: dict) -> tuple[dict, int]:
    """Every unit's result (from the store, or run now and stored as it ends); and how many ran.
    `seconds[unit]` gets each unit's worker-seconds (None where the store did not record them)."""
    found = {u: store.entry(u) for u in units}
    done = {u: e["result"] for u, e in found.items()}
    seconds |= {u: e["cpu_s"] for u, e in found.items()}
    todo = [u for u in units if done[u] is None]
    advance = track(f"{label}: {len(todo)} to run ({len(units) - len(todo)} kept)", len(todo))

    def keep(i: int, timed) -> None:
        store.put(todo[i], *timed)
        done[todo[i]], seconds[todo[i]] = timed
    run_all(_execute, todo, jobs, ray_address, [u.name for u in todo], lambda i: advance(1), on_result=keep)
    return done, len(todo)


def evaluate(ev: EvalConfig, folder: Path, jobs: int = 1, ray_address: str | None = None,
             track: Track = _quiet) -> dict:
    """Run (or read back) every unit; the stored results by unit, how many units ran now, and
    the units' worker-seconds summed (`cpu_s`, the serial time; None if a unit kept none)."""
    store, seconds = RunStore(folder), {}
    results, ran = run_units(first_units(ev), store, jobs, ray_address, track, "runs and static points", seconds)
    points = {(u.regime, u.seed, u.router, u.ratio): r for u, r in results.items() if u.kind == "point"}
    if ev.capacity:
        caps, n = run_units(capacity_units(ev, points), store, jobs, ray_address, track, "capacity bisections",
                            seconds)
        results |= caps
        ran += n
    for unit in oracle_units(ev):
        entry = store.entry(unit)
        found, seconds[unit] = entry["result"], entry["cpu_s"]
        if found is None:
            n_blocks = len(oracle_blocks(unit.payload[0].build().phases))
            blocks = track(f"oracle {unit.regime} seed {unit.seed} @ {unit.router}", n_blocks)
            start = time.perf_counter()
            found = run_oracle_unit(unit, jobs, ray_address, lambda k, b=blocks: b(1))
            seconds[unit] = (time.perf_counter() - start) * max(jobs, 1)      # its replays on every worker
            store.put(unit, found, seconds[unit])
            ran += 1
        results[unit] = found
    spent = list(seconds.values())
    return {"results": results, "ran": ran, "config": ev, "cpu_s": None if None in spent else float(sum(spent))}


def config_dict(ev: EvalConfig) -> dict:
    """The evaluation's configuration, JSON-safe."""
    d = asdict(ev)
    blind = {"classes": None, "tenancy": "blind"}       # class-blind: written as before classes existed
    d["cluster"] = {k: v for k, v in d["cluster"].items()
                    if k not in ("policy", "ratio", "router", "seed") and not (k in blind and v == blind[k])}
    if ev.classes is None:                          # no multi-tenant section: written as before it existed
        del d["classes"], d["class_loads"]
    if not ev.allow_large:
        del d["allow_large"]
    d["helm_revision"] = stack_revision()           # which HELM its `helm` rows are (base hash, tiers, router)
    return d

