"""A block's tail score as a function of the ratio, smoothed before its argmin (for the phase
oracle). All fits are of log(P99): replay noise is multiplicative, and an overloaded end of the
grid (P99 in seconds against milliseconds) would otherwise dominate the squares.

- `convex` (the default): the least-squares convex curve through the grid (piecewise linear with
  a knot at every grid ratio), as cache partitioning convexifies miss-ratio curves. Measured P99
  curves are far from symmetric (a slow slope on one side of the optimum, a wall on the other),
  and a global quadratic's vertex lands between them: on 10-s blocks of steady it sat 0.1-0.2
  below the best replay and its stitched run was 10 % worse than static-best (docs/baselines.md).
  The convex fit keeps the shape and has one valley: noise cannot put r* in a second dip, and
  where it pools noise's bumps into a flat bottom, r* is the point of it nearest the current
  ratio (no move on noise).
  It smooths less than a parabola where the curve is symmetric (on 10 + 40 (r - 0.62)^2 with 2 %
  noise, r* varies by 0.03 against the parabola's 0.004 and the raw argmin's 0.04); on replays of
  10-s blocks from one state the noise is small and the bias is what matters. Below one grid step,
  a parabola through the fitted minimum and its two neighbours gives a continuous r* (it replaces
  the fitted curve between those neighbours).
- `quadratic`: a least-squares parabola over the grid, its vertex. If it is not convex (leading
  coefficient <= 0), the fitted curve's best grid point.

Guards, either fit: fewer than 3 finite points, no fit (the best replay); r* inside [grid min,
grid max]; ties go to the ratio nearest the current one (fewest moves). The *band* is the
connected stretch around r* where the fitted P99 is within `BAND` (2 %) of the fitted minimum.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

BAND = 0.02                      # a ratio is in the band when its fitted P99 <= (1 + BAND) x the minimum
MIN_POINTS = 3                   # fewer: no fit
TIE = 1e-9                       # log-P99 values this close are ties (a flat fit is not a bowl)
MESH = 10_001                    # the band's edges are found on this many points of the grid's range

Curve = Callable[[np.ndarray], np.ndarray]            # ratio -> fitted log P99 (s)


@dataclass(frozen=True, slots=True)
class BlockFit:
    """r* of one block, its band [band_lo, band_hi], how it was found (`convex`, `quadratic`,
    `concave`: a quadratic that is not, `raw`: too few points, `empty`: nothing to replay, the
    current ratio is kept) and the fitted P99 (ms) at the grid ratios (None without a fit)."""

    r_star: float
    band_lo: float
    band_hi: float
    kind: str
    fitted_ms: tuple[float, ...] | None = None

    def to_dict(self) -> dict:
        return {"r_star": self.r_star, "band": [self.band_lo, self.band_hi], "fit": self.kind,
                "fitted_ms": None if self.fitted_ms is None else list(self.fitted_ms)}


def fit_block(grid, p99, current: float, fit: str = "convex") -> BlockFit:
    """r* and the band of one block from its replayed P99 (s) per grid ratio (inf: not measured)."""
    grid, p99 = np.asarray(grid, float), np.asarray(p99, float)
    order = np.argsort(grid, kind="stable")
    grid, p99 = grid[order], p99[order]
    ok = np.isfinite(p99) & (p99 > 0)
    if not ok.any():
        return BlockFit(current, current, current, "empty")
    if ok.sum() < MIN_POINTS:
        return _raw(grid[ok], p99[ok], current)
    r, kind, curve = FITS[fit](grid[ok], np.log(p99[ok]), current)
    lo, hi = _band(curve, r, float(grid[0]), float(grid[-1]))
    return BlockFit(r, lo, hi, kind, tuple(float(x) for x in np.exp(curve(grid)) * 1e3))


def _nearest_min(x: np.ndarray, score: np.ndarray, current: float) -> float:
    ties = np.flatnonzero(score <= score.min() + TIE)
    return float(x[ties[np.argmin(np.abs(x[ties] - current))]])


def _raw(x: np.ndarray, p99: np.ndarray, current: float) -> BlockFit:
    """The best replay, and as its band the run of neighbouring grid ratios within BAND of it."""
    r = _nearest_min(x, np.log(p99), current)
    k = int(np.flatnonzero(x == r)[0])
    near = p99 <= (1 + BAND) * p99.min()
    i = j = k
    while i > 0 and near[i - 1]:
        i -= 1
    while j < len(x) - 1 and near[j + 1]:
        j += 1
    return BlockFit(r, float(x[i]), float(x[j]), "raw")


def _band(curve: Curve, r: float, lo: float, hi: float) -> tuple[float, float]:
    """The connected stretch of [lo, hi] around r where curve <= curve(r) + log(1 + BAND)."""
    mesh = np.union1d(np.linspace(lo, hi, MESH), [r])
    inside = curve(mesh) <= curve(np.array([r]))[0] + np.log1p(BAND) + 1e-12
    k = int(np.searchsorted(mesh, r))
    i = k - int(np.argmin(inside[k::-1])) + 1 if not inside[:k + 1].all() else 0
    j = k + int(np.argmin(inside[k:])) - 1 if not inside[k:].all() else len(mesh) - 1
    return float(mesh[i]), float(mesh[j])


# -- the fits: (x, log P99, current ratio) -> (r*, kind, fitted curve) ----------------------------
def quadratic(x: np.ndarray, y: np.ndarray, current: float) -> tuple[float, str, Curve]:
    coef = np.polyfit(x, y, 2)
    curve = lambda r: np.polyval(coef, np.asarray(r, float))     # noqa: E731
    if coef[0] > TIE:
        return float(np.clip(-coef[1] / (2 * coef[0]), x[0], x[-1])), "quadratic", curve
    return _nearest_min(x, curve(x), current), "concave", curve


def convex(x: np.ndarray, y: np.ndarray, current: float) -> tuple[float, str, Curve]:
    f = convex_regression(x, y)
    low = np.flatnonzero(f <= f.min() + TIE)                   # contiguous: f is convex
    if len(low) > 1:                                           # a flat bottom: stay on it
        return float(np.clip(current, x[low[0]], x[low[-1]])), "convex", lambda r: np.interp(r, x, f)
    k = int(low[0])
    if k == 0 or k == len(x) - 1:
        return float(x[k]), "convex", lambda r: np.interp(r, x, f)
    coef = np.polyfit(x[k - 1:k + 2], f[k - 1:k + 2], 2)        # convex: f[k] is below both neighbours
    r_star = float(np.clip(-coef[1] / (2 * coef[0]), x[k - 1], x[k + 1]))

    def curve(r):
        r = np.asarray(r, float)
        near = (r >= x[k - 1]) & (r <= x[k + 1])
        return np.where(near, np.polyval(coef, r), np.interp(r, x, f))
    return r_star, "convex", curve


FITS = {"convex": convex, "quadratic": quadratic}


def convex_regression(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The convex piecewise-linear f (knots at x, x increasing) minimizing sum (y - f(x))^2: f is
    c0 + c1 x + sum_k w_k max(0, x - x_k) over the inner knots with w >= 0. The line (c0, c1) is
    projected out and the w are non-negative least squares."""
    line = np.c_[np.ones_like(x), x]
    hinge = np.maximum(0.0, x[:, None] - x[None, 1:-1])
    pinv = np.linalg.pinv(line)
    off_line = np.eye(len(x)) - line @ pinv
    w = nnls(off_line @ hinge, off_line @ y)
    return line @ (pinv @ (y - hinge @ w)) + hinge @ w


def nnls(a: np.ndarray, b: np.ndarray, tol: float = 1e-12) -> np.ndarray:
    """argmin ||a w - b|| over w >= 0 (Lawson and Hanson's active-set method)."""
    n = a.shape[1]
    w, free = np.zeros(n), np.zeros(n, bool)
    for _ in range(3 * n + 3):
        grad = a.T @ (b - a @ w)
        if free.all() or grad[~free].max() <= tol:
            break
        free[int(np.argmax(np.where(free, -np.inf, grad)))] = True
        z = np.zeros(n)
        while free.any():
            z = np.zeros(n)
            z[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
            if z[free].min() > tol:
                break
            neg = free & (z <= tol)
            gap = w[neg] - z[neg]
            step = float(np.min(np.where(gap > 0, w[neg] / np.where(gap > 0, gap, 1.0), 0.0)))
            w = w + step * (z - w)
            free &= w > tol
        w = np.where(free, z, 0.0)
    return w
