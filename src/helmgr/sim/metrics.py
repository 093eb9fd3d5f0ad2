"""Metrics: per request, per window, per node and in total; the run's JSON summary (docs/simulator.md#metrics)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from helmgr.core.records import Request, Service
from helmgr.core.window import p99 as window_p99
from helmgr.memory.link import CAUSES
from helmgr.sim.bursts import burst_peaks, burst_worst, peak_load, window_load_series


class Column:
    """One per-request field of a run: values appended one at a time (the Python path) or as
    arrays (the compiled path's completions), in order; read as one numpy array of `dtype`
    (np.asarray, len, iteration), built when first read. No Python object per value on the
    compiled path, and no list to convert at the end."""

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self._blocks: list[np.ndarray] = []
        self._tail: list = []                    # values appended since the last block
        self.append = self._tail.append          # (the list's own method: the Python path's per-request cost)

    def extend(self, values: np.ndarray) -> None:
        """Append `values` (copied: the caller may reuse its buffer)."""
        self._flush()
        self._blocks.append(np.array(values, self.dtype))

    def _flush(self) -> None:
        if self._tail:
            self._blocks.append(np.asarray(self._tail, self.dtype))
            self._tail.clear()

    def array(self) -> np.ndarray:
        """The values so far, read-only (one array, kept until more come)."""
        self._flush()
        if len(self._blocks) != 1:
            whole = np.concatenate(self._blocks) if self._blocks else np.zeros(0, self.dtype)
            whole.flags.writeable = False
            self._blocks = [whole]
        return self._blocks[0]

    def __array__(self, dtype=None, copy=None):
        a = self.array()
        if dtype is not None and np.dtype(dtype) != a.dtype:
            return a.astype(dtype)
        return a.copy() if copy else a

    def __len__(self) -> int:
        return sum(len(b) for b in self._blocks) + len(self._tail)

    def __iter__(self):
        return iter(self.array().tolist())

    def __getstate__(self):
        return {"dtype": self.dtype, "values": self.array()}

    def __setstate__(self, state):
        self.__init__(state["dtype"])
        self._blocks.append(state["values"])


class Recorder:
    """One entry per completed request, in `Column`s (arrays are built once, when read)."""

    def __init__(self, n_nodes: int):
        self.n_nodes = n_nodes
        self.requests = 0
        f, i = np.float64, np.int64
        self.arrival, self.start, self.end, self.node = Column(f), Column(f), Column(f), Column(i)
        self.burst, self.rerouted, self.rid = Column(bool), Column(i), Column(i)      # rid: arrival order
        self.ids, self.misses, self.prefix, self.kv_tokens, self.unfilled = (Column(i) for _ in range(5))
        self.fetch, self.launch = Column(f), Column(f)   # its own rows' fetch (s); when its compute began
        self.tenant, self.shed = Column(np.int32), Column(i)   # by rid, the tenant (a class table); rids shed
        self.requeued: dict[int, float] = {}    # rid -> when a node fault last put it in another node's queue
        self.timeline: list[tuple[float, int, float | None]] = []   # (t, node, ratio or None = down)
        self.window_t, self.window_queues = [], []                  # per window: its end, the nodes' queues
        self.window_loads: list[list[float]] = []   # per node: its busier engine's share of the window

    def complete(self, req: Request, svc: Service, node: int, now: float) -> None:
        self.arrival.append(req.t)
        self.rid.append(req.rid)
        self.end.append(now)
        self.node.append(node)
        self.burst.append(req.burst)
        self.rerouted.append(req.rerouted)
        self.prefix.append(req.prefix_len)
        self.start.append(svc.start)
        self.fetch.append(svc.fetch_s)
        self.launch.append(svc.launch)
        self.ids.append(svc.ids)
        self.misses.append(svc.misses)
        self.kv_tokens.append(svc.kv_tokens)
        self.unfilled.append(svc.unfilled_misses)

    def ratio_change(self, t: float, node: int, ratio: float | None) -> None:
        self.timeline.append((t, node, ratio))

    def window(self, t: float, queues: list[int], loads: list[float] | None = None) -> None:
        self.window_t.append(t)
        self.window_queues.append(queues)
        if loads is not None:
            self.window_loads.append(loads)


@dataclass(frozen=True)
class Series:
    """What the plots draw."""

    latency_ms: np.ndarray
    window_start: np.ndarray
    window_p99_ms: np.ndarray
    window_emb_hit: np.ndarray
    window_kv_hit: np.ndarray
    window_requests: np.ndarray
    timeline: list
    bursts: list
    slo_ms: float
    n_nodes: int


def window_stats(arrival, latency, window_s, duration, *per_request):
    """Group requests by the window they arrived in: (window starts, P99 per window, request
    counts, and per-window sums of each extra per-request array)."""
    n_win = max(1, int(np.ceil(duration / window_s - 1e-9)))
    w = np.minimum((arrival / window_s).astype(np.int64), n_win - 1)
    counts = np.bincount(w, minlength=n_win)
    order = np.argsort(w, kind="stable")
    bounds = np.r_[0, np.cumsum(counts)]
    lat_sorted = latency[order]
    p99 = np.full(n_win, np.nan)
    for k in np.flatnonzero(counts):
        p99[k] = window_p99(lat_sorted[bounds[k]:bounds[k + 1]])
    sums = [np.bincount(w, weights=x, minlength=n_win) for x in per_request]
    return np.arange(n_win) * window_s, p99, counts, sums


def mean_ratio(timeline, n_nodes: int, duration: float) -> float:
    """Time-weighted mean EMB share over nodes and time, over the time nodes were up."""
    total, weight = 0.0, 0.0
    last: dict[int, tuple[float, float | None]] = {}
    for t, node, ratio in sorted(timeline, key=lambda e: (e[0], e[1])) + [(duration, n, None) for n in range(n_nodes)]:
        t = min(t, duration)
        if node in last:
            t0, r0 = last[node]
            if r0 is not None and t > t0:
                total += r0 * (t - t0)
                weight += t - t0
        last[node] = (t, ratio)
    return total / weight if weight else float("nan")


def node_load_peak(node, start, end, n_nodes: int, span_s: float = 10.0, from_s: float = 0.0) -> float:
    """Hot-spot figure: over every `span_s` window after `from_s`, the busiest node's service
    seconds over the nodes' mean; the largest such ratio (1.0 = perfectly even). A service counts
    in the window it starts in."""
    node, start = np.asarray(node), np.asarray(start)
    busy = np.asarray(end) - start
    keep = start >= from_s
    if not keep.any():
        return float("nan")
    k = ((start[keep] - from_s) // span_s).astype(np.int64)
    spans, k = np.unique(k, return_inverse=True)          # only the spans something started in
    load = np.zeros((len(spans), n_nodes))
    np.add.at(load, (k, node[keep]), busy[keep])
    full = load[:-1] if len(load) > 1 else load          # the last window is cut short by the run's end
    mean = full.mean(axis=1)
    return float(np.max(full.max(axis=1)[mean > 0] / mean[mean > 0])) if (mean > 0).any() else float("nan")


NAN = float("nan")
OVERLOAD_UTILIZATION = 0.98      # a busier engine this busy over the whole run has no headroom left ...
OVERLOAD_BACKLOG_S = 1.0         # ... and a run that ends more than a second of throughput behind is backlogged
_NO_REQUEST = "no request completed after the warm-up"
# what the P99 is made of (tail_profile)
TAIL = ("tail_wait_ms", "tail_service_ms", "tail_fetch_ms", "tail_behind_ms", "tail_compute_ms", "tail_cold_share",
        "tail_recompute_tokens", "tail_burst_share")
# why a figure can be missing (NaN here, null in JSON, the reason under "nulls")
UNMEASURED = {"p50_ms": _NO_REQUEST, "p95_ms": _NO_REQUEST, "p99_ms": _NO_REQUEST, "p999_ms": _NO_REQUEST,
              "slo_attainment": _NO_REQUEST,
              "window_slo_satisfaction": "no window after the warm-up had a completed request",
              "mean_window_p99_ms": "no window after the warm-up had a completed request",
              "emb_hit_rate": "no EMB lookup after the warm-up",
              "kv_hit_rate": "no request after the warm-up had a prefix to cache",
              "mean_ratio": "no node was up",
              "node_load_max_over_mean": "no service started after the warm-up",
              "peak_utilization": "no metrics window closed after the warm-up"} | dict.fromkeys(TAIL, _NO_REQUEST)


def tail_profile(latency, wait, fetch, compute, prefix, kv, burst, p99) -> dict:
    """What the slowest 1 % of requests (latency >= P99) are made of, as means over them: wait
    (arrival to when the node took its batch), service (from then to the end), and service in
    three parts: its own rows' fetch (host gathers and link copies, the link's queue included),
    behind (from its rows being in to its batch's launch: its batch-mates' rows, and on a
    pipelined node the batch before it still computing) and its batch's compute; the share that
    found none of their prefix cached (of those with a prefix), prefix tokens recomputed, and the
    share generated inside a burst. NaN with no request."""
    tail = latency >= p99
    if not tail.any():
        return dict.fromkeys(TAIL, NAN)
    with_prefix = tail & (prefix > 0)
    service = (latency - wait)[tail]
    return {"tail_wait_ms": float(wait[tail].mean() * 1e3),
            "tail_service_ms": float(service.mean() * 1e3),
            "tail_fetch_ms": float(fetch[tail].mean() * 1e3),
            "tail_behind_ms": float((service - fetch[tail] - compute[tail]).mean() * 1e3),
            "tail_compute_ms": float(compute[tail].mean() * 1e3),
            "tail_cold_share": float(np.mean(kv[with_prefix] == 0)) if with_prefix.any() else 0.0,
            "tail_recompute_tokens": float((prefix - kv)[tail].mean()),
            "tail_burst_share": float(burst[tail].mean())}


def p99_block_se(arrival, latency, block_s: float = 10.0, reps: int = 200, seed: int = 0) -> float:
    """The standard error of a run's P99 from a block bootstrap: the requests cut into blocks of
    `block_s` seconds by arrival (neighbours in time share queues and caches, so blocks, not
    requests, are resampled), `reps` resamples of as many blocks drawn with replacement, the
    standard deviation of their P99s (NaN with fewer than two blocks). How far a run's P99 could
    move with its luck alone: the yardstick for a change that should not matter
    (docs/results/2026-12-05-p99-noise-floor.md)."""
    arrival, latency = np.asarray(arrival, float), np.asarray(latency, float)
    if len(latency) == 0:
        return NAN
    block = np.floor((arrival - arrival.min()) / block_s).astype(np.int64)
    order = np.argsort(block, kind="stable")
    x = latency[order]
    bounds = np.searchsorted(block[order], np.arange(block.max() + 2))
    keep = np.flatnonzero(np.diff(bounds) > 0)            # the blocks that hold requests
    if len(keep) < 2:
        return NAN                                        # one block: nothing to resample
    lo, n = bounds[keep], np.diff(bounds)[keep]
    rng = np.random.default_rng(seed)
    out = np.empty(reps)
    for r in range(reps):
        pick = rng.integers(0, len(keep), len(keep))
        sizes = n[pick]                                   # the picked blocks' rows, laid end to end
        idx = np.repeat(lo[pick] - (np.cumsum(sizes) - sizes), sizes) + np.arange(sizes.sum())
        out[r] = np.percentile(x[idx], 99)
    return float(np.std(out))


BURST_FIELDS = ("burst_worst_p99_ms", "burst_peak_utilization")    # the lists a slim summary keeps


def slim(summary: dict) -> dict:
    """A summary's scalar fields and its per-burst lists (BURST_FIELDS): what a stored run keeps."""
    return {k: v for k, v in summary.items() if not isinstance(v, (list, dict)) or k in BURST_FIELDS}


def summarize(rec: Recorder, nodes: list, duration: float, slo_s: float, window_s: float, bursts,
              wall_s: float, rerouted: int, warmup_s: float = 0.0) -> tuple[dict, Series]:
    """Totals count every request; latency, SLO, hit-rate and rate figures cover the requests
    that arrived after `warmup_s` (and the windows after it). A figure with nothing to measure is
    NaN, with its reason under `nulls` (UNMEASURED)."""
    all_arrival = np.asarray(rec.arrival)
    keep = all_arrival >= warmup_s
    arrival = all_arrival[keep]
    latency = np.asarray(rec.end)[keep] - arrival
    ids, misses = np.asarray(rec.ids, float)[keep], np.asarray(rec.misses, float)[keep]
    prefix, kv = np.asarray(rec.prefix, float)[keep], np.asarray(rec.kv_tokens, float)[keep]
    measured = len(latency)
    span = max(duration - warmup_s, 1e-9)
    pct = np.percentile(latency, [50, 95, 99, 99.9]) * 1e3 if measured else np.full(4, np.nan)
    starts, p99, counts, (w_ids, w_miss, w_prefix, w_kv) = window_stats(all_arrival, np.asarray(rec.end) - all_arrival,
                                                                        window_s, duration, *(
                                                                            np.asarray(x, float) for x in
                                                                            (rec.ids, rec.misses, rec.prefix, rec.kv_tokens)))
    busy = (counts > 0) & (starts >= warmup_s - 1e-9)
    ok = latency <= slo_s
    worst = burst_worst(p99, busy, bursts, window_s)
    violated = [w > slo_s for w in worst]
    loads = window_load_series(rec.window_t, rec.window_loads, window_s, len(p99))
    link = {c: sum(n.link.bytes_by_cause[c] for n in nodes) for c in CAUSES}
    node_span = duration * rec.n_nodes
    backlog = int(np.count_nonzero(np.asarray(rec.end) > duration))
    throughput = measured / span
    utilization = float(sum(max(n.stats.busy_s, n.link.busy_s) for n in nodes) / node_span)
    backlog_s = backlog / throughput if throughput > 0 else (0.0 if backlog == 0 else float("inf"))
    with np.errstate(invalid="ignore", divide="ignore"):
        w_emb = 1.0 - w_miss / w_ids
        w_kv = w_kv / w_prefix
    summary = {
        "requests": rec.requests,
        "completed": len(all_arrival),
        "p50_ms": float(pct[0]), "p95_ms": float(pct[1]), "p99_ms": float(pct[2]), "p999_ms": float(pct[3]),
        "slo_ms": slo_s * 1e3,
        "slo_attainment": float(ok.mean()) if measured else NAN,
        "window_slo_satisfaction": float(np.mean(p99[busy] <= slo_s)) if busy.any() else NAN,
        "mean_window_p99_ms": float(np.mean(p99[busy]) * 1e3) if busy.any() else NAN,
        "throughput_rps": measured / span,
        "goodput_rps": float(ok.sum()) / span,
        "emb_hit_rate": float(1.0 - misses.sum() / ids.sum()) if ids.sum() else NAN,
        "kv_hit_rate": float(kv.sum() / prefix.sum()) if prefix.sum() else NAN,
        "h2d_gb": sum(link.values()) / 1e9,
        "refill_blocked_s": float(sum(n.stats.refill_blocked_s for n in nodes)),
        "mean_ratio": mean_ratio(rec.timeline, rec.n_nodes, duration),
        "burst_violation_share": float(np.mean(violated)) if violated else None,
        "wall_s": wall_s,
        "h2d_gb_by_cause": {c: b / 1e9 for c, b in link.items()},
        "unfilled_misses": int(np.sum(rec.unfilled)),
        "rerouted": rerouted,
        "bursts": len(bursts),
        "burst_worst_p99_ms": [None if not np.isfinite(w) else w * 1e3 for w in worst],
        "burst_peak_utilization": burst_peaks(loads, bursts, window_s),
        "utilization": utilization,
        "compute_utilization": float(sum(n.stats.busy_s for n in nodes) / node_span),
        "link_utilization": float(sum(n.link.busy_s for n in nodes) / node_span),
        "peak_utilization": peak_load(rec.window_t, rec.window_loads, warmup_s),
        "backlog_s": min(backlog_s, 1e9),
        "overloaded": bool(utilization >= OVERLOAD_UTILIZATION or backlog_s > OVERLOAD_BACKLOG_S),
        "warmup_s": warmup_s,
        "max_queue": int(max((max(q) for q in rec.window_queues), default=0)),
        "node_load_max_over_mean": node_load_peak(rec.node, rec.start, rec.end, rec.n_nodes, 10.0, warmup_s),
    } | tail_profile(latency, np.asarray(rec.start)[keep] - arrival, np.asarray(rec.fetch)[keep],
                     np.asarray(rec.end)[keep] - np.asarray(rec.launch)[keep], prefix, kv, np.asarray(rec.burst, float)[keep],
                     pct[2] * 1e-3)
    nulls = {k: why for k, why in UNMEASURED.items() if isinstance(summary[k], float) and not np.isfinite(summary[k])}
    if nulls:
        summary["nulls"] = nulls
    series = Series(latency * 1e3, starts, p99 * 1e3, w_emb, w_kv, counts, rec.timeline, list(bursts),
                    slo_s * 1e3, rec.n_nodes)
    return summary, series


def window_ratios(timeline, n_nodes: int, duration: float, window_s: float = 1.0, per_window: int = 100) -> np.ndarray:
    """Mean EMB ratio over the up nodes in each window, sampled `per_window` times a window
    (every 10 ms by default, the controller's tick). NaN for a window with no node up."""
    n_win = max(1, int(np.ceil(duration / window_s - 1e-9)))
    samples = (np.arange(n_win * per_window) + 0.5) * (window_s / per_window)
    total = np.zeros(len(samples))
    count = np.zeros(len(samples))
    for node in range(n_nodes):
        pts = sorted(((t, r) for t, n, r in timeline if n == node), key=lambda e: e[0])   # same instant: in order
        if not pts:
            continue
        times = np.array([t for t, _ in pts])
        values = np.array([np.nan if r is None else r for _, r in pts])
        idx = np.searchsorted(times, samples, side="right") - 1
        v = np.where(idx >= 0, values[np.maximum(idx, 0)], np.nan)
        up = ~np.isnan(v)
        total[up] += v[up]
        count[up] += 1
    with np.errstate(invalid="ignore"):
        mean = total / count
    return np.nanmean(mean.reshape(n_win, per_window), axis=1) if count.any() else np.full(n_win, np.nan)


def oracle_distance(timeline, n_nodes: int, duration: float, r_star: np.ndarray, window_s: float = 1.0) -> float:
    """Mean |r - r*| over windows, r being the mean of the nodes' ratios (r* is cluster-wide)."""
    r = window_ratios(timeline, n_nodes, duration, window_s)[:len(r_star)]
    return float(np.nanmean(np.abs(r - np.asarray(r_star)[:len(r)])))
