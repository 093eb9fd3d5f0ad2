"""What one simulation run is: the cluster, its policy and router, and the clocks."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from helmgr.core.errors import HelmInputError


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
    if nodes is not None and node >= nodes:
        raise HelmInputError(f"--fail-node {text!r}: node {node} does not exist (nodes 0..{nodes - 1})")
    if up is not None and up <= down:
        raise HelmInputError(f"--fail-node {text!r}: back-up time {up} is not after the failure at {down}")
    return FaultSpec(node, down, up)


@dataclass(frozen=True, slots=True)
class SimConfig:
    nodes: int = 8
    hardware: str = "a100-80g"
    model: str = "large"
    policy: str = "static"
    ratio: float = 0.5                 # initial (and, for `static`, fixed) EMB share
    router: str = "prefix-aware"
    slo_ms: float | None = None        # None: the model preset's SLO
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
    max_batch: int = 1                 # requests served together when a node frees up
    r_min: float = 0.05
    r_max: float = 0.95
    faults: tuple[FaultSpec, ...] = ()
    central_queue: bool = False        # late binding: one FCFS queue, the first free node takes the head
    bypass_caches: bool = False        # queueing checks: service time is an exponential draw ...
    service_mean_s: float = 0.0        # ... with this mean, instead of the node model

    def validate(self) -> "SimConfig":
        if self.nodes < 1:
            raise HelmInputError(f"nodes must be >= 1, got {self.nodes}")
        for name in ("tick_s", "window_s", "refresh_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise HelmInputError(f"{name} must be > 0, got {v}")
        if not (math.isfinite(self.warmup_s) and self.warmup_s >= 0):
            raise HelmInputError(f"warmup must be >= 0 s, got {self.warmup_s}")
        if not 0.0 <= self.ratio <= 1.0:
            raise HelmInputError(f"ratio must be in [0, 1], got {self.ratio}")
        if self.slo_ms is not None and not self.slo_ms > 0:
            raise HelmInputError(f"slo-ms must be > 0, got {self.slo_ms}")
        if self.max_batch < 1:
            raise HelmInputError(f"max-batch must be >= 1, got {self.max_batch}")
        for f in self.faults:
            if f.node >= self.nodes:
                raise HelmInputError(f"fault on node {f.node}, but the cluster has nodes 0..{self.nodes - 1}")
        return self
