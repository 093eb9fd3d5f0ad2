"""The least-squares fits behind `helmgr calibrate` (`real/calibrate.py`): pure functions of
measured points, each on relative error (each point weighted by 1 / its value), so that short
and long measurements count alike."""
from __future__ import annotations

from itertools import product
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


class BatchFit(NamedTuple):
    """A batch of n requests, `flops` over `rows` rows in flight, takes (beyond the first request's
    fixed cost) flops / (peak x e x rows / (rows + h)) + (n - 1) x q."""

    efficiency: float       # e, 0 < e <= 1
    half_rows: float        # h >= 0
    request_s: float        # q >= 0

    def seconds(self, n: int, rows: float, flops: float, peak: float) -> float:
        return flops * (rows + self.half_rows) / (peak * self.efficiency * rows) + (n - 1) * self.request_s


def fit_batch(requests, rows, flops, seconds, peak: float) -> BatchFit:
    """`BatchFit` of batches measured (`seconds` each, the first request's fixed cost taken off).

    In seconds = q (n - 1) + a flops + b flops / rows (a = 1 / (peak e), b = h a) the model is
    linear; least squares on relative error as the other fits, within q >= 0, a >= 1 / peak and
    b >= 0: the unconstrained fit if it lies inside, else the best one with some of them held at
    their bound (every combination tried)."""
    n, rows, flops, y = (np.asarray(v, float) for v in (requests, rows, flops, seconds))
    if len(y) < 3 or not np.all(np.isfinite(y) & (y > 0) & (rows > 0) & (flops > 0) & (n >= 1)) or not peak > 0:
        raise ValueError(f"need >= 3 batches with positive times, rows and FLOPs and a positive peak, got {len(y)} "
                         f"batches, peak {peak}")
    w = 1.0 / y
    cols = np.stack([n - 1.0, flops, flops / rows], axis=1) * w[:, None]       # q, a, b
    bound = np.array([0.0, 1.0 / peak, 0.0])
    best, best_loss = None, np.inf
    for held in product((False, True), repeat=3):
        free = [k for k in range(3) if not held[k]]
        x = bound.copy()
        rhs = 1.0 - cols[:, list(np.flatnonzero(held))] @ bound[list(np.flatnonzero(held))]
        if free:
            x[free], *_ = np.linalg.lstsq(cols[:, free], rhs, rcond=None)
        if np.all(x >= bound - 1e-15):
            loss = float(np.sum((cols @ x - 1.0) ** 2))
            if loss < best_loss:
                best, best_loss = np.maximum(x, bound), loss
    q, a, b = best
    return BatchFit(float(bound[1] / a), float(b / a), float(q))
