"""A workload named by its options, so that a worker process (or a Ray task) can build the same
stream from a small, picklable value.

`build` keeps the last two synthetic workloads it built: a study runs many units over one spec
(the evaluation's 36 a regime and seed), and building one takes ~0.7 s (its history and
candidate pools); a run only reads a built workload, so the same object serves them all.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

from helmgr.workload.stream import Workload
from helmgr.workload.synthetic import default_config, parse_regime, synthetic_workload
from helmgr.workload.trace import trace_workload

TRACE_DURATION_S = 120.0
KEEP = 2                                   # synthetic workloads kept built (each ~50-100 MB)


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    regime: str = "steady"                 # synthetic regime (ignored when `trace` is set)
    duration_s: float | None = None        # None: the regime's default, 360 s (a trace: 120 s)
    seed: int = 0
    rps: float | None = None               # None: the regime's default rate
    trace: str | None = None               # replay this log instead
    trace_format: str = "inter"
    time_compression: float | None = None  # a trace: its time divided by this (None: fit into the duration);
                                           # synthetic: the regime's whole shape this many times shorter
    clone_users: int = 1
    overlays: tuple[str, ...] = ()

    @property
    def seconds(self) -> float:
        """The simulated seconds of the workload this spec builds."""
        if self.duration_s is not None:
            return self.duration_s
        if self.trace is not None:
            return TRACE_DURATION_S
        cfg = default_config(self.regime)
        return (cfg.compressed(self.time_compression) if self.time_compression is not None else cfg).duration_s

    def build(self) -> Workload:
        if self.trace is None and self in _BUILT:
            _BUILT.move_to_end(self)
            return _BUILT[self]
        w = self._build()
        if self.trace is None:                    # a log may change on disk: built anew each time
            _BUILT[self] = w
            while len(_BUILT) > KEEP:
                _BUILT.popitem(last=False)
        return w

    def _build(self) -> Workload:
        if self.trace is not None:
            return trace_workload(self.trace, self.trace_format, self.seconds, self.seed, self.time_compression,
                                  self.clone_users, tuple(self.overlays))
        parse_regime(self.regime)
        cfg = default_config(self.regime)
        if self.time_compression is not None:              # the whole shape, shorter
            cfg = cfg.compressed(self.time_compression)
        overrides = ({"duration_s": self.duration_s} if self.duration_s is not None else {}) | (
            {"rps": self.rps} if self.rps is not None else {})
        return synthetic_workload(replace(cfg, **overrides), self.seed)


_BUILT: OrderedDict[WorkloadSpec, Workload] = OrderedDict()
