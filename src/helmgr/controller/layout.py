"""The controller's memory: one float64 array, `mem`, that the compiled step reads and writes.

The scalars `st`, the constants `cfg`, this window's stats `x`, the detector's rows, its exit
ring and the policy's scratch are each a view of it.
One array, because a call's cost from Python is mostly numba unboxing its arguments (~0.15 µs
an array). The names below are the offsets into those views.
"""
from __future__ import annotations

import numpy as np
from numba import njit

FEATURES = ("ratio", "emb_hit_rate", "kv_hit_rate", "arrival_vs_mean", "arrival_change", "log_queue",
            "p99_over_slo", "h2d_utilization", "new_user_share", "emb_time_share", "marginal_ms")
N_FEATURES = len(FEATURES)
N_FEATURES_V1 = 10          # a base policy trained before "marginal_ms" reads the first ten (MLP's dims[0])
MARGINAL_ALPHA = 0.5        # "marginal_ms": the EWMA weight of each counterfactual sample
P99_CAP = 10.0              # p99 / SLO beyond this is "far over"; keeps the observation bounded

# -- st: scalars ----------------------------------------------------------------------------
OB_MEAN, OB_PREV, OB_INIT = 0, 1, 2                 # observation: long-run rate, last rate, started
TARGET, PLAN, RECOVERING = 3, 4, 5                  # controller: the target (reported), plan, flag
ACTIVE, TICKS, RING_N, RING_I = 6, 7, 8, 9          # detector: burst on, ticks seen, ring fill/next
NON_FINITE, CLAMPED, SLEWED = 10, 11, 12            # safety counters
EVENT = 13                                          # output: 0, 1 burst start, 2 burst end
SIG = 14                                            # st[SIG:SIG + 3]: the detector's signals this window
OBS = 17                                            # st[OBS:OBS + N_FEATURES]: the observation
HOLD = OBS + N_FEATURES                             # after a burst: the floor under the plan, decaying (NaN: none)
APPLIED, SETTLED = HOLD + 1, HOLD + 2               # the ratio last set (NaN: none); targets not moved to (counter)
BAD_INPUT = HOLD + 3                                # windows whose stats were refused (counter; safety.stats_ok)
# recovery_signal: the test has stepped the plan down in this burst; the samples since its last move (n, sum, squares)
SIG_STEPPED, SIG_N, SIG_SUM, SIG_SQ = BAD_INPUT + 1, BAD_INPUT + 2, BAD_INPUT + 3, BAD_INPUT + 4
OB_MARGINAL = SIG_SQ + 1                            # observation: the counterfactual samples' EWMA, ms (0: none yet)
ST_SIZE = OB_MARGINAL + 1

# -- cfg: constants -------------------------------------------------------------------------
(C_OB_ALPHA, C_ALPHA, C_CLIP, C_K, C_H, C_Z_SPIKE, C_Z_EXIT, C_EXIT_TICKS, C_WARMUP, C_HAS_DET,
 C_HAS_BASE, C_MAX_STEP, C_HAS_AD, C_BOUND, C_R_MIN, C_R_MAX, C_SLEW, C_REC_RATIO, C_REC_STEP,
 C_REL_FLOOR, C_HOLD_STEP, C_MIN_MOVE, C_REC_MISS, C_START, C_RING, C_SCRATCH, C_REC_SIGNAL, C_REC_SIG_N,
 C_REC_SIG_Z, C_HOLD_BASE) = range(30)
CFG_SIZE = 30                                       # C_RING, C_SCRATCH: those views' lengths

# -- x: this window's stats -----------------------------------------------------------------
(X_RATIO, X_RPS, X_P99, X_SLO, X_EMB, X_KV, X_QUEUE, X_H2D, X_NEW, X_EMB_TIME) = range(10)
X_SIZE = 10
STATS_SIGNATURE = ", ".join(["float64"] * X_SIZE)   # numba: the ten stats as arguments

# -- det: one row per signal (arrival rate, EMB miss rate, KV miss rate) ---------------------
D_MEAN, D_VAR, D_N, D_CUSUM, D_FLOOR = range(5)     # D_FLOOR: the signal's variance floor
D_COLS, N_SIG = 5, 3

# -- mem: [st | cfg | x | det | ring | scratch] ----------------------------------------------
CFG_AT = ST_SIZE
X_AT = CFG_AT + CFG_SIZE
DET_AT = X_AT + X_SIZE
RING_AT = DET_AT + D_COLS * N_SIG


def layout(ring: int, scratch: int):
    """A zeroed `mem` for a detector ring and policy scratch of these lengths, and its named views
    (st, cfg, x, det, ring, scratch): the same memory the kernel uses."""
    mem = np.zeros(RING_AT + ring + scratch)
    mem[CFG_AT + C_RING], mem[CFG_AT + C_SCRATCH] = ring, scratch
    return mem, views(mem)


@njit(cache=True, nogil=True)
def views(mem):
    cfg = mem[CFG_AT:CFG_AT + CFG_SIZE]
    n_ring, n_h = int(cfg[C_RING]), int(cfg[C_SCRATCH])
    h_at = RING_AT + n_ring
    return (mem[:ST_SIZE], cfg, mem[X_AT:X_AT + X_SIZE], mem[DET_AT:RING_AT].reshape((N_SIG, D_COLS)),
            mem[RING_AT:h_at], mem[h_at:h_at + n_h])


@njit(cache=True, nogil=True, inline="always")
def store(x, ratio, rps, p99, slo, emb, kv, queue, h2d, new_users, emb_time):
    """A window's stats into `x`."""
    x[X_RATIO], x[X_RPS], x[X_P99], x[X_SLO], x[X_EMB] = ratio, rps, p99, slo, emb
    x[X_KV], x[X_QUEUE], x[X_H2D], x[X_NEW], x[X_EMB_TIME] = kv, queue, h2d, new_users, emb_time
