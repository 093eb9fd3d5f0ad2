"""The cost model (docs/node.md): pure functions of a node profile and a request's shape.

`CostModel` folds the profile into a handful of floats once, so the simulator's hot path pays a
multiply per term instead of a chain of property lookups. Every method is pure.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from helmgr.core.profiles import HardwareProfile, ModelProfile, NodeProfile


def attention_pairs(cached: int, tokens: int) -> int:
    """(query, key) pairs when `tokens` positions are computed causally after `cached` ones:
    sum over i = cached+1 .. cached+tokens of i."""
    return tokens * cached + tokens * (tokens + 1) // 2


class ServiceBreakdown(NamedTuple):
    """Seconds per part of one request's service (the H2D part excludes link queueing)."""

    lookup_s: float
    host_s: float
    transfer_s: float
    compute_s: float
    kv_onload_s: float

    @property
    def total_s(self) -> float:
        return self.lookup_s + self.host_s + self.transfer_s + self.compute_s + self.kv_onload_s


@dataclass(frozen=True, slots=True)
class CostModel:
    row_bytes: int
    kv_bytes_per_token: int
    hbm_bw: float
    pcie_bw: float
    pcie_latency_s: float
    host_lookup_s: float
    flops: float
    layers: int
    linear_flops: int
    attention_flops: int
    launch_overhead_s: float
    batch_flops: float = 0.0          # batch-efficiency curve: plateau FLOP/s ...
    batch_half_rows: float = 0.0      # ... and the rows in flight at which half of it is reached
    batch_request_s: float = 0.0      # fixed cost of each request beyond a batch's first

    @classmethod
    def from_profile(cls, profile: NodeProfile) -> "CostModel":
        return cls.from_parts(profile.hardware, profile.model)

    @classmethod
    def from_parts(cls, hw: HardwareProfile, model: ModelProfile) -> "CostModel":
        return cls(
            row_bytes=model.row_bytes,
            kv_bytes_per_token=model.kv_bytes_per_token,
            hbm_bw=hw.hbm_bw,
            pcie_bw=hw.pcie_bw,
            pcie_latency_s=hw.pcie_latency_s,
            host_lookup_s=hw.host_lookup_s,
            flops=hw.flops,
            layers=model.layers,
            linear_flops=model.linear_flops_per_token,
            attention_flops=model.attention_flops_per_pair,
            launch_overhead_s=model.launches * hw.launch_s,
            batch_flops=hw.batch_flops,
            batch_half_rows=hw.batch_half_rows,
            batch_request_s=hw.batch_request_s,
        )

    # -- embedding side -------------------------------------------------------------------
    def lookup_s(self, ids: int) -> float:
        """Reading `ids` resident rows from HBM."""
        return ids * self.row_bytes / self.hbm_bw

    def transfer_s(self, nbytes: float) -> float:
        """One H2D copy of `nbytes` on an idle link: fixed latency + bytes / bandwidth."""
        return 0.0 if nbytes <= 0 else self.pcie_latency_s + nbytes / self.pcie_bw

    def host_s(self, misses: int) -> float:
        """Host-side gather of `misses` rows into the pinned staging buffer."""
        return misses * self.host_lookup_s

    def miss_s(self, misses: int) -> float:
        """Host gather + H2D copy of `misses` rows (no link queueing)."""
        return self.host_s(misses) + self.transfer_s(misses * self.row_bytes)

    # -- compute side ---------------------------------------------------------------------
    def prefix_flops(self, tokens: int, cached: int) -> float:
        """FLOPs to compute `tokens` positions after `cached` cached ones, all layers."""
        pairs = attention_pairs(cached, tokens)
        return self.layers * (self.linear_flops * tokens + self.attention_flops * pairs)

    def candidate_flops(self, candidates: int, context: int) -> float:
        """FLOPs to score `candidates`, each attending to `context` history tokens and itself
        (M-FALCON: candidates see the history, not each other)."""
        pairs = candidates * (context + 1)
        return self.layers * (self.linear_flops * candidates + self.attention_flops * pairs)

    def request_flops(self, tokens: int, cached: int, candidates: int) -> float:
        """FLOPs of one request: `tokens` positions after `cached` ones, then its candidates."""
        return self.prefix_flops(tokens, cached) + self.candidate_flops(candidates, cached + tokens)

    def compute_s(self, tokens: int, cached: int, candidates: int) -> float:
        """One request served alone at the flat per-request efficiency (`Node.serve`, the real path)."""
        flops = self.prefix_flops(tokens, cached) + self.candidate_flops(candidates, cached + tokens)
        return flops / self.flops + self.launch_overhead_s

    def batch_rate(self, rows: int) -> float:
        """Achieved FLOP/s with `rows` rows in flight (a batch's computed tokens + candidates): the
        batch-efficiency curve plateau x rows / (rows + half rows)."""
        if rows <= 0:
            raise ValueError(f"a batch has at least one row in flight, got {rows}")
        return self.batch_flops * rows / (rows + self.batch_half_rows)

    def batch_compute_s(self, flops: float, rows: int, requests: int = 1) -> float:
        """A batch's compute: its `requests`' `flops` at the curve's rate for `rows`, launches paid
        once, and each request beyond the first its own fixed cost."""
        return flops / self.batch_rate(rows) + self.launch_overhead_s + (requests - 1) * self.batch_request_s

    # -- KV side --------------------------------------------------------------------------
    def kv_bytes(self, tokens: int) -> int:
        return tokens * self.kv_bytes_per_token

    def kv_onload_s(self, tokens: int) -> float:
        """Copying `tokens` positions of K/V from the host tier (no link queueing)."""
        return self.transfer_s(self.kv_bytes(tokens))

    def recompute_s(self, tokens: int, cached: int) -> float:
        """Recomputing `tokens` prefix positions after `cached` ones (FLOPs only; the row
        lookups they need are charged separately)."""
        return self.prefix_flops(tokens, cached) / self.flops

    # -- one request ----------------------------------------------------------------------
    def breakdown(self, prefix_len: int, cached: int, new_tokens: int, candidates: int,
                  misses: int, onload_tokens: int = 0) -> ServiceBreakdown:
        """Service of one request on an idle node. `cached` prefix positions come from HBM,
        `onload_tokens` more from the host KV tier; the rest of the prefix is recomputed."""
        start = cached + onload_tokens
        tokens = (prefix_len - start) + new_tokens
        ids = tokens + candidates
        return ServiceBreakdown(
            lookup_s=self.lookup_s(ids),
            host_s=self.host_s(misses),
            transfer_s=self.transfer_s(misses * self.row_bytes),
            compute_s=self.compute_s(tokens, start, candidates),
            kv_onload_s=self.kv_onload_s(onload_tokens),
        )
