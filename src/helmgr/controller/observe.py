"""What the controller sees and what it is paid, compiled: the fixed observation vector
built from a node's `WindowStats` (helmgr.core.window), and the window reward.

The observation keeps the long-run mean arrival rate (EWMA) and the previous window's rate, so
the vector carries the rate relative to normal and its change. Every feature is finite (missing
P99 -> 0, empty windows -> neutral values). `observe_window` is the code the controller's step
runs; `Observer` and `reward` call the same code from Python (the training environment).
"""
from __future__ import annotations

import math

from numba import njit

from helmgr.controller.layout import (C_OB_ALPHA, FEATURES, MARGINAL_ALPHA, N_FEATURES, OB_INIT, OB_MARGINAL,
                                      OB_MEAN, OB_PREV, OBS, P99_CAP, STATS_SIGNATURE,
                                      X_EMB, X_EMB_TIME, X_H2D, X_KV, X_NEW, X_P99, X_QUEUE, X_RATIO, X_RPS, X_SLO,
                                      layout, store, views)
from helmgr.core.window import WindowStats

__all__ = ["FEATURES", "N_FEATURES", "P99_CAP", "MEAN_ALPHA", "MISS_PENALTY", "MOVE_COST", "Observer", "reward"]

MEAN_ALPHA = 0.02                  # the EWMA weight of the long-run arrival rate, per window
MISS_PENALTY, MOVE_COST = 1.0, 2.0


@njit(cache=True, nogil=True)
def finite(v):
    if math.isfinite(v):
        return v
    return 0.0 if v != v else math.copysign(P99_CAP, v)


@njit(cache=True, nogil=True, inline="always")
def tail(p99, slo):
    """The window's P99 over its SLO, capped (p99 NaN: no requests completed, 0)."""
    return min(p99 / slo, P99_CAP) if math.isfinite(p99) else 0.0


@njit("float64(float64, float64, float64, float64, float64)", cache=True, nogil=True)
def reward_of(p99, slo, moved, miss_penalty, move_cost):
    """Minus normalized tail latency, minus a penalty if the window missed its SLO, minus a cost
    per unit of ratio moved (migration is not free)."""
    t = tail(p99, slo)
    return -t - (miss_penalty if t > 1.0 else 0.0) - move_cost * abs(moved)


def reward(s: WindowStats, moved: float, miss_penalty: float = MISS_PENALTY, move_cost: float = MOVE_COST) -> float:
    """The reward of window `s` after a move of `moved` (`reward_of`)."""
    return reward_of(math.nan if s.p99_s is None else s.p99_s, s.slo_s, moved, miss_penalty, move_cost)


@njit(cache=True, nogil=True)
def observe_window(x, st, cfg, signal):
    """The observation of the window in `x`, into st[OBS:OBS + N_FEATURES]; returns its P99 / SLO.
    `signal`: adapter v2's counterfactual sample if one closed with this window (s per request per
    unit of ratio, positive: a larger EMB share saves time; NaN: none). The last feature is their
    EWMA in ms, clipped to ±P99_CAP, held between samples (0 before the first): what moving the
    split would pay, which the hit rates at the current split cannot show (a KV pool squeezed to
    0.05 of HBM hits 0.1 whatever a larger one would, docs/results/2026-12-05-base-descent.md)."""
    rps = x[X_RPS] if math.isfinite(x[X_RPS]) and x[X_RPS] >= 0 else 0.0
    if st[OB_INIT] == 0.0:
        st[OB_MEAN] = st[OB_PREV] = rps
        st[OB_INIT] = 1.0
    scale = max(st[OB_MEAN], 1e-6)
    q = x[X_QUEUE] if math.isfinite(x[X_QUEUE]) and x[X_QUEUE] > 0 else 0.0
    t = tail(x[X_P99], x[X_SLO])
    prev = st[OB_PREV]
    st[OB_MEAN] += cfg[C_OB_ALPHA] * (rps - st[OB_MEAN])
    st[OB_PREV] = rps
    o = OBS
    st[o] = finite(x[X_RATIO])
    st[o + 1] = finite(x[X_EMB])
    st[o + 2] = finite(x[X_KV])
    st[o + 3] = finite(rps / scale)
    st[o + 4] = finite((rps - prev) / scale)
    st[o + 5] = finite(math.log1p(q))
    st[o + 6] = finite(t)
    st[o + 7] = finite(x[X_H2D])
    st[o + 8] = finite(x[X_NEW])
    st[o + 9] = finite(x[X_EMB_TIME])
    if math.isfinite(signal):
        m = min(P99_CAP, max(-P99_CAP, signal * 1e3))
        st[OB_MARGINAL] += MARGINAL_ALPHA * (m - st[OB_MARGINAL])
    st[o + 10] = st[OB_MARGINAL]
    return t




@njit(f"void(float64[::1], {STATS_SIGNATURE}, float64)", cache=True, nogil=True)
def observe(mem, ratio, rps, p99, slo, emb, kv, queue, h2d, new_users, emb_time, signal):
    """`observe_window` on its own, for a `mem` from `layout` (p99 NaN: none; signal NaN: none)."""
    st, cfg, x, det, ring, h = views(mem)
    store(x, ratio, rps, p99, slo, emb, kv, queue, h2d, new_users, emb_time)
    observe_window(x, st, cfg, signal)


class Observer:
    """WindowStats -> the observation vector, through the controller's own compiled code. The
    same array every call: copy it to keep it."""

    __slots__ = ("mem", "obs")

    def __init__(self, mean_alpha: float = MEAN_ALPHA):
        self.mem, (st, cfg, *_) = layout(0, 0)
        cfg[C_OB_ALPHA] = mean_alpha
        self.obs = st[OBS:OBS + N_FEATURES]

    def __call__(self, s: WindowStats, marginal: float | None = None):
        """The observation of window `s`; `marginal`: the counterfactual sample that closed with it
        (None: none)."""
        observe(self.mem, s.ratio, s.arrival_rps, math.nan if s.p99_s is None else s.p99_s, s.slo_s,
                s.emb_hit_rate, s.kv_hit_rate, s.queue_len, s.h2d_utilization, s.new_user_share, s.emb_time_share,
                math.nan if marginal is None else float(marginal))
        return self.obs
