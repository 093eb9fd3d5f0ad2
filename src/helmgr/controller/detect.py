"""Burst detection for the recovery tier (SPEC 6, tier 3): EWMA z-scores and CUSUM.

Each signal (arrival rate, EMB miss rate, KV miss rate, ...) keeps an exponentially weighted
baseline mean and variance; a tick's z-score is its distance from the baseline in baseline
standard deviations. A one-sided CUSUM accumulates `z - k` and alarms past `h`: it finds a
sustained shift of about `2k` standard deviations in a few ticks while single outliers decay.
The baseline is frozen while a burst is on, so the burst does not become the new normal. Once
it has `1/alpha` points, each update is winsorized at `clip` standard deviations, so one spike
the detector let through cannot inflate the variance and blind it to the next; and the standard
deviation is never taken below `rel_floor` of the mean (default 0.1): a burst is a step
of x2 or more (SPEC: x3-x5), so a rise of a few percent -- the noise of a node's 400 requests a
window, a traffic ramp -- is never more than a sigma or so, however steady the signal was while
the baseline formed. (At 0.01, a +13 % window on trend's ramp once raised an alarm, and with the
baseline frozen below the still-rising rate the burst never ended.) The
baseline is fast (alpha 0.1: ~10 ticks of memory), so slow drifts -- a traffic ramp, a hot set
turning over -- become the normal instead of an alarm; a burst is a step, and a step is what the
z-score sees.

A burst starts when the first signal's (the arrival rate's) CUSUM alarms, or any signal's
z-score exceeds `z_spike` (a step so large that waiting for CUSUM costs ticks). Miss rates
start a burst only by a spike: they drift for ordinary reasons (trend's hot set turning over
moves the EMB miss rate by ~2 sigma of its window-to-window noise, steadily, and a CUSUM adds
that up into an alarm within ten windows); it ends with hysteresis: the first signal's (the arrival
rate's) z-score, averaged over the last `exit_ticks` ticks, back below `z_exit`. Only the first:
miss rates after a burst settle somewhere new (the caches hold other rows now), and against a
frozen baseline they would hold the burst open for ever. Start and end events are returned to the caller, who logs them.

The signals after the first are shares in [0, 1] (miss rates), and their standard deviation is
never taken below `share_floor` (default 0.01), so a spike needs a rise of 8 points of miss rate.
Without it, a cache that holds nearly everything (H200, EMB miss rate ~0.001, a sigma of 0.0002)
saw the node's own resize -- a few rows evicted, the miss rate up to 0.02 -- as a 20- to
400-sigma spike: ten "bursts" in a steady minute, each steering the split to the recovery ratio,
+27 % P99 over 300 s (the relative floor does not help near zero). A burst of cold users moves a
miss rate by tens of points.
"""
from __future__ import annotations

import math
from collections import deque


class EwmaZ:
    """Running baseline of one signal: EWMA mean and variance with weight `alpha` per update."""

    __slots__ = ("alpha", "mean", "var", "n", "floor", "clip", "rel_floor")

    def __init__(self, alpha: float = 0.1, floor: float = 1e-9, clip: float = 4.0, rel_floor: float = 0.1):
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"EWMA weight must be in (0, 1), got {alpha}")
        self.alpha, self.floor, self.clip, self.rel_floor = alpha, floor, clip, rel_floor
        self.mean = self.var = 0.0
        self.n = 0

    def z(self, x: float) -> float:
        """Standardized distance of x from the baseline (0 until the baseline has two points)."""
        if self.n < 2:
            return 0.0
        return (x - self.mean) / math.sqrt(max(self.var, self.floor, (self.rel_floor * self.mean) ** 2))

    def update(self, x: float) -> None:
        if self.n == 0:
            self.mean = x
        else:
            d = x - self.mean
            if self.n >= 1 / self.alpha:                        # winsorize: outliers count as clip sigma
                lim = self.clip * math.sqrt(max(self.var, self.floor))
                d = -lim if d < -lim else (lim if d > lim else d)
            a = self.alpha if self.n >= 1 / self.alpha else 1.0 / (self.n + 1)   # plain mean while young
            self.mean += a * d
            self.var = (1 - a) * (self.var + a * d * d)
        self.n += 1


class Cusum:
    """One-sided (upward) CUSUM on z-scores: S = max(0, S + z - k); alarm when S > h."""

    __slots__ = ("k", "h", "s")

    def __init__(self, k: float = 1.0, h: float = 6.0):
        self.k, self.h, self.s = k, h, 0.0

    def step(self, z: float) -> bool:
        self.s = max(0.0, self.s + z - self.k)
        return self.s > self.h

    def reset(self) -> None:
        self.s = 0.0


class BurstDetector:
    """Burst on/off from several signals. `step(values)` returns "start", "end" or None."""

    def __init__(self, n_signals: int, alpha: float = 0.1, k: float = 1.0, h: float = 6.0, z_spike: float = 8.0,
                 z_exit: float = 1.0, exit_ticks: int = 20, warmup_ticks: int = 10, rel_floor: float = 0.1,
                 share_floor: float = 0.01):
        if not share_floor >= 0:
            raise ValueError(f"share_floor must be >= 0, got {share_floor}")
        floors = [1e-9] + [max(share_floor**2, 1e-9)] * (n_signals - 1)      # variances
        self.base = [EwmaZ(alpha, floor=f, rel_floor=rel_floor) for f in floors]
        self.cusum = [Cusum(k, h) for _ in range(n_signals)]
        self.z_spike, self.z_exit, self.exit_ticks, self.warmup_ticks = z_spike, z_exit, exit_ticks, warmup_ticks
        self.active = False
        self.recent: deque[float] = deque(maxlen=exit_ticks)    # the first signal's z, while active
        self.ticks = 0
        self.z = [0.0] * n_signals

    def step(self, values) -> str | None:
        self.ticks += 1
        zs = self.z
        warm = self.ticks > self.warmup_ticks          # before that the baseline is still forming
        for i, x in enumerate(values):
            zs[i] = z = self.base[i].z(x) if math.isfinite(x) else 0.0
            alarm = self.cusum[i].step(z) and i == 0 if warm else False
            if not self.active and warm and (alarm or z > self.z_spike):
                self.active = True
                self.recent.clear()
                return self._finish("start", values)
        if self.active:
            self.recent.append(zs[0])
            if len(self.recent) == self.exit_ticks and sum(self.recent) < self.z_exit * self.exit_ticks:
                self.active = False
                for c in self.cusum:
                    c.reset()
                return "end"
            return None
        return self._finish(None, values)

    def _finish(self, event, values):
        if not self.active:                 # the baseline learns only outside bursts
            for b, x in zip(self.base, values):
                if math.isfinite(x):
                    b.update(x)
        return event
