"""A node's window, computed in one place for the simulator, the controller and serving.

A backend (the simulated node or the real runtime) keeps running totals, `NodeCounters`; a
window is the difference of two of them plus the latencies of the requests that completed in
it (`node_window`). `WindowStats.from_window` turns that into the controller's view, in rates;
a serving stack that is not HELM's own fills `WindowStats` itself.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np


class NodeCounters(NamedTuple):
    """A node's running totals since it started."""

    busy_s: float
    emb_ids: int
    emb_misses: int
    kv_prefix_tokens: int
    kv_hit_tokens: int       # prefix tokens not recomputed: HBM hits + host-tier onloads
    cold_requests: int       # requests with nothing of their prefix cached
    emb_wait_s: float        # time on host gathers + H2D copies
    recompute_s: float       # time recomputing prefixes
    h2d_busy_s: float        # the H2D link's busy time (the real runtime: its fetch time)
    emb_shadow_hits: int     # accesses to rows just outside the EMB cache (when tracked)
    kv_shadow_tokens: int    # prefix tokens recently evicted KV would have saved (when tracked)

    def since(self, before: "NodeCounters") -> "NodeCounters":
        return NodeCounters(*(a - b for a, b in zip(self, before)))


@dataclass(frozen=True, slots=True)
class NodeWindow:
    """One node's last metrics window: its place and latencies, and the change of each of its
    `NodeCounters` over the window (one field each, by name)."""

    node: int
    t: float                 # window end
    span_s: float
    ratio: float
    arrivals: int            # routed to this node in the window
    completed: int
    p99_s: float | None      # of requests completed in the window
    queue_len: int
    busy_s: float
    emb_ids: int
    emb_misses: int
    kv_prefix_tokens: int
    kv_hit_tokens: int
    cold_requests: int
    emb_wait_s: float
    recompute_s: float
    h2d_busy_s: float
    emb_shadow_hits: int
    kv_shadow_tokens: int
    tail_fetch_s: float = 0.0      # EMB fetch time of the requests at or above the window's P99
    tail_recompute_s: float = 0.0  # prefix recompute time of the same requests


def p99(latencies: Sequence[float]) -> float | None:
    """The P99 of a window's latencies (None for an empty window): `np.percentile(latencies, 99)`
    bit for bit (its default, linear method: the same index, weight and interpolation, in the same
    float64 operations), from one partition instead of numpy's general path (~10x less time a
    window; a simulated run closes one per node per second)."""
    a = np.asarray(latencies, np.float64)
    n = a.size
    if not n:
        return None
    v = (n - 1) * 0.99                          # numpy's virtual index
    if v >= n - 1 or np.isnan(a).any():         # (the top value; a NaN: what numpy gives)
        return float(np.percentile(a, 99))
    lo = math.floor(v)
    part = np.partition(a, (lo, lo + 1))
    x0, x1 = float(part[lo]), float(part[lo + 1])
    t = v - lo
    diff = x1 - x0
    return x1 - diff * (1.0 - t) if t >= 0.5 else x0 + diff * t     # numpy's _lerp


def node_window(node: int, t: float, span_s: float, ratio: float, arrivals: int, latencies: Sequence[float],
                queue_len: int, delta: NodeCounters,
                parts: tuple[Sequence[float], Sequence[float]] | None = None) -> NodeWindow:
    """The window of `node` ending at `t`: `delta` its counters' change, `latencies` those of the
    requests that completed in it, `parts` their EMB fetch and prefix recompute seconds (two
    sequences in the order of `latencies`)."""
    lat = np.asarray(latencies, np.float64)
    tail = p99(lat)
    tail_fetch = tail_recompute = 0.0
    if tail is not None and parts is not None and len(parts[0]):
        fetch, recompute = np.asarray(parts[0], np.float64), np.asarray(parts[1], np.float64)
        if not len(fetch) == len(recompute) == len(lat):
            raise ValueError(f"node_window: {len(lat)} latencies but {len(fetch)} fetch and {len(recompute)} recompute times")
        for i in np.flatnonzero(lat >= tail).tolist():      # few (the top 1 %): summed in order
            tail_fetch += float(fetch[i])
            tail_recompute += float(recompute[i])
    return NodeWindow(node=node, t=t, span_s=span_s, ratio=ratio, arrivals=arrivals, completed=len(lat),
                      p99_s=tail, queue_len=queue_len, tail_fetch_s=tail_fetch, tail_recompute_s=tail_recompute,
                      **delta._asdict())


@dataclass(frozen=True, slots=True)
class WindowStats:
    """One node's last window as the controller sees it (the library API's input). Rates in
    [0, 1]; a field a stack cannot measure may be left at its default (the controller then sees a
    neutral value)."""

    ratio: float                    # EMB share of the pool now
    arrival_rps: float              # requests that arrived at the node per second
    p99_s: float | None             # P99 latency of the window's requests (None: no request)
    slo_s: float                    # the latency objective
    emb_hit_rate: float = 1.0
    kv_hit_rate: float = 1.0
    queue_len: float = 0.0          # requests waiting at the window's end
    h2d_utilization: float = 0.0    # share of the window the H2D link was busy
    new_user_share: float = 0.0     # share of requests with nothing of their prefix cached
    emb_time_share: float = 0.5     # EMB-fetch time / (EMB-fetch + prefix-recompute time)

    @staticmethod
    def real(v) -> bool:
        """Whether `v` is a real number: an int, float, bool, Fraction, Decimal, numpy scalar...
        (not a complex, a string, an array)."""
        return isinstance(v, numbers.Number) and (isinstance(v, numbers.Real) or not isinstance(v, numbers.Complex))

    def __post_init__(self):
        """Every field a real number (p99_s may be None); TypeError naming the first that is not.
        Its value is not checked here: the controller refuses a NaN or an impossible rate itself."""
        for name in self.__slots__:
            v = getattr(self, name)
            if type(v) is not float and not WindowStats.real(v) and not (v is None and name == "p99_s"):
                raise TypeError(f"WindowStats.{name} must be a real number, got {repr(v)[:60]}")

    def as_floats(self) -> list[float]:
        """The fields as floats, in order (p99_s None: NaN); a number too large for a float is
        +-inf. TypeError naming a field that is not a real number (for any object with these
        fields: the controller's slow path for numbers the compiled step does not take)."""
        out = []
        for name in WindowStats.__slots__:
            v = getattr(self, name)
            if v is None and name == "p99_s":
                out.append(math.nan)
            elif not WindowStats.real(v):
                raise TypeError(f"WindowStats.{name} must be a real number, got {repr(v)[:60]}")
            else:
                try:
                    out.append(float(v))
                except OverflowError:                    # an int or Fraction past 1.8e308
                    out.append(math.inf if v > 0 else -math.inf)
                except ValueError:                       # Decimal('sNaN')
                    out.append(math.nan)
        return out

    @classmethod
    def from_window(cls, w: NodeWindow, slo_s: float) -> "WindowStats":
        span = max(w.span_s, 1e-9)
        fetch, recompute = w.emb_wait_s, w.recompute_s
        return cls(ratio=w.ratio, arrival_rps=w.arrivals / span, p99_s=w.p99_s, slo_s=slo_s,
                   emb_hit_rate=1.0 - w.emb_misses / w.emb_ids if w.emb_ids else 1.0,
                   kv_hit_rate=w.kv_hit_tokens / w.kv_prefix_tokens if w.kv_prefix_tokens else 1.0,
                   queue_len=float(w.queue_len), h2d_utilization=min(1.0, w.h2d_busy_s / span),
                   new_user_share=w.cold_requests / w.completed if w.completed else 0.0,
                   emb_time_share=fetch / (fetch + recompute) if fetch + recompute > 0 else 0.5)
