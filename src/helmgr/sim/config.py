"""What one simulation run is: the cluster, its policy and router, and the clocks."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from helmgr.core.classes import ClassTable
from helmgr.core.errors import HelmInputError
from helmgr.core.validate import NON_NEGATIVE, POSITIVE, Range, number, seed


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """Node `node` goes down at `down_s` and, if `up_s` is set, comes back (cold KV) at `up_s`."""

    node: int
    down_s: float
    up_s: float | None = None


def parse_fault(text: str, nodes: int | None = None) -> FaultSpec:
    """`I@T1[:T2]` -> FaultSpec, or a named error."""
    m = re.fullmatch(r"\s*(\d+)@([0-9.]+)(?::([0-9.]+))?\s*", text)
    if not m:
        raise HelmInputError(f"--fail-node {text!r} is not of the form I@T1[:T2] (e.g. 2@20:40)")
    try:
        node, down, up = int(m[1]), float(m[2]), float(m[3]) if m[3] else None
    except ValueError:
        raise HelmInputError(f"--fail-node {text!r} has a time that is not a number") from None
    if not all(math.isfinite(t) for t in (down, up or 0.0)):
        raise HelmInputError(f"--fail-node {text!r} has a time that is not finite")
    if nodes is not None and node >= nodes:
        raise HelmInputError(f"--fail-node {text!r}: node {node} does not exist (nodes 0..{nodes - 1})")
    if up is not None and up <= down:
        raise HelmInputError(f"--fail-node {text!r}: back-up time {up} is not after the failure at {down}")
    return FaultSpec(node, down, up)


def _show(f: FaultSpec) -> str:
    return f"{f.node}@{f.down_s:g}" + ("" if f.up_s is None else f":{f.up_s:g}")


def check_faults(faults: tuple[FaultSpec, ...], duration_s: float | None = None) -> None:
    """A fault that would change nothing is an error, not a silent no-op: a failure at or after the
    run's end (`duration_s`), a return after it, or two failures of one node that overlap (the
    node is already down at the second, and the first's return would cancel it)."""
    for f in faults:
        if duration_s is not None and f.down_s >= duration_s:
            raise HelmInputError(f"--fail-node {_show(f)}: the failure at {f.down_s:g} s is not inside "
                                 f"the run (0..{duration_s:g} s)")
        if duration_s is not None and f.up_s is not None and f.up_s > duration_s:
            raise HelmInputError(f"--fail-node {_show(f)}: the return at {f.up_s:g} s is after the run's end "
                                 f"({duration_s:g} s); leave it out to keep the node down")
    ordered = sorted(faults, key=lambda f: (f.node, f.down_s))
    for a, b in zip(ordered, ordered[1:]):
        if a.node == b.node and (a.up_s is None or b.down_s <= a.up_s):
            raise HelmInputError(f"--fail-node {_show(a)} and {_show(b)} overlap on node {a.node}")


ENGINES = ("batched", "pipelined")
MAX_EMB_SAMPLE = 1024
TENANCIES = ("blind", "strict", "quota", "pools", "helm")   # docs/tenancy.md: FCFS | bands | FCFS, KV quotas |
                                                            # FCFS, nodes per class | bands, DRR, KV by band
SIM_PATHS = ("auto", "compiled", "python")     # auto: compiled when the configuration allows it
@dataclass(frozen=True, slots=True)
class SimConfig:
    """One run's cluster. The defaults are the default scenario's: 8 A100-80G nodes serving the large
    model in batches of up to 8 on two engines, a 20-ms P99 target."""

    nodes: int = 8
    hardware: str = "a100-80g"
    model: str = "large"
    policy: str = "static"
    ratio: float = 0.5                 # initial (and, for `static`, fixed) EMB share
    router: str = "prefix-aware"
    slo_ms: float | None = 20.0        # None: the model preset's SLO
    seed: int = 0
    tick_s: float = 0.010              # controller tick
    window_s: float = 1.0              # metrics/control window
    warmup_s: float = 15.0             # latency metrics skip arrivals before this (KV caches start empty)
    refresh_s: float = 2.0             # EMB cache refresh interval
    refill: str = "lazy"
    refill_share: float = 0.25
    emb_policy: str = "lfu"
    kv_tail_first: bool = False
    host_kv_gib: float = 0.0
    max_batch: int = 8                 # requests a node takes together when it frees up ...
    token_budget: int = 32768          # ... while their tokens (prefix + new + candidates) fit in this
    engine: str = "pipelined"          # batched | pipelined (service.BatchServer)
    r_min: float = 0.05
    r_max: float = 0.95
    faults: tuple[FaultSpec, ...] = ()
    central_queue: bool = False        # late binding: one FCFS queue, the first free node takes the head
    bypass_caches: bool = False        # queueing checks: service time is an exponential draw ...
    service_mean_s: float = 0.0        # ... with this mean, instead of the node model
    path: str = "auto"                 # the per-request path: auto | compiled | python (sim/engine.py)
    emb_sample: int = 1                 # EMB caches track one item id in this many (memory/emb.py)
    classes: ClassTable | None = None  # SLO classes and tenants: figures per class and tenant (core/classes.py)
    tenancy: str = "blind"             # how classes are served: blind | strict | quota | pools | helm (docs/tenancy.md)

    def metrics_warmup_s(self, duration_s: float) -> float:
        """The warm-up the latency metrics skip in a run of `duration_s`: `warmup_s`, at most half
        the run (so a short run still measures something)."""
        return min(self.warmup_s, 0.5 * duration_s)

    def validate(self, duration_s: float | None = None) -> "SimConfig":
        """Every field finite, in range and of its type; faults inside a run of `duration_s`."""
        number("nodes", self.nodes, Range(1), integer=True)
        number("max-batch", self.max_batch, Range(1), integer=True)
        number("token-budget", self.token_budget, Range(1), integer=True)
        number("emb-sample", self.emb_sample, Range(1, MAX_EMB_SAMPLE), integer=True)
        if self.emb_sample & (self.emb_sample - 1):
            raise HelmInputError(f"emb-sample {self.emb_sample} is not a power of two (1, 2, 4, ..., {MAX_EMB_SAMPLE})")
        if self.path not in SIM_PATHS:
            raise HelmInputError(f"unknown simulator path {self.path!r} (known: {', '.join(SIM_PATHS)})")
        if self.tenancy not in TENANCIES:
            raise HelmInputError(f"unknown tenancy {self.tenancy!r} (known: {', '.join(TENANCIES)})")
        if self.tenancy != "blind" and self.classes is None:
            raise HelmInputError(f"--tenancy {self.tenancy} needs a class table (--classes)")
        if self.tenancy != "blind" and self.central_queue:
            raise HelmInputError(f"--tenancy {self.tenancy} queues at each node; a central queue has none")
        if self.tenancy == "pools":
            self.classes.pool_sizes(self.nodes)         # a node per class, or one line naming the counts
        if self.engine not in ENGINES:
            raise HelmInputError(f"unknown engine {self.engine!r} (known: {', '.join(ENGINES)})")
        seed("seed", self.seed)
        for name in ("tick_s", "window_s", "refresh_s"):
            number(name, getattr(self, name), POSITIVE)
        for name in ("warmup_s", "host_kv_gib", "service_mean_s"):
            number(name, getattr(self, name), NON_NEGATIVE)
        for name in ("ratio", "refill_share", "r_min", "r_max"):
            number(name, getattr(self, name), Range(0.0, 1.0))
        if self.r_min > self.r_max:
            raise HelmInputError(f"r_min {self.r_min} is above r_max {self.r_max}")
        if self.slo_ms is not None:
            number("slo-ms", self.slo_ms, POSITIVE)
        for f in self.faults:
            if f.node >= self.nodes:
                raise HelmInputError(f"fault on node {f.node}, but the cluster has nodes 0..{self.nodes - 1}")
        check_faults(self.faults, duration_s)
        return self
