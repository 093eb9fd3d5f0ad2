"""The node contract: what the simulator, the calibration and serving ask of a node. The
simulated `helmgr.sim.node.Node` and the real `helmgr.real.runtime.NodeRuntime` both satisfy it
(tests/test_backend.py checks both against these protocols)."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from helmgr.core.records import History, NodeConfig, NodeStats
from helmgr.core.window import NodeCounters


@runtime_checkable
class Served(Protocol):
    """One request's service on a node (`Service` in the simulator; the real path's record adds
    its measured phases)."""

    start: float
    end: float
    kv_tokens: int          # prefix positions not recomputed
    ids: int                # rows looked up
    misses: int             # rows not resident
    unfilled_misses: int    # of which on rows a resize or refresh left unfilled
    fetch_s: float          # EMB gathers and copies before compute
    recompute_s: float      # prefix positions recomputed


@runtime_checkable
class NodeBackend(Protocol):
    config: NodeConfig
    stats: NodeStats

    @property
    def ratio(self) -> float:
        """The EMB share of the pool now."""

    def resize(self, ratio: float, now: float) -> tuple:
        """Set the EMB share: (what moved, when the refill mode wants its next step or None)."""

    def refresh(self, now: float) -> float | None:
        """Periodic EMB re-ranking; when the refill mode wants its next step, or None."""

    def serve(self, now: float, user: int, prefix_len: int, new_ids: np.ndarray, cand_ids: np.ndarray,
              history: History) -> Served:
        """Serve one request starting at `now`."""

    def counters(self) -> NodeCounters:
        """Running totals, for windows (core.window)."""

    def check_integrity(self) -> None:
        """Assert the pool's and the caches' invariants."""
