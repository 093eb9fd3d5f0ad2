"""Capacity at SLO: the highest base request rate at which a policy + router keeps
window SLO satisfaction >= 95 %, by bisection over the rate.

`bisect_rate` knows only a probe, rate -> pass or fail: from a starting rate it doubles (after a
pass) or halves (after a fail) until it holds a passing rate below a failing one, then halves
the bracket until the failing rate is within `tol` (2 %) of the passing one. Capacity is the
highest rate measured to pass, so it lies within `tol` below the threshold when passing falls
monotonically with the rate. One seeded run's noise can break that (a rate passes, a lower one
fails); every probe is kept, in order, so a reader can see it. The doubling stops at a ceiling:
by default the highest rate whose run stays within the request and memory limits every command
holds a run to (`core.validate.max_rate`; `--allow-large` lifts it to `CEILING`), so a cluster
that passes there reports that rate as its capacity with no failing rate above it.

A simulated probe (`run_probe`) is one run of the workload with its base rate (`rps`, which
scales the whole arrival curve, trend's diurnal swing included) set to the probed rate; it
passes when its window SLO satisfaction is >= the target and it is not overloaded; with a class
table, when every class's is (each against its own target). `capacity`
runs one bisection per seed, the seeds in parallel (experiments.parallel), and reports the
lowest: the rate every seed sustains.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Callable, Sequence

from helmgr.core.errors import HelmInputError
from helmgr.core.validate import max_rate
from helmgr.experiments.parallel import run_all
from helmgr.sim import RunStopped, SimConfig, simulate
from helmgr.workload import WorkloadSpec, default_config

TARGET = 0.95          # window SLO satisfaction a rate must keep
TOL = 0.02             # the bracket's width at the end: failing rate / passing rate - 1
MAX_PROBES = 40
CEILING = 1e7          # the highest rate a search probes with --allow-large
BACKLOG_S = 1.0       # a probe stops once its queue holds this many seconds of arrivals, window after window


def _with_defaults(self, state) -> None:
    """`__setstate__` of a slotted dataclass an evaluation keeps: one kept before a field was added
    (slots restore fields by position) reads back with that field's default."""
    every = fields(self)
    for f, value in zip(every, list(state) + [f.default for f in every[len(state):]]):
        object.__setattr__(self, f.name, value)


@dataclass(frozen=True, slots=True)
class Probe:
    rate: float
    passed: bool
    satisfaction: float | None = None        # window SLO satisfaction of the run
    utilization: float | None = None
    overloaded: bool = False
    p99_ms: float | None = None
    stopped: str | None = None               # why the run was cut short (it had failed already)
    worst_class: str | None = None           # with a class table: the class whose satisfaction was read
    classes: dict | None = None              # with a class table: each class's window SLO satisfaction

    __setstate__ = _with_defaults


@dataclass(frozen=True, slots=True)
class Bracket:
    capacity: float | None                   # the highest rate measured to pass; None: none passed
    fails_at: float | None                   # the lowest rate above it measured to fail; None: none failed
    probes: tuple[Probe, ...]
    ceiling: float = CEILING                 # the highest rate the search would probe

    __setstate__ = _with_defaults

    def to_dict(self) -> dict:
        return {"capacity_rps": self.capacity, "fails_at_rps": self.fails_at, "ceiling_rps": self.ceiling,
                "probes": [asdict(p) for p in self.probes]}


def bisect_rate(probe: Callable[[float], Probe], start: float, tol: float = TOL, floor: float = 1.0,
                ceiling: float = CEILING, max_probes: int = MAX_PROBES) -> Bracket:
    """Bracket the rate at which `probe` turns from pass to fail, to within `tol`, from `start`.
    Stops at `floor` (nothing passes: capacity None) and `ceiling` (nothing fails: fails_at None)."""
    if not (start > 0 and tol > 0 and 0 < floor <= ceiling):
        raise ValueError(f"bisect_rate: start {start}, tol {tol}, floor {floor}, ceiling {ceiling}")
    probes: list[Probe] = []

    def passes(rate: float) -> bool:
        probes.append(probe(rate))
        return probes[-1].passed

    lo = hi = None
    rate = min(max(start, floor), ceiling)
    while (lo is None or hi is None) and len(probes) < max_probes:
        if passes(rate):
            lo = rate
            if hi is None and rate >= ceiling:
                break
            rate = min(2 * rate, ceiling)
        else:
            hi = rate
            if lo is None and rate <= floor:
                break
            rate = max(rate / 2, floor)
    while lo is not None and hi is not None and hi / lo - 1 > tol and len(probes) < max_probes:
        mid = math.sqrt(lo * hi)
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return Bracket(lo, hi, tuple(probes), ceiling)


def run_probe(spec: WorkloadSpec, cfg: SimConfig, rate: float, target: float = TARGET) -> Probe:
    """One run at base rate `rate`: passes with window SLO satisfaction >= target, not overloaded.
    A run that has already failed is stopped (`backlogged`): a probe far above capacity would
    otherwise carry its growing backlog, time and memory, to the end."""
    w = replace(spec, rps=float(rate)).build()
    try:
        s = simulate(cfg, w, stop=backlogged(cfg, w.duration_s, rate, target)).summary
    except RunStopped as e:
        return Probe(float(rate), False, overloaded=True, stopped=str(e))
    sat, worst = satisfaction(s)
    ok = sat is not None and math.isfinite(sat) and sat >= target and not s["overloaded"]
    classes = {name: c["window_slo_satisfaction"] for name, c in s["classes"].items()} if "classes" in s else None
    return Probe(float(rate), bool(ok), sat, s["utilization"], bool(s["overloaded"]), s["p99_ms"], worst_class=worst,
                 classes=classes)


def satisfaction(summary: dict) -> tuple[float, str | None]:
    """A run's window SLO satisfaction, and with a class table the lowest class's (and its name):
    capacity at SLO with classes is the rate at which every class keeps its own target (a class
    no request was of, one no tenant is in, cannot fail; one whose requests left no window does)."""
    sent = {name: c for name, c in summary.get("classes", {}).items() if c["requests"]}
    if not sent:
        return summary["window_slo_satisfaction"], None
    name, c = min(sent.items(),
                  key=lambda kv: kv[1]["window_slo_satisfaction"] if math.isfinite(kv[1]["window_slo_satisfaction"])
                  else -1.0)
    return c["window_slo_satisfaction"], name


def backlogged(cfg: SimConfig, duration_s: float, rate: float, target: float = TARGET):
    """A `simulate` stop check: the run has failed once more windows than `target` allows (after
    the warm-up) have ended, one after another, with over a second of arrivals (`rate` x 1 s)
    queued. By Little's law a queue holding L requests at arrival rate `rate` means a mean wait of
    L / rate, so through such a streak requests wait about a second on average — 50 x the 20-ms
    SLO — and every window in it has its P99 past any SLO under a second."""
    warmup = cfg.metrics_warmup_s(duration_s)
    allowed = math.floor((1 - target) * max(0.0, duration_s - warmup) / cfg.window_s + 1e-9)

    def check(cluster) -> str | None:
        t, queues = cluster.rec.window_t, cluster.rec.window_queues
        streak = 0
        for k in range(len(t) - 1, -1, -1):
            if t[k] <= warmup or sum(queues[k]) <= rate * BACKLOG_S:
                break
            streak += 1
        if streak > allowed:
            return f"stopped at {t[-1]:g} s: {streak} windows in a row ended with over {BACKLOG_S:g} s of arrivals queued"
        return None
    return check


@dataclass(frozen=True, slots=True)
class CapacityTask:
    """One bisection (a worker builds everything from this)."""

    spec: WorkloadSpec
    cfg: SimConfig
    start: float
    tol: float = TOL
    target: float = TARGET
    allow_large: bool = False                # probe up to CEILING, not only to the limits' max_rate

    @property
    def name(self) -> str:
        c = self.cfg
        return f"capacity {self.spec.regime} seed {self.spec.seed} {c.policy}@{c.router} ({c.nodes} nodes)"


def bisect_task(task: CapacityTask) -> Bracket:
    ceiling = CEILING if task.allow_large else max(max_rate(task.spec.seconds, task.cfg.nodes), 1.0)
    return bisect_rate(lambda rate: run_probe(task.spec, task.cfg, rate, task.target), task.start, task.tol,
                       ceiling=ceiling)


def capacity_tasks(spec: WorkloadSpec, cfg: SimConfig, seeds: Sequence[int], tol: float = TOL,
                   target: float = TARGET, start: float | None = None,
                   allow_large: bool = False) -> list[CapacityTask]:
    """One bisection per seed, each from `start` (None: the workload's own base rate) up to
    the limits' `max_rate` (`allow_large`: CEILING)."""
    if spec.trace is not None:
        raise HelmInputError("capacity at SLO scales a synthetic workload's base rate (--rps); "
                             "a trace has none (use --time-compression to replay it faster)")
    if not 0 < target <= 1:
        raise HelmInputError(f"capacity target {target!r} must be in (0, 1]")
    if not 0 < tol < 1:
        raise HelmInputError(f"capacity tolerance {tol!r} must be in (0, 1)")
    first = start if start is not None else base_rate(spec)
    return [CapacityTask(replace(spec, seed=s), replace(cfg, seed=s), float(first), tol, target, allow_large)
            for s in seeds]


def base_rate(spec: WorkloadSpec) -> float:
    """The synthetic workload's base rate: its `rps`, or its regime's default."""
    return spec.rps or default_config(spec.regime).rps


def summarize_capacity(brackets: Sequence[Bracket], seeds: Sequence[int]) -> dict:
    """`capacity_rps`: the lowest seed's (None if any seed had none), with each seed's bracket."""
    caps = [b.capacity for b in brackets]
    return {"capacity_rps": None if any(c is None for c in caps) else min(caps),
            "seeds": {str(s): b.to_dict() for s, b in zip(seeds, brackets)}}


def capacity(spec: WorkloadSpec, cfg: SimConfig, seeds: Sequence[int], jobs: int = 1,
             ray_address: str | None = None, tol: float = TOL, target: float = TARGET,
             start: float | None = None, on_done=None, allow_large: bool = False) -> dict:
    """Capacity at SLO of `cfg` (its policy and router) on `spec`, one bisection per seed."""
    tasks = capacity_tasks(spec, cfg, seeds, tol, target, start, allow_large)
    brackets = run_all(bisect_task, tasks, jobs, ray_address, [t.name for t in tasks],
                       on_done and (lambda _: on_done()))
    return summarize_capacity(brackets, seeds)
