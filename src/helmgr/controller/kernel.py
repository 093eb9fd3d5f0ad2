"""The controller's decision as one compiled call (`decide`).

The tiers' compiled code lives with their constants (observe, detect, mlp, safety);
this module strings it together in the order of `Controller`'s docstring. A decision is one
numba call on one preallocated array (helmgr.controller.layout), because calling the tiers one
by one from Python would be nearly all interpreter overhead on ten-element vectors. The stats
come in as ten floats (cheaper than writing them into an array from Python first). The adapter's
offset comes in as the one array the adapter swaps whole when it learns. The slow, readable
reference that this code is tested against, decision for decision, is
tests/controller_reference.py.

numba's on-disk cache keys each entry point on its own file only, while every cached function in
this package bakes in layout.py's offsets and calls the tiers' code: the package clears its cache
whenever any of its source files changes (`helmgr.core.jitcache`, from `controller/__init__.py`).
"""
from __future__ import annotations

import math

from numba import njit

from helmgr.controller.detect import detect
from helmgr.controller.layout import (ACTIVE, APPLIED, C_BOUND, C_HAS_AD, C_HAS_BASE, C_HAS_DET, C_HOLD_BASE,
                                      C_HOLD_STEP, C_MAX_STEP, C_R_MAX, C_R_MIN, C_REC_MISS, C_REC_RATIO, C_REC_SIG_N,
                                      C_REC_SIG_Z, C_REC_SIGNAL, C_REC_STEP, EVENT, HOLD, N_FEATURES, OBS, PLAN,
                                      RECOVERING, SIG, SIG_N, SIG_SQ, SIG_STEPPED, SIG_SUM, STATS_SIGNATURE, TARGET,
                                      X_EMB, X_KV, X_RATIO, X_RPS, store, views)
from helmgr.controller.mlp import forward
from helmgr.controller.observe import observe_window
from helmgr.controller.safety import fallback, limit, settle, stats_ok

# explicit types: compiled once, at import (cached), and a stack's ints or bools arrive as floats
# instead of compiling a new variant per type combination (seconds each)


@njit(cache=True, nogil=True, inline="always")
def _switch(x, st, cfg, det, ring, tail, plan):
    """The recovery tier's switch: on at the detector's burst; off, with hysteresis, once the
    detector has seen it end and the node is back under its SLO (the post-burst floor starts at
    the plan then)."""
    sig = st[SIG:SIG + 3]                       # a view: nothing allocated on the decision path
    sig[0], sig[1], sig[2] = x[X_RPS], 1.0 - x[X_EMB], 1.0 - x[X_KV]
    detect(sig, st, det, ring, cfg)
    if st[ACTIVE] != 0.0 and st[RECOVERING] == 0.0:
        st[RECOVERING], st[EVENT], st[HOLD], st[SIG_STEPPED] = 1.0, 1.0, math.nan, 0.0
        st[SIG_N] = st[SIG_SUM] = st[SIG_SQ] = 0.0
    elif st[RECOVERING] != 0.0 and st[ACTIVE] == 0.0 and tail <= 1.0:
        st[RECOVERING], st[EVENT] = 0.0, 2.0
        if cfg[C_HOLD_STEP] > 0.0:
            st[HOLD] = plan


@njit(cache=True, nogil=True, inline="always")
def _recover(plan, x, cfg, st, signal):
    """During recovery: the plan steers toward the recovery ratio, growing the EMB cache only
    while it misses. With `recovery_signal` (a step > 0) adapter v2's counterfactual samples
    (`signal`, NaN: none closed with this window) are tested: once at least `recovery_samples`
    have come since the plan last moved and their mean is more than `recovery_z` standard errors
    below zero (a larger EMB share would cost time), the plan steps down, the samples restart,
    and the miss rule is off for the rest of the burst."""
    if cfg[C_REC_SIGNAL] > 0.0 and not math.isnan(signal):
        st[SIG_N] += 1.0
        st[SIG_SUM] += signal
        st[SIG_SQ] += signal * signal
        n = st[SIG_N]
        if n >= cfg[C_REC_SIG_N]:                # >= 2 (Controller checks)
            mean = st[SIG_SUM] / n
            se = math.sqrt(max(st[SIG_SQ] - n * mean * mean, 0.0) / (n - 1.0) / n)
            if mean < -cfg[C_REC_SIG_Z] * se:
                st[SIG_STEPPED] = 1.0
                st[SIG_N] = st[SIG_SUM] = st[SIG_SQ] = 0.0
                return plan - cfg[C_REC_SIGNAL]
    if st[SIG_STEPPED] != 0.0:
        return plan
    gap = cfg[C_REC_RATIO] - plan
    if gap < 0.0 or not 1.0 - x[X_EMB] <= cfg[C_REC_MISS]:
        step = max(-cfg[C_REC_STEP], min(cfg[C_REC_STEP], gap))
        if step != 0.0:                         # the samples so far were taken at another split
            st[SIG_N] = st[SIG_SUM] = st[SIG_SQ] = 0.0
        plan += step
    return plan


@njit(cache=True, nogil=True, inline="always")
def _base(plan, offset, obs, flat, dims, h, st, cfg):
    """Outside recovery: the base policy's step, then the post-burst floor, decaying. With
    C_HOLD_BASE a step against the adapter's `offset` (of the other sign) is scaled down by the
    share of the bound the offset takes, to nothing at the bound (MarginalAdapter.hold_base)."""
    if cfg[C_HAS_BASE] != 0.0:
        step = forward(obs, flat, dims, h) * cfg[C_MAX_STEP]
        if cfg[C_HOLD_BASE] != 0.0 and step * offset < 0.0:
            step *= max(0.0, 1.0 - abs(offset) / cfg[C_BOUND])
        plan += step
    if not math.isnan(st[HOLD]):
        st[HOLD] -= cfg[C_HOLD_STEP]
        if st[HOLD] <= cfg[C_R_MIN]:
            st[HOLD] = math.nan
        elif plan < st[HOLD]:
            plan = st[HOLD]
    return plan


@njit(cache=True, nogil=True, inline="always")
def _set(plan, offset, current, st, cfg):
    """Safety on plan + offset: the target (st[TARGET]), the plan it implies (st[PLAN]), and the
    ratio to set, which follows the target in moves of at least min_move."""
    ratio = limit(plan + offset, current, st, cfg)
    if ratio != plan + offset:          # clamped, slewed or non-finite: the plan is what was set
        plan = ratio - offset if math.isfinite(offset) else ratio
    st[PLAN] = min(cfg[C_R_MAX], max(cfg[C_R_MIN], plan))
    st[TARGET] = ratio
    ratio = settle(ratio, current, st, cfg)
    st[APPLIED] = ratio
    return ratio


@njit(f"float64(float64[::1], float64[::1], int64[::1], float64[::1], {STATS_SIGNATURE}, float64)", cache=True,
      nogil=True)
def decide(mem, flat, dims, ad, ratio, rps, p99, slo, emb, kv, queue, h2d, new_users, emb_time, signal):
    """One Controller.step, for a window's stats (p99 NaN: none) and the adapter's counterfactual
    sample if one closed with it (`signal`; NaN: none); returns the ratio to set. `ad` holds the
    adapter's offset (`MarginalAdapter.params`; it learns in Python, after the decision).
    Refused stats (`safety.stats_ok`) touch nothing but the
    `BAD_INPUT` counter: `safety.fallback` answers them."""
    st, cfg, x, det, ring, h = views(mem)
    if not stats_ok(ratio, rps, p99, slo, emb, kv, queue, h2d, new_users, emb_time):
        return fallback(ratio, st, cfg)
    store(x, ratio, rps, p99, slo, emb, kv, queue, h2d, new_users, emb_time)
    st[EVENT] = 0.0
    current = x[X_RATIO] if math.isnan(st[APPLIED]) else st[APPLIED]     # the ratio set last
    plan = current if math.isnan(st[PLAN]) else st[PLAN]
    tail = observe_window(x, st, cfg, signal)
    obs = st[OBS:OBS + N_FEATURES]
    obs[0] = plan                                   # the learned tiers see the plan (Controller's docstring)
    if cfg[C_HAS_DET] != 0.0:
        _switch(x, st, cfg, det, ring, tail, plan)
    offset = 0.0
    if st[RECOVERING] != 0.0:
        plan = _recover(plan, x, cfg, st, signal)
    else:
        if cfg[C_HAS_AD] != 0.0:
            offset = ad[0]                          # the adapter's offset, read once (it swaps the array whole)
        plan = _base(plan, offset, obs, flat, dims, h, st, cfg)
    return _set(plan, offset, current, st, cfg)
