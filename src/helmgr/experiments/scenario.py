"""The scenario check (S1-S5): does a scenario pose the question HELM answers?

For one regime and seed, every static ratio of a grid is run once; each run is cut by the
workload's phases (`Workload.phases`). A regime has a *base* phase kind (steady stretches, or
trend's feed plateaus) and a *stress* kind (bursts, or trend's discovery plateaus):

| | property | measured as |
|---|---|---|
| S1 | a trade-off exists | worst ratio's whole-run P99 / best ratio's >= 1.3 |
| S2 | the optimum moves | |best ratio of the base phases - best of the stress phases| >= 0.2 |
| S3 | feasible at the right split | at each kind's best ratio: its windows meet the SLO >= 95 %, peak utilization <= 0.85; |
|    |                             | stress phases counted where provisioned (their peak <= 0.85 there), the others reported |
| S4 | infeasible at the wrong split | at the base's best, >= 40 % of stress phases violate the SLO; at the stress's best, |
|    |                               | the base P99 >= 1.15 x its best |
| S5 | something to win | the best single ratio's P99 >= 1.3 x the phase-best stitch's, or its window SLO |
|    |                  | satisfaction >= 5 points lower |

S1-S3 are the gate: a scenario that fails one does not pose the question. S4 and S5 are
reported, not gated: once stress phases hold more than ~1 % of the requests a run's P99 is
theirs, so the best single split is the stress optimum and S5's whole-run ratio stays near 1
(docs/tradeoff.md's frontier) — they measure how much an adaptive split could win.

A stress phase (a burst, a discovery plateau) is *provisioned* when, at its kind's best ratio,
its peak utilization is at most 0.85: the load the cluster was provisioned for. Beyond it no split
rides the phase, and its windows measure the load, not the split; S3 counts the provisioned ones
and reports the rest apart.

A kind's P99 pools the latencies of every request that arrived in a phase of that kind (after the
warm-up), from a log-binned histogram (bins 0.5 % wide). The *phase-best stitch* takes each phase's
requests and windows from the run at its kind's best ratio: the phase oracle (docs/concepts.md) without the
cost of moving between ratios, so S5 here is an upper estimate of what an adaptive split can win.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from helmgr.sim import SimConfig, simulate
from helmgr.sim.bursts import PROVISIONED_PEAK, rolling_peak, window_load_series
from helmgr.sim.metrics import slim, window_stats
from helmgr.workload import WorkloadSpec

BINS = np.geomspace(1e-5, 1e3, 4001)              # seconds; 0.46 % a bin
THRESHOLDS = {"S1": 1.3, "S2": 0.2, "S3": 0.95, "S3_utilization": PROVISIONED_PEAK, "S4": 0.4, "S4_base": 1.15, "S5": 1.3,
              "S5_points": 0.05}
GATE = ("S1", "S2", "S3")                         # a scenario passes on these; S4 and S5 are reported
KINDS = {"burst": ("steady", "burst"), "trend": ("feed", "discovery")}   # base, stress


def kinds_of(phase_kinds: set[str]) -> tuple[str, str] | None:
    """(base, stress) phase kinds of a workload, or None when it has one kind of phase (steady)."""
    for base, stress in KINDS.values():
        if base in phase_kinds and stress in phase_kinds:
            return base, stress
    return None


def hist_quantile(hist: np.ndarray, q: float) -> float:
    """The q-quantile of latencies binned in BINS (the bin's geometric middle); NaN if empty."""
    n = hist.sum()
    if n == 0:
        return float("nan")
    k = int(np.searchsorted(np.cumsum(hist), q * n))
    return float(np.sqrt(BINS[k] * BINS[k + 1]))


@dataclass(frozen=True)
class PhaseRun:
    """One static run cut by phases: per phase its latency histogram, its windows' P99 and
    utilization; the run's summary."""

    ratio: float
    summary: dict
    kinds: list[str]                 # per phase
    hists: np.ndarray                # phases x bins
    window_phase: np.ndarray         # per window: its phase (-1 before the warm-up)
    window_p99_s: np.ndarray
    window_load: np.ndarray          # the nodes' mean busier-engine share
    slo_s: float


def phase_point(args: tuple[WorkloadSpec, SimConfig]) -> PhaseRun:
    """One run of the check (in a worker: it builds its own workload)."""
    spec, cfg = args
    w = spec.build()
    result = simulate(cfg, w)
    rec, summary = result.cluster.rec, result.summary
    arrival = np.asarray(rec.arrival)
    latency = np.asarray(rec.end) - arrival
    warm = summary["warmup_s"]
    phases = list(w.phases)
    starts = np.array([p.start for p in phases])
    which = np.searchsorted(starts, arrival, side="right") - 1
    keep = arrival >= warm
    hists = np.zeros((len(phases), len(BINS) - 1), np.int64)
    bins = np.clip(np.searchsorted(BINS, latency[keep], side="right") - 1, 0, len(BINS) - 2)
    np.add.at(hists, (which[keep], bins), 1)
    win_start, p99, _, _ = window_stats(arrival, latency, cfg.window_s, w.duration_s)
    mid = win_start + cfg.window_s / 2
    window_phase = np.where(win_start >= warm - 1e-9, np.searchsorted(starts, mid, side="right") - 1, -1)
    load = window_load_series(rec.window_t, rec.window_loads, cfg.window_s, len(win_start))
    return PhaseRun(cfg.ratio, slim(summary), [p.kind for p in phases], hists, window_phase, p99, load,
                    summary["slo_ms"] / 1e3)


def check_tasks(spec: WorkloadSpec, cfg: SimConfig, ratios) -> tuple[list, list[str]]:
    return ([(spec, replace(cfg, ratio=float(r), policy="static")) for r in ratios],
            [f"{spec.regime} seed {spec.seed} ratio {r:g}" for r in ratios])


def _prop(value, threshold, passed, **extra) -> dict:
    value = None if value is None or (isinstance(value, float) and not np.isfinite(value)) else float(value)
    return {"value": value, "threshold": threshold, "pass": bool(passed) if value is not None else False} | extra


def _gate(out: dict) -> dict:
    """Mark each property gated (S1-S3) or reported (S4, S5)."""
    for name in ("S1", "S2", "S3", "S4", "S5"):
        if name in out:
            out[name]["gated"] = name in GATE
    return out


S5_MEASURES = ("whole", "per-phase")


def properties(runs: list[PhaseRun], s5: str = "whole") -> dict:
    """S1-S5 of one regime and seed from its static runs (one per ratio). With `s5="per-phase"`,
    S5 is instead the worst phase kind's P99 at the single best ratio over that kind's best P99 (what
    following the phases wins where it is won, not diluted into the run's P99); both are reported."""
    runs = sorted(runs, key=lambda r: r.ratio)
    ratios = np.array([r.ratio for r in runs])
    p99 = np.array([r.summary["p99_ms"] for r in runs], float)
    out: dict = {"ratios": ratios.tolist(), "p99_ms": p99.tolist(),
                 "utilization": [r.summary["utilization"] for r in runs],
                 "overloaded": [r.summary["overloaded"] for r in runs], "slo_ms": runs[0].slo_s * 1e3}
    finite = np.isfinite(p99)
    best = int(np.nanargmin(np.where(finite, p99, np.nan))) if finite.any() else None
    worst_over_best = float(np.nanmax(p99) / p99[best]) if best is not None else None
    out["S1"] = _prop(worst_over_best, THRESHOLDS["S1"], worst_over_best is not None and worst_over_best >= 1.3,
                      best_ratio=None if best is None else float(ratios[best]))
    kinds = kinds_of(set(runs[0].kinds))
    if kinds is None:
        return _gate(out)
    base, stress = kinds
    kind_arr = np.array(runs[0].kinds)
    by_kind = {k: np.array([hist_quantile(r.hists[kind_arr == k].sum(axis=0), 0.99) for r in runs]) for k in kinds}
    out["p99_ms_by_kind"] = {k: (v * 1e3).tolist() for k, v in by_kind.items()}
    bi = {k: int(np.nanargmin(v)) if np.isfinite(v).any() else None for k, v in by_kind.items()}
    if bi[base] is None or bi[stress] is None:
        for s in ("S2", "S3", "S4", "S5"):
            out[s] = _prop(None, THRESHOLDS[s], False, why=f"no {base} or {stress} request measured")
        return _gate(out)
    best_ratio = {k: float(ratios[i]) for k, i in bi.items()}
    out["best_ratio_by_kind"] = best_ratio
    move = abs(best_ratio[base] - best_ratio[stress])
    out["S2"] = _prop(move, THRESHOLDS["S2"], move >= 0.2 - 1e-9, **{f"{k}_best": v for k, v in best_ratio.items()})
    out["S3"] = _s3(runs, bi, kind_arr, stress)
    # S4: the base's best split fails the stress phases; the stress's best split costs the base phases
    r = runs[bi[base]]
    stress_phases = np.flatnonzero(kind_arr == stress)
    violated = [bool(np.any(r.window_p99_s[(r.window_phase == p) & np.isfinite(r.window_p99_s)] > r.slo_s))
                for p in stress_phases if np.any((r.window_phase == p) & np.isfinite(r.window_p99_s))]
    share = float(np.mean(violated)) if violated else float("nan")
    cost = float(by_kind[base][bi[stress]] / by_kind[base][bi[base]])
    out["S4"] = _prop(share, THRESHOLDS["S4"], share >= 0.4 and cost >= 1.15, base_cost=cost,
                      base_cost_threshold=THRESHOLDS["S4_base"], stress_phases=len(violated))
    # S5: the best single ratio against the phase-best stitch
    stitch = sum(runs[bi[k]].hists[kind_arr == k].sum(axis=0) for k in kinds)
    other = ~np.isin(kind_arr, kinds)                       # phases of neither kind: from the single best
    if other.any() and best is not None:
        stitch = stitch + runs[best].hists[other].sum(axis=0)
    stitch_p99 = hist_quantile(stitch, 0.99)
    single = runs[best]
    single_p99 = hist_quantile(single.hists.sum(axis=0), 0.99)
    sat_single = _window_share(single, np.ones(len(kind_arr), bool))
    sat_stitch = _stitched_share(runs, bi, kind_arr, best)
    gain = single_p99 / stitch_p99
    points = sat_stitch - sat_single
    per_phase = max(float(by_kind[k][best] / by_kind[k][bi[k]]) for k in kinds)
    whole = _prop(gain, THRESHOLDS["S5"], gain >= 1.3 or points >= 0.05 - 1e-12, stitch_p99_ms=stitch_p99 * 1e3,
                  single_best_p99_ms=single_p99 * 1e3, single_best_ratio=float(ratios[best]),
                  window_slo_single=sat_single, window_slo_stitch=sat_stitch, points=points, measure="whole",
                  per_phase=per_phase)
    out["S5"] = whole if s5 == "whole" else _prop(per_phase, THRESHOLDS["S5"], per_phase >= 1.3, measure="per-phase",
                                                  whole=gain, single_best_ratio=float(ratios[best]))
    return _gate(out)


def _s3(runs: list[PhaseRun], bi: dict, kind_arr: np.ndarray, stress: str) -> dict:
    """S3: at each kind's best ratio, its windows meet the SLO and its peak utilization is in
    bounds; the stress kind's phases counted where provisioned (peak <= 0.85), the others reported
    apart (`beyond_provisioned`)."""
    limit = THRESHOLDS["S3_utilization"]
    s3 = {}
    for k, i in bi.items():
        r = runs[i]
        masks = [m for m in ((r.window_phase == p) for p in np.flatnonzero(kind_arr == k)) if m.any()]
        peaks = [_peak(r.window_load, m) for m in masks]
        kept = [m for m, pk in zip(masks, peaks) if k != stress or pk <= limit]
        beyond = [m for m, pk in zip(masks, peaks) if k == stress and not pk <= limit]
        s3[k] = {"window_slo": _share(r, kept), "peak_utilization": max([pk for pk in peaks if k != stress
                                                                         or pk <= limit], default=float("nan")),
                 "phases": len(kept), "beyond_provisioned": len(beyond), "beyond_window_slo": _share(r, beyond)}
    worst_share = min(v["window_slo"] for v in s3.values())
    peak = max(v["peak_utilization"] for v in s3.values())
    return _prop(worst_share, THRESHOLDS["S3"], worst_share >= 0.95 and peak <= limit, peak_utilization=peak,
                 utilization_threshold=limit, by_kind=s3)


def _share(run: PhaseRun, masks: list) -> float:
    """Window SLO satisfaction over the windows of `masks` (NaN with none)."""
    mask = np.logical_or.reduce(masks) & np.isfinite(run.window_p99_s) if masks else None
    return float(np.mean(run.window_p99_s[mask] <= run.slo_s)) if mask is not None and mask.any() else float("nan")


def _peak(load: np.ndarray, mask: np.ndarray) -> float:
    """The peak utilization (metrics.rolling_peak) inside each contiguous run of `mask`; the largest."""
    idx = np.flatnonzero(mask & np.isfinite(load))
    if not len(idx):
        return float("nan")
    return max(rolling_peak(load[g]) for g in np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1))


def _window_share(run: PhaseRun, phases: np.ndarray) -> float:
    mask = (run.window_phase >= 0) & np.isfinite(run.window_p99_s)
    mask &= phases[np.maximum(run.window_phase, 0)]
    return float(np.mean(run.window_p99_s[mask] <= run.slo_s)) if mask.any() else float("nan")


def _stitched_share(runs, bi, kind_arr, best) -> float:
    """Window SLO satisfaction when each window comes from the run at its phase kind's best ratio."""
    ref = runs[best]
    p99 = ref.window_p99_s.copy()
    for k, i in bi.items():
        in_kind = (ref.window_phase >= 0) & np.isin(ref.window_phase, np.flatnonzero(kind_arr == k))
        p99[in_kind] = runs[i].window_p99_s[in_kind]
    mask = (ref.window_phase >= 0) & np.isfinite(p99)
    return float(np.mean(p99[mask] <= ref.slo_s)) if mask.any() else float("nan")


def summarize_check(per_seed: dict[int, dict]) -> dict:
    """Per property: the value of each seed, whether every seed passes, and whether it is gated."""
    names = [s for s in ("S1", "S2", "S3", "S4", "S5") if all(s in v for v in per_seed.values())]
    return {s: {"values": {str(seed): v[s]["value"] for seed, v in per_seed.items()},
                "threshold": next(iter(per_seed.values()))[s]["threshold"],
                "pass": all(v[s]["pass"] for v in per_seed.values()), "gated": s in GATE} for s in names}


def scenario_check(specs: list[WorkloadSpec], cfg: SimConfig, ratios, jobs: int = 1, ray_address: str | None = None,
                   on_done=None, s5: str = "whole") -> dict:
    """S1-S5 for each workload spec (a regime and a seed): every ratio of the grid run once
    (experiments.parallel), the properties per spec, and per regime over its seeds. `pass`: every
    gated property (S1-S3) passes on every seed."""
    from helmgr.experiments.parallel import run_all
    tasks, names = [], []
    for spec in specs:
        t, n = check_tasks(spec, cfg, ratios)
        tasks += t
        names += n
    runs = run_all(phase_point, tasks, jobs, ray_address, names, on_done and (lambda _: on_done()))
    per: dict[str, dict[int, dict]] = {}
    for k, spec in enumerate(specs):
        chunk = runs[k * len(ratios):(k + 1) * len(ratios)]
        per.setdefault(spec.regime, {})[spec.seed] = properties(chunk, s5)
    regimes = {regime: {"seeds": {str(s): v for s, v in seeds.items()}, "summary": summarize_check(seeds)}
               for regime, seeds in per.items()}
    return {"ratios": [float(r) for r in ratios], "regimes": regimes, "s5": s5,
            "pass": all(p["pass"] for r in regimes.values() for p in r["summary"].values() if p["gated"])}
