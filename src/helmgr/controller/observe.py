"""What the controller sees and what it is paid (SPEC 6): the fixed observation vector built from
a node's `WindowStats` (helmgr.core.window), and the window reward.

`Observer` turns a stream of them into observations: it keeps the long-run mean arrival rate
(EWMA) and the previous window's rate, so the vector carries the rate relative to normal and
its change. Every feature is finite (missing P99 -> 0, empty windows -> neutral values).
"""
from __future__ import annotations

import math

import numpy as np

from helmgr.core.window import WindowStats

FEATURES = ("ratio", "emb_hit_rate", "kv_hit_rate", "arrival_vs_mean", "arrival_change", "log_queue",
            "p99_over_slo", "h2d_utilization", "new_user_share", "emb_time_share")
N_FEATURES = len(FEATURES)
P99_CAP = 10.0              # p99 / SLO beyond this is "far over"; keeps the vector bounded


def p99_over_slo(s: WindowStats) -> float:
    if s.p99_s is None or not math.isfinite(s.p99_s):
        return 0.0
    return min(s.p99_s / s.slo_s, P99_CAP)


MISS_PENALTY, MOVE_COST = 1.0, 2.0


def reward(s: WindowStats, moved: float, miss_penalty: float = MISS_PENALTY, move_cost: float = MOVE_COST) -> float:
    """Minus normalized tail latency, minus a penalty if the window missed its SLO, minus a cost
    per unit of ratio moved (migration is not free)."""
    tail = p99_over_slo(s)
    return -tail - (miss_penalty if tail > 1.0 else 0.0) - move_cost * abs(moved)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else (0.0 if x != x else math.copysign(P99_CAP, x))


class Observer:
    """WindowStats -> the fixed observation vector of FEATURES, written into one preallocated
    array (the same array every call: copy it to keep it)."""

    def __init__(self, mean_alpha: float = 0.02):
        self.mean_alpha = mean_alpha
        self.mean_rps: float | None = None
        self.prev_rps: float | None = None
        self.obs = np.zeros(N_FEATURES)

    def __call__(self, s: WindowStats) -> np.ndarray:
        rps = s.arrival_rps if math.isfinite(s.arrival_rps) and s.arrival_rps >= 0 else 0.0
        if self.mean_rps is None:
            self.mean_rps = self.prev_rps = rps
        scale = max(self.mean_rps, 1e-6)
        q = s.queue_len if math.isfinite(s.queue_len) and s.queue_len > 0 else 0.0
        values = (s.ratio, s.emb_hit_rate, s.kv_hit_rate, rps / scale, (rps - self.prev_rps) / scale,
                  math.log1p(q), p99_over_slo(s), s.h2d_utilization, s.new_user_share, s.emb_time_share)
        self.mean_rps += self.mean_alpha * (rps - self.mean_rps)
        self.prev_rps = rps
        obs = self.obs
        obs[:] = [_finite(v) for v in values]
        return obs
