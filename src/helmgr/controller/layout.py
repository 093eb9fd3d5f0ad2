"""The controller's memory: one float64 array, `mem`, that the compiled step reads and writes.

The scalars `st`, the constants `cfg` and `lc`, this window's stats `x`, the detector's rows,
its exit ring, the policy's scratch and the adapter's exploration noise are each a view of it.
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
EVENT, EPS, DZ, NOISE_I = 13, 14, 15, 16            # outputs: 0/1 start/2 end, adapter noise, slope; noise left
SIG = 17                                            # st[SIG:SIG + 3]: the detector's signals this window
OBS = 20                                            # st[OBS:OBS + N_FEATURES]: the observation
# the adapter's learning: the previous decision's noise, slope and observation, which the next
# window's reward is credited to; the reward baseline; updates made
T_HAS = OBS + N_FEATURES
T_EPS, T_DZ, BASELINE, HAS_BASELINE, UPDATES = T_HAS + 1, T_HAS + 2, T_HAS + 3, T_HAS + 4, T_HAS + 5
T_OBS = T_HAS + 6                                         # st[T_OBS:T_OBS + N_FEATURES]
HOLD = T_OBS + N_FEATURES                           # after a burst: the floor under the plan, decaying (NaN: none)
APPLIED, SETTLED = HOLD + 1, HOLD + 2               # the ratio last set (NaN: none); targets not moved to (counter)
# the adapter's block of gradient estimates: sums, sums of squares, count; blocks that changed
# the parameters
G_SUM = HOLD + 3                                    # st[G_SUM:G_SUM + N_FEATURES + 1]
G_SQ = G_SUM + N_FEATURES + 1                       # st[G_SQ:G_SQ + N_FEATURES + 1]
G_K, BLOCKS_APPLIED = G_SQ + N_FEATURES + 1, G_SQ + N_FEATURES + 2
BAD_INPUT = BLOCKS_APPLIED + 1                      # windows whose stats were refused (counter; safety.stats_ok)
# recovery_signal: the test has stepped the plan down in this burst; the samples since its last move (n, sum, squares)
SIG_STEPPED, SIG_N, SIG_SUM, SIG_SQ = BAD_INPUT + 1, BAD_INPUT + 2, BAD_INPUT + 3, BAD_INPUT + 4
OB_MARGINAL = SIG_SQ + 1                            # observation: the counterfactual samples' EWMA, ms (0: none yet)
ST_SIZE = OB_MARGINAL + 1

# -- lc: the adapter's learning constants ---------------------------------------------------
L_LR, L_SIGMA2, L_BASELINE_ALPHA, L_MISS_PENALTY, L_MOVE_COST, L_BLOCK, L_Z = range(7)
LC_SIZE = 7

# -- cfg: constants -------------------------------------------------------------------------
(C_OB_ALPHA, C_ALPHA, C_CLIP, C_K, C_H, C_Z_SPIKE, C_Z_EXIT, C_EXIT_TICKS, C_WARMUP, C_HAS_DET,
 C_HAS_BASE, C_MAX_STEP, C_HAS_AD, C_BOUND, C_EXPLORE, C_R_MIN, C_R_MAX, C_SLEW, C_REC_RATIO, C_REC_STEP,
 C_REL_FLOOR, C_HOLD_STEP, C_MIN_MOVE, C_REC_MISS, C_START, C_RING, C_SCRATCH, C_NOISE, C_REC_SIGNAL, C_REC_SIG_N,
 C_REC_SIG_Z, C_HOLD_BASE) = range(32)
CFG_SIZE = 32                                       # C_RING, C_SCRATCH, C_NOISE: those views' lengths

# -- x: this window's stats -----------------------------------------------------------------
(X_RATIO, X_RPS, X_P99, X_SLO, X_EMB, X_KV, X_QUEUE, X_H2D, X_NEW, X_EMB_TIME) = range(10)
X_SIZE = 10
STATS_SIGNATURE = ", ".join(["float64"] * X_SIZE)   # numba: the ten stats as arguments

# -- det: one row per signal (arrival rate, EMB miss rate, KV miss rate) ---------------------
D_MEAN, D_VAR, D_N, D_CUSUM, D_FLOOR = range(5)     # D_FLOOR: the signal's variance floor
D_COLS, N_SIG = 5, 3

# -- mem: [st | cfg | lc | x | det | ring | scratch | noise] --------------------------------
CFG_AT = ST_SIZE
LC_AT = CFG_AT + CFG_SIZE
X_AT = LC_AT + LC_SIZE
DET_AT = X_AT + X_SIZE
RING_AT = DET_AT + D_COLS * N_SIG


def layout(ring: int, scratch: int, noise: int):
    """A zeroed `mem` for a detector ring, policy scratch and noise batch of these lengths, and
    its named views (st, cfg, lc, x, det, ring, scratch, noise): the same memory the kernel uses."""
    mem = np.zeros(RING_AT + ring + scratch + noise)
    mem[CFG_AT + C_RING], mem[CFG_AT + C_SCRATCH], mem[CFG_AT + C_NOISE] = ring, scratch, noise
    return mem, views(mem)


@njit(cache=True, nogil=True)
def views(mem):
    cfg = mem[CFG_AT:CFG_AT + CFG_SIZE]
    n_ring, n_h = int(cfg[C_RING]), int(cfg[C_SCRATCH])
    h_at = RING_AT + n_ring
    return (mem[:ST_SIZE], cfg, mem[LC_AT:LC_AT + LC_SIZE], mem[X_AT:X_AT + X_SIZE],
            mem[DET_AT:RING_AT].reshape((N_SIG, D_COLS)), mem[RING_AT:h_at], mem[h_at:h_at + n_h],
            mem[h_at + n_h:h_at + n_h + int(cfg[C_NOISE])])


@njit(cache=True, nogil=True, inline="always")
def store(x, ratio, rps, p99, slo, emb, kv, queue, h2d, new_users, emb_time):
    """A window's stats into `x`."""
    x[X_RATIO], x[X_RPS], x[X_P99], x[X_SLO], x[X_EMB] = ratio, rps, p99, slo, emb
    x[X_KV], x[X_QUEUE], x[X_H2D], x[X_NEW], x[X_EMB_TIME] = kv, queue, h2d, new_users, emb_time
