"""Burst detection for the recovery tier (the controller's tier 3): EWMA z-scores and CUSUM.

Each signal (arrival rate, EMB miss rate, KV miss rate) keeps an exponentially weighted baseline
mean and variance; a tick's z-score is its distance from the baseline in baseline standard
deviations. A one-sided CUSUM accumulates `z - k` and alarms past `h`: it finds a sustained
shift of about `2k` standard deviations in a few ticks while single outliers decay.

- The baseline is frozen while a burst is on, so the burst does not become the new normal.
- Once it has `1/alpha` points, each update is winsorized at `clip` standard deviations, so one
  spike the detector let through cannot inflate the variance and blind it to the next.
- The standard deviation is never taken below `rel_floor` of the mean (default 0.1): a burst is
  a step of x1.5 or more (the burst regime's events are x1.5-x3), so a rise of a few percent (a
  window's noise, a traffic ramp) stays a sigma or so, however steady the signal was while the
  baseline formed.
- The baseline is fast (alpha 0.1: ~10 ticks of memory), so slow drifts (a ramp, a hot set
  turning over) become the normal; a burst is a step, and a step is what the z-score sees.
- The signals after the first are shares in [0, 1] (miss rates), and their standard deviation
  is never taken below `share_floor` (default 0.01): near zero the relative floor does not help,
  and a cache that holds nearly everything would see its own resize as a many-sigma spike.

A burst starts when the arrival rate's CUSUM alarms, or any signal's z-score exceeds `z_spike`
(a step so large that waiting for CUSUM costs ticks). Miss rates start a burst only by a spike:
they drift for ordinary reasons, and a CUSUM adds a steady drift up into an alarm. A burst ends
with hysteresis: the arrival rate's z-score, averaged over the last `exit_ticks` ticks, back
below `z_exit`. Only the arrival rate's: after a burst the miss rates settle somewhere new (the
caches hold other rows), and against a frozen baseline they would hold the burst open for ever.

`BurstDetector` holds the thresholds; `detect` is the compiled step, on the detector's rows of
the controller's memory (helmgr.controller.layout).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from numba import njit

from helmgr.controller.layout import (ACTIVE, C_ALPHA, C_CLIP, C_EXIT_TICKS, C_H, C_HAS_DET, C_K, C_REL_FLOOR,
                                      C_WARMUP, C_Z_EXIT, C_Z_SPIKE, D_CUSUM, D_FLOOR, D_MEAN, D_N, D_VAR, RING_I,
                                      RING_N, TICKS)

VAR_FLOOR = 1e-9            # no signal's variance is taken below this


@dataclass(frozen=True, slots=True)
class BurstDetector:
    """The detector's thresholds, for `n_signals` signals (the first: the arrival rate)."""

    n_signals: int = 3
    alpha: float = 0.1
    k: float = 1.0
    h: float = 6.0
    z_spike: float = 8.0
    z_exit: float = 1.0
    exit_ticks: int = 20
    warmup_ticks: int = 10          # ticks before any alarm: the baseline is still forming
    rel_floor: float = 0.1
    share_floor: float = 0.01
    clip: float = 4.0

    def __post_init__(self):
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"EWMA weight must be in (0, 1), got {self.alpha}")
        if not self.share_floor >= 0:
            raise ValueError(f"share_floor must be >= 0, got {self.share_floor}")

    @property
    def floors(self) -> list[float]:
        """Each signal's variance floor."""
        return [VAR_FLOOR] + [max(self.share_floor**2, VAR_FLOOR)] * (self.n_signals - 1)

    def configure(self, cfg, det, on: bool) -> None:
        """Write the thresholds into the kernel's constants and the detector's rows."""
        cfg[[C_ALPHA, C_CLIP, C_K, C_H, C_Z_SPIKE, C_Z_EXIT, C_EXIT_TICKS, C_WARMUP, C_HAS_DET, C_REL_FLOOR]] = (
            self.alpha, self.clip, self.k, self.h, self.z_spike, self.z_exit, self.exit_ticks, self.warmup_ticks,
            on, self.rel_floor)
        det[:, D_FLOOR] = self.floors


@njit(cache=True, nogil=True)
def _z(det, i, v, cfg):
    """Signal i's standardized distance of v from its baseline (0 until it has two points)."""
    if det[i, D_N] < 2:
        return 0.0
    rel = cfg[C_REL_FLOOR] * det[i, D_MEAN]
    return (v - det[i, D_MEAN]) / math.sqrt(max(det[i, D_VAR], det[i, D_FLOOR], rel * rel))


@njit(cache=True, nogil=True)
def _update(det, i, v, cfg):
    """Signal i's baseline takes v: a plain mean while young, then EWMA, winsorized at clip sigma."""
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


@njit(cache=True, nogil=True, inline="always")
def _ended(z0, st, det, ring, cfg):
    """During a burst: the arrival rate's z joins the exit ring; True once its mean over a full
    ring is below z_exit (the CUSUMs restart)."""
    size = ring.shape[0]
    ring[int(st[RING_I])] = z0
    st[RING_I] = (st[RING_I] + 1) % size
    if st[RING_N] < size:
        st[RING_N] += 1
    if st[RING_N] < size:
        return False
    total = 0.0
    for j in range(size):                       # oldest first
        total += ring[int((st[RING_I] + j) % size)]
    if not total < cfg[C_Z_EXIT] * size:
        return False
    st[ACTIVE] = 0.0
    for i in range(det.shape[0]):
        det[i, D_CUSUM] = 0.0
    return True


@njit(cache=True, nogil=True)
def detect(sig, st, det, ring, cfg):
    """One tick on this window's signals: 1 a burst starts, 2 it ends, 0 nothing."""
    st[TICKS] += 1
    warm = st[TICKS] > cfg[C_WARMUP]
    active = st[ACTIVE] != 0.0
    z0 = 0.0
    for i in range(det.shape[0]):
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
        return 2 if _ended(z0, st, det, ring, cfg) else 0
    for i in range(det.shape[0]):                   # the baseline learns only outside bursts
        if math.isfinite(sig[i]):
            _update(det, i, sig[i], cfg)
    return 0
