"""Phases: the stretches of a run that a scenario check compares (S2-S5).

A workload's phases cover [0, duration) contiguously, in time order, with no gaps or overlaps.
Kinds: `steady` (a stationary stretch), `burst` (a trending event), `feed` and `discovery`
(trend's plateaus) and `block` (fixed stretches of a replayed log). `Plateaus` is the schedule
behind trend: the discovery share of the request rate alternates between two levels, with a
linear ramp at the start of every phase but the first (a ramp belongs to the phase it leads into).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

KINDS = ("steady", "burst", "feed", "discovery", "block")


@dataclass(frozen=True, slots=True)
class Phase:
    start: float
    end: float
    kind: str


def whole(duration: float, kind: str = "steady") -> tuple[Phase, ...]:
    return (Phase(0.0, float(duration), kind),)


def blocks(duration: float, block_s: float = 10.0, kind: str = "block") -> tuple[Phase, ...]:
    """Fixed stretches of `block_s` from 0; the last one ends at `duration` (it may be shorter)."""
    edges = np.append(np.arange(0.0, duration, block_s), duration)
    return tuple(Phase(float(a), float(b), kind) for a, b in zip(edges[:-1], edges[1:]))


def carve(phases: Sequence[Phase], marks: Iterable[tuple[float, float]], kind: str = "burst") -> tuple[Phase, ...]:
    """`phases` with each (start, end) of `marks` cut in as a phase of `kind`; the phases a mark
    overlaps are trimmed around it. Marks must not overlap each other."""
    if not phases:
        return ()
    lo, hi = phases[0].start, phases[-1].end
    cuts = sorted((max(float(a), lo), min(float(b), hi)) for a, b in marks)
    cuts = [(a, b) for a, b in cuts if b > a]
    out = [Phase(a, b, kind) for a, b in cuts]
    for p in phases:
        start = p.start
        for a, b in cuts:
            if b <= start or a >= p.end:
                continue
            if a > start:
                out.append(Phase(start, a, p.kind))
            start = max(start, b)
        if start < p.end:
            out.append(Phase(start, p.end, p.kind))
    return tuple(sorted(out, key=lambda p: p.start))


@dataclass(frozen=True, slots=True)
class Plateaus:
    """Phases of `phase_s` alternating between `kinds`, starting with the first; the level
    (e.g. the discovery share) of phase k is `levels[k % 2]`, reached by a linear ramp over the
    first `ramp_s` of every phase after the first."""

    phase_s: float
    ramp_s: float
    levels: tuple[float, float]
    kinds: tuple[str, str] = ("feed", "discovery")

    def level(self, t: np.ndarray) -> np.ndarray:
        t = np.maximum(np.asarray(t, np.float64), 0.0)
        k = np.floor(t / self.phase_s).astype(np.int64)
        here = np.where(k % 2 == 0, self.levels[0], self.levels[1])
        before = np.where(k % 2 == 0, self.levels[1], self.levels[0])
        into = t - k * self.phase_s
        frac = np.clip(into / self.ramp_s, 0.0, 1.0) if self.ramp_s > 0 else np.ones_like(t)
        frac = np.where(k == 0, 1.0, frac)
        return before + (here - before) * frac

    def phases(self, duration: float) -> tuple[Phase, ...]:
        edges = np.append(np.arange(0.0, duration, self.phase_s), duration)
        return tuple(Phase(float(a), float(b), self.kinds[k % 2])
                     for k, (a, b) in enumerate(zip(edges[:-1], edges[1:])))
