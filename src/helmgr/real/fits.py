"""The least-squares fits behind `helmgr calibrate` (`real/calibrate.py`): pure functions of
measured points, each on relative error (each point weighted by 1 / its value), so that short
and long measurements count alike."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Fit(NamedTuple):
    """y = intercept + slope * x."""

    intercept: float
    slope: float


def fit_affine(x, y) -> Fit:
    """Least squares on relative error; if the intercept comes out negative, the line through
    the origin instead (a fixed cost is never negative). A time that does not grow with x
    (noise larger than the range measured) is an error, never a fitted number."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or np.any(y <= 0):
        raise ValueError(f"need >= 2 points with positive times, got {len(x)}")
    w = 1.0 / y
    (a, b), *_ = np.linalg.lstsq(np.stack([w, x * w], axis=1), np.ones_like(y), rcond=None)
    if a < 0:
        a, b = 0.0, float(np.sum(x * w) / np.sum((x * w) ** 2))
    if not b > 0:
        raise ValueError(f"time does not grow with size over the points measured (slope {b:.3g})")
    return Fit(float(a), float(b))


def fit_compute(flops, seconds, launches: int) -> tuple[float, float]:
    """Seconds = flops / achieved + launches * launch_s, fitted: (achieved FLOP/s, launch_s)."""
    fit = fit_affine(flops, seconds)
    return 1.0 / fit.slope, fit.intercept / launches


def fit_batch_curve(rows, flops_per_s, peak: float) -> tuple[float, float]:
    """FLOP/s = peak x e x rows / (rows + h), fitted: (e, h) with 0 < e <= 1 and h >= 0.

    In 1 / FLOP/s = a + b / rows (a = 1 / (peak e), b = h a) the curve is a line, fitted by least
    squares on relative error as the other fits are. A line with a < 1 / peak (e > 1: no plateau
    below the peak over the rows measured) or b < 0 (FLOP/s falling with rows) gives way to the
    best fit on the edges of the allowed region: e = 1, or h = 0 (flat)."""
    rows, rates = np.asarray(rows, float), np.asarray(flops_per_s, float)
    if len(rows) < 2 or not np.all(np.isfinite(rows) & np.isfinite(rates) & (rows > 0) & (rates > 0)) or not peak > 0:
        raise ValueError(f"need >= 2 batches with rows and FLOP/s > 0 and a positive peak, got {len(rows)} "
                         f"batches, peak {peak}")
    x, z = 1.0 / rows, 1.0 / rates
    w, floor = 1.0 / z, 1.0 / peak
    loss = lambda a, b: float(np.sum(((a + b * x) * w - 1.0) ** 2))
    (a, b), *_ = np.linalg.lstsq(np.stack([w, x * w], axis=1), np.ones_like(z), rcond=None)
    if not (a >= floor and b >= 0):
        flat = (max(float(np.sum(w) / np.sum(w * w)), floor), 0.0)
        capped = (floor, max(float(np.sum(x * w * (1.0 - floor * w)) / np.sum((x * w) ** 2)), 0.0))
        a, b = min(flat, capped, key=lambda ab: loss(*ab))
    return float(floor / a), float(b / a)
