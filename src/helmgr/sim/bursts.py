"""Load and bursts: the window loads, the peak utilization, each burst's worst window P99 and
peak, and which bursts the cluster was provisioned for."""
from __future__ import annotations

import numpy as np

NAN = float("nan")


PEAK_SPAN_WINDOWS = 10           # peak utilization: the busiest 10 consecutive windows


def window_load(loads) -> np.ndarray:
    """Per recorded window (rows of `Recorder.window_loads`): the up nodes' mean busier-engine
    share (NaN where no node was up)."""
    loads = np.asarray(loads, float).reshape(len(loads), -1)
    up = np.isfinite(loads)
    mean = np.where(up, loads, 0.0).sum(axis=1) / np.maximum(up.sum(axis=1), 1)
    return np.where(up.any(axis=1), mean, np.nan)


def window_load_series(window_t, loads, window_s: float, n_windows: int) -> np.ndarray:
    """`window_load` laid out by metrics window: entry k covers [k w, (k + 1) w) (the window closing
    at t covers [t - w, t)); NaN where none closed."""
    out = np.full(n_windows, np.nan)
    if len(loads):
        k = np.round(np.asarray(window_t, float) / window_s).astype(np.int64) - 1
        ok = (k >= 0) & (k < n_windows)
        out[k[ok]] = window_load(loads)[ok]
    return out


def rolling_peak(values: np.ndarray, span: int = PEAK_SPAN_WINDOWS) -> float:
    """The largest mean of `span` consecutive values (of all of them if fewer); NaN if none."""
    if not len(values):
        return NAN
    k = min(span, len(values))
    return float(np.convolve(values, np.ones(k) / k, mode="valid").max())


def peak_load(window_t, loads, from_s: float = 0.0, span: int = PEAK_SPAN_WINDOWS) -> float:
    """The cluster's peak utilization: over every `span` consecutive windows ending after
    `from_s`, the up nodes' mean busier-engine share; the largest. NaN with no such window."""
    keep = np.asarray(window_t, float) > from_s
    if not len(loads) or not keep.any():
        return NAN
    per_window = window_load(loads)[keep]
    return rolling_peak(per_window[np.isfinite(per_window)], span)


def burst_windows(burst, window_s: float, n_windows: int) -> tuple[int, int]:
    """The windows [k0, k1) a burst overlaps, among the run's `n_windows`."""
    return min(int(burst.start // window_s), n_windows), min(int(np.ceil(burst.end / window_s)), n_windows)


def burst_worst(p99, busy, bursts, window_s: float) -> list[float]:
    """Each burst's worst window P99 (in p99's unit) over the busy windows it overlaps; NaN for a
    burst without one. A burst is violated when its worst is over the SLO."""
    out = []
    for b in bursts:
        k0, k1 = burst_windows(b, window_s, len(p99))
        seen = p99[k0:k1][busy[k0:k1]]
        out.append(float(seen.max()) if seen.size else float("nan"))
    return out


def burst_peaks(loads: np.ndarray, bursts, window_s: float) -> list[float | None]:
    """Each burst's peak utilization: `rolling_peak` of the window loads it overlaps (None for a
    burst without one)."""
    out = []
    for b in bursts:
        k0, k1 = burst_windows(b, window_s, len(loads))
        seen = loads[k0:k1][np.isfinite(loads[k0:k1])]
        out.append(rolling_peak(seen) if seen.size else None)
    return out


PROVISIONED_PEAK = 0.85     # a burst is provisioned when the split best for bursts keeps its peak at or under this


def provisioned(reference: dict) -> list[bool]:
    """Per burst: whether a reference run (the bursts' best static split) kept its peak utilization
    at or under PROVISIONED_PEAK: the bursts the cluster was provisioned for. Beyond them no split
    rides a burst, and its violations measure the load, not the split."""
    return [p is not None and p <= PROVISIONED_PEAK for p in reference["burst_peak_utilization"]]


def violation_share(summary: dict, keep: list[bool] | None = None) -> float | None:
    """The share of the bursts (those `keep` marks; None: all) whose worst window P99 was over the
    SLO; None when there is none to count."""
    worst = summary["burst_worst_p99_ms"]
    picked = [w for w, k in zip(worst, keep if keep is not None else [True] * len(worst)) if k and w is not None]
    return float(np.mean([w > summary["slo_ms"] for w in picked])) if picked else None
