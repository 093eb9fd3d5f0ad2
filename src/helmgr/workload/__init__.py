"""Workloads (docs/workloads.md): the synthetic generator and trace replay, as chunked request streams."""
from helmgr.workload.chunk import RequestChunk, RequestTable
from helmgr.workload.phases import Phase
from helmgr.workload.stats import describe
from helmgr.workload.stream import StreamChunk, TrendEvent, Trending, Workload
from helmgr.workload.synthetic import (REGIMES, SyntheticConfig, default_config, parse_regime,
                                       synthetic_workload)
from helmgr.workload.trace import FORMATS, OVERLAYS, read_trace, trace_workload
from helmgr.workload.spec import WorkloadSpec

__all__ = [
    "RequestChunk", "RequestTable", "StreamChunk", "Workload", "Trending", "TrendEvent", "Phase", "describe",
    "REGIMES", "SyntheticConfig", "default_config", "parse_regime", "synthetic_workload",
    "FORMATS", "OVERLAYS", "read_trace", "trace_workload", "WorkloadSpec",
]
