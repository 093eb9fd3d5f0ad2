"""One controller decision as one compiled call: the fast path of `Controller.step`.

The tiers are written as plain Python classes (observe.py, detect.py, mlp.py, adapter.py,
safety.py): readable, unit-tested, and the reference this kernel is tested against decision for
decision (tests/test_controller_kernel.py). Calling them one by one costs ~25 µs here, nearly all
of it interpreter overhead on ten-element vectors; this kernel does the same arithmetic, in the
same order, in one numba call on one preallocated state array (~2–5 µs).

State lives in one float64 array the Controller owns, `mem` (`layout` below): the scalars `st`,
the constants `cfg` and `lc`, this window's stats `x`, the detector's rows, its exit ring, the
policy's scratch and the adapter's exploration noise, each a view of it. One array, because a
call's cost from Python is mostly numba unboxing its arguments (~0.15 µs an array): ten arrays
were half of a decision. The stats come in as ten floats (cheaper than writing them into an
array from Python first). The adapter's parameters come in as the one array the adapter swaps
whole, so a decision reads either the old or the new parameters, never a mix.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from helmgr.controller.observe import N_FEATURES, P99_CAP

# -- st: scalars ----------------------------------------------------------------------------
OB_MEAN, OB_PREV, OB_INIT = 0, 1, 2                 # observer: long-run rate, last rate, started
LAST, PLAN, RECOVERING = 3, 4, 5                    # controller: last target (reported), plan, flag
ACTIVE, TICKS, RING_N, RING_I = 6, 7, 8, 9          # detector: burst on, ticks seen, ring fill/next
NON_FINITE, CLAMPED, SLEWED = 10, 11, 12            # safety counters
EVENT, EPS, DZ, NOISE_I = 13, 14, 15, 16            # outputs: 0/1 start/2 end, adapter noise, slope; noise left
SIG = 17                                            # st[SIG:SIG + 3]: the detector's signals this window
OBS = 20                                            # st[OBS:OBS + N_FEATURES]: the observation
# the adapter's learning (`learn`): the previous decision's noise, slope and observation, which
# the next window's reward is credited to; the reward baseline; updates made
T_HAS, T_EPS, T_DZ, BASELINE, HAS_BASELINE, UPDATES = 30, 31, 32, 33, 34, 35
T_OBS = 36                                          # st[T_OBS:T_OBS + N_FEATURES]
HOLD = T_OBS + N_FEATURES                           # after a burst: the floor under the plan, decaying (NaN: none)
APPLIED, SETTLED = HOLD + 1, HOLD + 2               # the ratio last set (NaN: none); targets not moved to (counter)
# the adapter's block of gradient estimates (ResidualAdapter.learn): sums, sums of squares, count;
# blocks that changed the parameters
G_SUM = HOLD + 3                                    # st[G_SUM:G_SUM + N_FEATURES + 1]
G_SQ = G_SUM + N_FEATURES + 1                       # st[G_SQ:G_SQ + N_FEATURES + 1]
G_K, BLOCKS_APPLIED = G_SQ + N_FEATURES + 1, G_SQ + N_FEATURES + 2
ST_SIZE = BLOCKS_APPLIED + 1

# -- lc: the adapter's learning constants ---------------------------------------------------
L_LR, L_SIGMA2, L_BASELINE_ALPHA, L_MISS_PENALTY, L_MOVE_COST, L_BLOCK, L_Z = range(7)
LC_SIZE = 7

# -- cfg: constants -------------------------------------------------------------------------
(C_OB_ALPHA, C_ALPHA, C_CLIP, C_K, C_H, C_Z_SPIKE, C_Z_EXIT, C_EXIT_TICKS, C_WARMUP, C_HAS_DET,
 C_HAS_BASE, C_MAX_STEP, C_HAS_AD, C_BOUND, C_EXPLORE, C_R_MIN, C_R_MAX, C_SLEW, C_REC_RATIO, C_REC_STEP,
 C_REL_FLOOR, C_HOLD_STEP, C_MIN_MOVE, C_REC_MISS, C_RING, C_SCRATCH, C_NOISE) = range(27)
CFG_SIZE = 27                                       # C_RING, C_SCRATCH, C_NOISE: those views' lengths

# -- x: this window's stats -----------------------------------------------------------------
(X_RATIO, X_RPS, X_P99, X_SLO, X_EMB, X_KV, X_QUEUE, X_H2D, X_NEW, X_EMB_TIME) = range(10)

# -- det: one row per signal (arrival rate, EMB miss rate, KV miss rate) ---------------------
D_MEAN, D_VAR, D_N, D_CUSUM, D_FLOOR = range(5)     # D_FLOOR: the signal's variance floor (EwmaZ.floor)
D_COLS, N_SIG = 5, 3

# -- mem: [st | cfg | lc | x | det | ring | scratch | noise] --------------------------------
CFG_AT = ST_SIZE
LC_AT = CFG_AT + CFG_SIZE
X_AT = LC_AT + LC_SIZE
DET_AT = X_AT + 10
RING_AT = DET_AT + D_COLS * N_SIG


def layout(ring: int, scratch: int, noise: int):
    """A zeroed `mem` for a detector ring, policy scratch and noise batch of these lengths, and
    its named views (st, cfg, lc, x, det, ring, scratch, noise): the same memory the kernel uses."""
    mem = np.zeros(RING_AT + ring + scratch + noise)
    mem[CFG_AT + C_RING], mem[CFG_AT + C_SCRATCH], mem[CFG_AT + C_NOISE] = ring, scratch, noise
    return mem, _views(mem)


@njit(cache=True, nogil=True)
def _views(mem):
    cfg = mem[CFG_AT:CFG_AT + CFG_SIZE]
    n_ring, n_h = int(cfg[C_RING]), int(cfg[C_SCRATCH])
    h_at = RING_AT + n_ring
    return (mem[:ST_SIZE], cfg, mem[LC_AT:LC_AT + LC_SIZE], mem[X_AT:X_AT + 10],
            mem[DET_AT:RING_AT].reshape((N_SIG, D_COLS)), mem[RING_AT:h_at], mem[h_at:h_at + n_h],
            mem[h_at + n_h:h_at + n_h + int(cfg[C_NOISE])])


@njit(cache=True, nogil=True)
def _finite(v):
    if math.isfinite(v):
        return v
    return 0.0 if v != v else math.copysign(P99_CAP, v)


@njit(cache=True, nogil=True)
def _observe(x, st, cfg):
    rps = x[X_RPS] if math.isfinite(x[X_RPS]) and x[X_RPS] >= 0 else 0.0
    if st[OB_INIT] == 0.0:
        st[OB_MEAN] = st[OB_PREV] = rps
        st[OB_INIT] = 1.0
    scale = max(st[OB_MEAN], 1e-6)
    q = x[X_QUEUE] if math.isfinite(x[X_QUEUE]) and x[X_QUEUE] > 0 else 0.0
    p99 = x[X_P99]
    tail = min(p99 / x[X_SLO], P99_CAP) if math.isfinite(p99) else 0.0
    prev = st[OB_PREV]
    st[OB_MEAN] += cfg[C_OB_ALPHA] * (rps - st[OB_MEAN])
    st[OB_PREV] = rps
    o = OBS
    st[o] = _finite(x[X_RATIO])
    st[o + 1] = _finite(x[X_EMB])
    st[o + 2] = _finite(x[X_KV])
    st[o + 3] = _finite(rps / scale)
    st[o + 4] = _finite((rps - prev) / scale)
    st[o + 5] = _finite(math.log1p(q))
    st[o + 6] = _finite(tail)
    st[o + 7] = _finite(x[X_H2D])
    st[o + 8] = _finite(x[X_NEW])
    st[o + 9] = _finite(x[X_EMB_TIME])
    return tail


@njit(cache=True, nogil=True)
def _z(det, i, v, cfg):
    if det[i, D_N] < 2:
        return 0.0
    rel = cfg[C_REL_FLOOR] * det[i, D_MEAN]
    return (v - det[i, D_MEAN]) / math.sqrt(max(det[i, D_VAR], det[i, D_FLOOR], rel * rel))


@njit(cache=True, nogil=True)
def _update(det, i, v, cfg):
    n = det[i, D_N]
    if n == 0:
        det[i, D_MEAN] = v
    else:
        d = v - det[i, D_MEAN]
        if n >= 1 / cfg[C_ALPHA]:
            lim = cfg[C_CLIP] * math.sqrt(max(det[i, D_VAR], det[i, D_FLOOR]))
            d = -lim if d < -lim else (lim if d > lim else d)
        alpha = cfg[C_ALPHA]
        a = alpha if n >= 1 / alpha else 1.0 / (n + 1)
        det[i, D_MEAN] += a * d
        det[i, D_VAR] = (1 - a) * (det[i, D_VAR] + a * d * d)
    det[i, D_N] = n + 1


@njit(cache=True, nogil=True)
def _detect(sig, st, det, ring, cfg):
    """BurstDetector.step: 1 start, 2 end, 0 nothing."""
    st[TICKS] += 1
    warm = st[TICKS] > cfg[C_WARMUP]
    active = st[ACTIVE] != 0.0
    n_sig = det.shape[0]
    z0 = 0.0
    for i in range(n_sig):
        v = sig[i]
        z = _z(det, i, v, cfg) if math.isfinite(v) else 0.0
        if i == 0:
            z0 = z
        alarm = False
        if warm:
            s = max(0.0, det[i, D_CUSUM] + z - cfg[C_K])
            det[i, D_CUSUM] = s
            alarm = s > cfg[C_H] and i == 0          # miss rates start a burst by a spike only
        if not active and warm and (alarm or z > cfg[C_Z_SPIKE]):
            st[ACTIVE] = 1.0
            st[RING_N] = st[RING_I] = 0.0
            return 1
    if active:
        size = ring.shape[0]
        ring[int(st[RING_I])] = z0
        st[RING_I] = (st[RING_I] + 1) % size
        if st[RING_N] < size:
            st[RING_N] += 1
        if st[RING_N] == size:
            total = 0.0
            for j in range(size):                       # oldest first, as the reference sums
                total += ring[int((st[RING_I] + j) % size)]
            if total < cfg[C_Z_EXIT] * size:
                st[ACTIVE] = 0.0
                for i in range(n_sig):
                    det[i, D_CUSUM] = 0.0
                return 2
        return 0
    for i in range(n_sig):                              # the baseline learns only outside bursts
        if math.isfinite(sig[i]):
            _update(det, i, sig[i], cfg)
    return 0


@njit(cache=True, nogil=True, inline="always")
def _tanh(v):
    """tanh through one exp: within 4e-16 of math.tanh (tested), at half its cost here (libm's
    tanh was ~25 ns, 3 µs of a decision's ~4 for the policy's 128 hidden units). Clamped where
    tanh is 1.0 in float64 anyway, so exp never overflows (fastmath assumes no infinities)."""
    v = -20.0 if v < -20.0 else (20.0 if v > 20.0 else v)
    return 1.0 - 2.0 / (1.0 + math.exp(2.0 * v))


@njit(cache=True, nogil=True, fastmath=True)     # fastmath: the dot products vectorize
def forward(obs, flat, dims, h):
    """MLPPolicy's deterministic action. `flat` = [clip, obs_mean, obs_std, (W, b) per layer],
    W row-major (out x in); `dims` = [n_obs, out_1, ..., out_L]; `h` has room for two layers."""
    n = dims[0]
    clip = flat[0]
    width = h.shape[0] // 2
    x, y = h[:width], h[width:]
    mean, std = flat[1:1 + n], flat[1 + n:1 + 2 * n]
    for i in range(n):
        v = (obs[i] - mean[i]) / std[i]
        x[i] = -clip if v < -clip else (clip if v > clip else v)
    p = 1 + 2 * n
    n_in = n
    layers = dims.shape[0] - 1
    for k in range(layers):
        n_out = dims[k + 1]
        w = flat[p:p + n_out * n_in].reshape((n_out, n_in))      # views: the inner loop vectorizes
        bias = flat[p + n_out * n_in:p + n_out * n_in + n_out]
        for o in range(n_out):
            acc = bias[o]
            for i in range(n_in):
                acc += w[o, i] * x[i]
            y[o] = acc
        if k < layers - 1:                  # apart from the dot products, which then stay tight
            for o in range(n_out):
                y[o] = _tanh(y[o])
        p += n_out * n_in + n_out
        n_in = n_out
        x, y = y, x
    a = x[0]
    return -1.0 if a < -1.0 else (1.0 if a > 1.0 else a)


_STATS = ", ".join(["float64"] * 10)
# explicit types: compiled once, at import (cached), and a stack's ints or bools arrive as floats
# instead of compiling a new variant per type combination (seconds each)


@njit(f"float64(float64[::1], float64[::1], int64[::1], float64[::1], {_STATS})", cache=True, nogil=True)
def decide(mem, flat, dims, ad, ratio, rps, p99, slo, emb, kv, queue, h2d, new_users, emb_time):
    """One Controller.step up to the decision, for a window's stats (p99 NaN: none); returns the
    ratio to set. Learning is `learn`, after it."""
    st, cfg, lc, x, det, ring, h, noise = _views(mem)
    x[X_RATIO], x[X_RPS], x[X_P99], x[X_SLO], x[X_EMB] = ratio, rps, p99, slo, emb
    x[X_KV], x[X_QUEUE], x[X_H2D], x[X_NEW], x[X_EMB_TIME] = kv, queue, h2d, new_users, emb_time
    st[EVENT] = 0.0
    current = x[X_RATIO] if math.isnan(st[APPLIED]) else st[APPLIED]     # the ratio set last
    plan = current if math.isnan(st[PLAN]) else st[PLAN]
    tail = _observe(x, st, cfg)
    obs = st[OBS:OBS + N_FEATURES]
    obs[0] = plan                                   # the learned tiers see the plan (Controller's docstring)
    if cfg[C_HAS_DET] != 0.0:
        sig = st[SIG:SIG + 3]                       # a view: nothing allocated on the decision path
        sig[0], sig[1], sig[2] = x[X_RPS], 1.0 - x[X_EMB], 1.0 - x[X_KV]
        _detect(sig, st, det, ring, cfg)
        if st[ACTIVE] != 0.0 and st[RECOVERING] == 0.0:
            st[RECOVERING], st[EVENT], st[HOLD] = 1.0, 1.0, math.nan
        elif st[RECOVERING] != 0.0 and st[ACTIVE] == 0.0 and tail <= 1.0:
            st[RECOVERING], st[EVENT] = 0.0, 2.0
            if cfg[C_HOLD_STEP] > 0.0:
                st[HOLD] = plan
    offset = 0.0
    st[EPS] = st[DZ] = math.nan
    if st[RECOVERING] != 0.0:
        gap = cfg[C_REC_RATIO] - plan
        if gap < 0.0 or not 1.0 - x[X_EMB] <= cfg[C_REC_MISS]:    # grow the EMB cache only while it misses
            plan += max(-cfg[C_REC_STEP], min(cfg[C_REC_STEP], gap))
    else:
        if cfg[C_HAS_BASE] != 0.0:
            plan += forward(obs, flat, dims, h) * cfg[C_MAX_STEP]
        if not math.isnan(st[HOLD]):               # after a burst the plan decays, no faster
            st[HOLD] -= cfg[C_HOLD_STEP]
            if st[HOLD] <= cfg[C_R_MIN]:
                st[HOLD] = math.nan
            elif plan < st[HOLD]:
                plan = st[HOLD]
        if cfg[C_HAS_AD] != 0.0:
            n = obs.shape[0]
            z = ad[n]
            for i in range(n):
                z += ad[i] * obs[i]
            t = math.tanh(z)
            offset = cfg[C_BOUND] * t
            if cfg[C_EXPLORE] != 0.0:
                k = int(st[NOISE_I]) - 1                # the reference pops from the end
                st[NOISE_I] = k
                eps = noise[k]
                st[EPS], st[DZ] = eps, cfg[C_BOUND] * (1.0 - t * t)
                offset += eps
    # Safety.apply
    proposed = plan + offset
    if not math.isfinite(proposed):
        st[NON_FINITE] += 1
        ratio = current
    else:
        lo, hi = current - cfg[C_SLEW], current + cfg[C_SLEW]
        if proposed < lo or proposed > hi:
            st[SLEWED] += 1
            proposed = lo if proposed < lo else hi
        if proposed < cfg[C_R_MIN] or proposed > cfg[C_R_MAX]:
            st[CLAMPED] += 1
            proposed = cfg[C_R_MIN] if proposed < cfg[C_R_MIN] else cfg[C_R_MAX]
        ratio = proposed
    if ratio != plan + offset:
        plan = ratio - offset if math.isfinite(offset) else ratio
    st[PLAN] = min(cfg[C_R_MAX], max(cfg[C_R_MIN], plan))
    st[LAST] = ratio
    # Safety.settle: the node's ratio moves only once the target is min_move away from it
    if ratio != current and abs(ratio - current) < cfg[C_MIN_MOVE] and cfg[C_R_MIN] < ratio < cfg[C_R_MAX]:
        st[SETTLED] += 1
        ratio = current
    st[APPLIED] = ratio
    return ratio


@njit("int64(float64[::1], float64[::1], float64[::1], float64)", cache=True, nogil=True)
def learn(mem, old, new, moved):
    """ResidualAdapter.learn, after `decide`: the reward of the window in `x` (observe.reward, with
    `moved` the previous decision's move) is credited to the previous decision's noise, and added
    to the block; then the decision just made becomes the one awaiting a reward. When a block
    changes the parameters, writes them into `new` and returns 1; otherwise returns 0 (`new` is
    scratch)."""
    st, cfg, lc, x, det, ring, h, noise = _views(mem)
    p99 = x[X_P99]
    tail = min(p99 / x[X_SLO], P99_CAP) if math.isfinite(p99) else 0.0
    r = -tail - (lc[L_MISS_PENALTY] if tail > 1.0 else 0.0) - lc[L_MOVE_COST] * abs(moved)
    updated = 0
    if st[T_HAS] != 0.0 and st[RECOVERING] == 0.0 and math.isfinite(r):
        if st[HAS_BASELINE] == 0.0:
            st[BASELINE], st[HAS_BASELINE] = r, 1.0
        else:
            advantage = r - st[BASELINE]
            st[BASELINE] += lc[L_BASELINE_ALPHA] * advantage
            g = advantage * st[T_EPS] / lc[L_SIGMA2] * st[T_DZ]
            n = old.shape[0] - 1
            for i in range(n + 1):
                gi = g * st[T_OBS + i] if i < n else g
                st[G_SUM + i] += gi
                st[G_SQ + i] += gi * gi
            st[UPDATES] += 1
            st[G_K] += 1
            if st[G_K] >= lc[L_BLOCK]:            # the block is full: step where its mean is significant
                k = st[G_K]
                for i in range(n + 1):
                    total = st[G_SUM + i]
                    mean = total / k
                    se = math.sqrt(max(st[G_SQ + i] - k * mean * mean, 0.0) / (k - 1) / k)
                    if abs(mean) > lc[L_Z] * se:
                        updated = 1
                        new[i] = old[i] + lc[L_LR] * total
                    else:
                        new[i] = old[i]
                    st[G_SUM + i] = st[G_SQ + i] = 0.0
                st[G_K] = 0.0
                st[BLOCKS_APPLIED] += updated
    if math.isnan(st[EPS]):                 # no exploration in this decision: nothing to credit
        st[T_HAS] = 0.0
    else:
        st[T_HAS], st[T_EPS], st[T_DZ] = 1.0, st[EPS], st[DZ]
        for i in range(N_FEATURES):
            st[T_OBS + i] = st[OBS + i]
    return updated
