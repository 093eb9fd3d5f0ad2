"""What a stream looks like: the figures `helmgr workload` reports, and their time series."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from helmgr.workload.chunk import RequestChunk
from helmgr.workload.phases import Phase

HOT_SET = 1000        # items in the hot set whose turnover is tracked
TURNOVER_WINDOW_S = 10.0


@dataclass(frozen=True, slots=True)
class StreamSeries:
    rps_1s: np.ndarray            # requests in each 1-s bin
    turnover: np.ndarray          # hot-set turnover between consecutive windows (0..1)
    turnover_t: np.ndarray        # end time of each such window pair


def _top(counts: np.ndarray, k: int) -> np.ndarray:
    k = min(k, int(np.count_nonzero(counts)))
    return np.argpartition(-counts, k - 1)[:k] if k else np.zeros(0, np.int64)


def _phase_figures(phases: Sequence[Phase], per_phase: np.ndarray, discovery: np.ndarray) -> dict:
    """Phases by kind: how many, their request rate and their discovery share."""
    kinds = sorted({p.kind for p in phases})
    span = {k: sum(p.end - p.start for p in phases if p.kind == k) for k in kinds}
    count = {k: int(sum(per_phase[i] for i, p in enumerate(phases) if p.kind == k)) for k in kinds}
    disc = {k: int(sum(discovery[i] for i, p in enumerate(phases) if p.kind == k)) for k in kinds}
    return {
        "phases": {k: sum(p.kind == k for p in phases) for k in kinds},
        "phase_rps": {k: count[k] / span[k] if span[k] else 0.0 for k in kinds},
        "phase_discovery_share": {k: disc[k] / count[k] if count[k] else 0.0 for k in kinds},
    }


def describe(chunks: Iterable[RequestChunk], duration_s: float, n_items: int,
             on_chunk: Callable[[], None] | None = None, phases: Sequence[Phase] = ()) -> tuple[dict, StreamSeries]:
    """Consume a stream once; return the JSON summary and the series behind its plots. With the
    workload's `phases`, also their count, request rate and discovery share by kind."""
    n_bins = max(1, int(np.ceil(duration_s)))
    per_second = np.zeros(n_bins, np.int64)
    total_counts = np.zeros(n_items, np.int64)
    window = np.zeros(n_items, np.int64)
    prev_hot: np.ndarray | None = None
    turnover, turnover_t = [], []
    users, prefix_sum, requests, burst_requests, discovery_requests = [], 0, 0, 0, 0
    phase_starts = np.array([p.start for p in phases])
    per_phase, discovery_per_phase = np.zeros(len(phases), np.int64), np.zeros(len(phases), np.int64)
    window_end = TURNOVER_WINDOW_S

    def close_window(end: float):
        nonlocal prev_hot, window
        hot = _top(window, HOT_SET)
        if prev_hot is not None and len(hot):
            turnover.append(1.0 - len(np.intersect1d(hot, prev_hot, assume_unique=True)) / len(hot))
            turnover_t.append(end)
        prev_hot, window = hot, np.zeros(n_items, np.int64)

    for chunk in chunks:
        if on_chunk:
            on_chunk()
        if not len(chunk):
            continue
        while chunk.t[0] >= window_end:
            close_window(window_end)
            window_end += TURNOVER_WINDOW_S
        per_second += np.bincount(np.minimum(chunk.t.astype(np.int64), n_bins - 1), minlength=n_bins)
        c = np.bincount(chunk.cand_ids, minlength=n_items) + np.bincount(chunk.item_ids, minlength=n_items)
        total_counts += c
        window += c
        users.append(chunk.user)
        prefix_sum += int(chunk.prefix_len.sum())
        requests += len(chunk)
        burst_requests += int(chunk.burst.sum())
        discovery = getattr(chunk, "discovery", None)
        discovery = np.zeros(len(chunk), bool) if discovery is None else discovery
        discovery_requests += int(discovery.sum())
        if len(phases):
            which = np.clip(np.searchsorted(phase_starts, chunk.t, side="right") - 1, 0, len(phases) - 1)
            per_phase += np.bincount(which, minlength=len(phases))
            discovery_per_phase += np.bincount(which[discovery], minlength=len(phases))
    if window_end - TURNOVER_WINDOW_S < duration_s and window.any():
        close_window(min(window_end, duration_s))
    all_users = np.concatenate(users) if users else np.zeros(0, np.int64)
    distinct_users = len(np.unique(all_users))
    seen = np.sort(total_counts[total_counts > 0])[::-1]
    top = max(1, len(seen) // 100)
    summary = {
        "requests": requests,
        "duration_s": duration_s,
        "rps": requests / duration_s,
        "peak_rps_1s": int(per_second.max()),
        "median_rps_1s": float(np.median(per_second)),
        "users": distinct_users,
        "returning_share": (requests - distinct_users) / requests if requests else 0.0,
        "mean_prefix_len": prefix_sum / requests if requests else 0.0,
        "distinct_items": int(len(seen)),
        "top1pct_item_share": float(seen[:top].sum() / seen.sum()) if len(seen) else 0.0,
        "hot_set_turnover_per_min": float(np.mean(turnover) * 60.0 / TURNOVER_WINDOW_S) if turnover else 0.0,
        "burst_requests": burst_requests,
        "discovery_share": discovery_requests / requests if requests else 0.0,
    }
    if len(phases):
        summary |= _phase_figures(phases, per_phase, discovery_per_phase)
    return summary, StreamSeries(per_second, np.array(turnover), np.array(turnover_t))
