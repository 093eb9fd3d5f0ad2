"""The evaluation's tables, from its stored units.

Every headline is reported two ways: (i) full HELM (controller + HELM router) against static-best
with prefix-aware routing (the headline: a cache-aware deployment's best static split), with
static-best + least-loaded beside it; (ii) the controller against static-best under the *same*
(HELM) router, with the phase oracle's regret as the bound on what was possible. Burst
violations are counted over the provisioned bursts (`sim.bursts.provisioned`, judged on the
regime's static-best run under the HELM router), all bursts beside.
A reduction is 1 - P99 / baseline P99 per seed; a seed whose baseline is overloaded is marked and
left out of the mean (never the denominator of a headline).
"""
from __future__ import annotations

import numpy as np

from helmgr.experiments.evaluate import EvalConfig, Unit, static_best_ratio
from helmgr.experiments.phase_oracle import band_overlap, in_phase_band_distance, regret, window_figures
from helmgr.experiments.scenario import properties, summarize_check
from helmgr.sim.bursts import provisioned, violation_share
from helmgr.sim.config import TENANCIES

FULL = ("helm", "helm")
SYSTEM_BASELINES = (("static-best", "prefix-aware"), ("static-best", "least-loaded"))     # the headline's first
CONTROLLER = (("helm", "helm"), ("static-best", "helm"))
ROW_FIELDS = ("regime", "seed", "policy", "router", "ratio", "p99_ms", "window_slo_satisfaction", "slo_attainment",
              "throughput_rps", "utilization", "overloaded", "mean_ratio", "emb_hit_rate", "kv_hit_rate",
              "burst_violation_share", "burst_violation_share_provisioned", "mean_window_p99_ms", "oracle_distance", "band_distance", "band_distance_in_phase", "regret",
              "tail_wait_ms", "tail_service_ms", "tail_cold_share")      # what the P99 is made of (metrics.TAIL)


def rows(ev: EvalConfig, results: dict[Unit, object]) -> list[dict]:
    """One row per policy run, static-best and oracle, per regime and seed, with its figures
    against the phase oracle of its router where one ran."""
    by = {(u.kind, u.regime, u.seed, u.policy, u.router, u.ratio): r for u, r in results.items()}
    out = []
    for regime in ev.regimes:
        for seed in ev.seeds:
            oracles = {rt: by[("oracle", regime, seed, "oracle", rt, None)] for rt in ev.oracle_routers
                       if ("oracle", regime, seed, "oracle", rt, None) in by}
            found = [(by[("run", regime, seed, p, rt, None)], p, rt) for rt in ev.routers for p in ev.policies]
            for rt in ev.point_routers:
                runs = [by[("point", regime, seed, "static", rt, r)] for r in ev.grid]
                best = min(runs, key=lambda run: run.summary["p99_ms"])
                found.append(({"summary": best.summary, "window_ratio": None, "ratio": best.ratio}, "static-best", rt))
            found += [(o, "oracle", rt) for rt, o in oracles.items()]
            keep = _provisioned(found)
            for r, policy, router in found:
                row = {"regime": regime, "seed": seed} | r["summary"] | {"policy": policy, "router": router}
                if keep is not None and "burst_worst_p99_ms" in r["summary"]:
                    row["burst_violation_share_provisioned"] = violation_share(r["summary"], keep)
                if router in oracles:
                    row |= _figures(r, oracles[router], row)
                out.append({k: row.get(k) for k in ROW_FIELDS})
    return out


def _provisioned(found: list) -> list[bool] | None:
    """The bursts the cluster was provisioned for, judged on static-best under the HELM router
    (the reference the bursts' best split gives), or under the first sweep router; None where no
    stored run has the per-burst figures."""
    refs = [r for r, policy, router in found if policy == "static-best"]
    refs = [r for r, policy, router in found if policy == "static-best" and router == "helm"] or refs
    ref = refs[0]["summary"] if refs else {}
    return provisioned(ref) if "burst_peak_utilization" in ref else None


def _figures(run: dict, oracle: dict, row: dict) -> dict:
    ratio = run["window_ratio"]
    if ratio is None:                                     # static-best: its ratio held throughout
        ratio = np.full(len(oracle["r_star"]), run["ratio"])
    dist, band = window_figures(ratio, oracle["r_star"], oracle["band_lo"], oracle["band_hi"])
    keep = oracle.get("in_phase")                         # (absent from units stored before it existed)
    return {"oracle_distance": dist, "band_distance": band,
            "band_distance_in_phase": None if keep is None else in_phase_band_distance(
                ratio, oracle["band_lo"], oracle["band_hi"], keep),
            "regret": regret(row["p99_ms"], oracle["summary"]["p99_ms"])}


def _find(table: list[dict], regime: str, seed: int, pair: tuple[str, str]) -> dict | None:
    return next((r for r in table if r["regime"] == regime and r["seed"] == seed
                 and (r["policy"], r["router"]) == pair), None)


def headline(table: list[dict], ev: EvalConfig, pair: tuple[str, str], base: tuple[str, str]) -> list[dict]:
    """Per regime: `pair` against `base` over the seeds (means), the P99 reduction per seed."""
    out = []
    for regime in ev.regimes:
        got = [(_find(table, regime, s, pair), _find(table, regime, s, base), s) for s in ev.seeds]
        got = [(a, b, s) for a, b, s in got if a is not None and b is not None]
        if not got:
            continue
        fair = [(a, b) for a, b, _ in got if not b["overloaded"]]
        cut = [1 - a["p99_ms"] / b["p99_ms"] for a, b in fair]
        out.append({"regime": regime, "config": "{}@{}".format(*pair), "baseline": "{}@{}".format(*base),
                    "p99_ms": _mean(a["p99_ms"] for a, _, _ in got),
                    "baseline_p99_ms": _mean(b["p99_ms"] for _, b, _ in got),
                    "p99_reduction": _mean(cut), "p99_reduction_min": min(cut, default=None),
                    "p99_reduction_max": max(cut, default=None),
                    "window_slo": _mean(a["window_slo_satisfaction"] for a, _, _ in got),
                    "baseline_window_slo": _mean(b["window_slo_satisfaction"] for _, b, _ in got),
                    "throughput_ratio": _mean(a["throughput_rps"] / b["throughput_rps"] for a, b, _ in got),
                    "utilization": _mean(a["utilization"] for a, _, _ in got),
                    "baseline_utilization": _mean(b["utilization"] for _, b, _ in got),
                    "baseline_overloaded_seeds": [s for _, b, s in got if b["overloaded"]],
                    "overloaded_seeds": [s for a, _, s in got if a["overloaded"]],
                    "regret": _mean(a["regret"] for a, _, _ in got),
                    "band_distance": _mean(a["band_distance"] for a, _, _ in got),
                    "band_distance_in_phase": _mean(a.get("band_distance_in_phase") for a, _, _ in got),
                    "mean_window_p99_ms": _mean(a.get("mean_window_p99_ms") for a, _, _ in got),
                    "baseline_mean_window_p99_ms": _mean(b.get("mean_window_p99_ms") for _, b, _ in got),
                    "burst_violations_provisioned": _mean(a.get("burst_violation_share_provisioned") for a, _, _ in got),
                    "baseline_burst_violations_provisioned": _mean(b.get("burst_violation_share_provisioned")
                                                                   for _, b, _ in got),
                    "burst_violations": _mean(a.get("burst_violation_share") for a, _, _ in got),
                    "baseline_burst_violations": _mean(b.get("burst_violation_share") for _, b, _ in got),
                    "oracle_distance": _mean(a["oracle_distance"] for a, _, _ in got),
                    "seeds": len(got)})
    return out


def capacity_table(ev: EvalConfig, results: dict[Unit, object]) -> list[dict]:
    """Per regime and capacity pair: the lowest seed's capacity (the rate every seed sustains),
    each seed's, and the ratio to static-best + prefix-aware."""
    caps: dict[tuple, dict] = {}
    for u, b in results.items():
        if u.kind == "capacity":
            caps.setdefault((u.regime, u.policy, u.router), {})[u.seed] = b
    out = []
    for (regime, policy, router), per_seed in caps.items():
        values = [per_seed[s].capacity for s in ev.seeds if s in per_seed]
        out.append({"regime": regime, "config": f"{policy}@{router}",
                    "capacity_rps": None if None in values else min(values),
                    "per_seed": {str(s): per_seed[s].capacity for s in ev.seeds if s in per_seed},
                    "static_ratio": next((u.ratio for u in results if u.kind == "capacity" and u.regime == regime
                                          and (u.policy, u.router) == (policy, router)), None)})
    for row in out:
        ref = next((r for r in out if r["regime"] == row["regime"] and r["config"] == "static-best@prefix-aware"), None)
        ok = ref is not None and ref["capacity_rps"] and row["capacity_rps"] is not None
        row["vs_static_best_prefix_aware"] = row["capacity_rps"] / ref["capacity_rps"] if ok else None
    return out


def router_table(ev: EvalConfig, results: dict[Unit, object]) -> list[dict]:
    """Router against router at each static split (no controller in it): per regime and grid ratio,
    each sweep router's P99 (mean of the seeds) and, for the HELM router, its P99 against each
    other router's on the worst seed (`vs_<router>`, P99 / theirs - 1) and on how many seeds it is
    strictly below every other router (`below_all`). Empty without a HELM sweep and another."""
    if "helm" not in ev.point_routers or len(ev.point_routers) < 2:
        return []
    p99 = {(u.regime, u.seed, u.router, u.ratio): r.summary["p99_ms"] for u, r in results.items() if u.kind == "point"}
    others = [rt for rt in ev.point_routers if rt != "helm"]
    out = []
    for regime in ev.regimes:
        for ratio in ev.grid:
            seeds = [s for s in ev.seeds if all((regime, s, rt, ratio) in p99 for rt in ev.point_routers)]
            if not seeds:
                continue
            row = {"regime": regime, "ratio": ratio, "seeds": len(seeds)}
            row |= {rt: _mean(p99[(regime, s, rt, ratio)] for s in seeds) for rt in ev.point_routers}
            row |= {f"vs_{rt}": max(p99[(regime, s, "helm", ratio)] / p99[(regime, s, rt, ratio)] - 1 for s in seeds)
                    for rt in others}
            row["below_all"] = sum(all(p99[(regime, s, "helm", ratio)] < p99[(regime, s, rt, ratio)] for rt in others)
                                   for s in seeds)
            out.append(row)
    return out


def oracle_table(ev: EvalConfig, results: dict[Unit, object]) -> list[dict]:
    """The phase oracle's blocks after the warm-up (those that end after the metrics' warm-up,
    `SimConfig.metrics_warmup_s`), per regime, seed, router and phase kind: how far r* moves
    between them (`spread`, max - min), the ratios inside every block's band (`common_lo`..
    `common_hi`, the bands' intersection; None where empty), and the share of the blocks whose
    band holds static-best's split under that router (`static_best_in_band`; None without that
    router's sweep). On a stationary regime the first says how far the argmin wanders on a flat
    curve, the last two whether one split is within the band of every block."""
    points = {(u.regime, u.seed, u.router, u.ratio): r for u, r in results.items() if u.kind == "point"}
    out = []
    for u, r in results.items():
        if u.kind != "oracle":
            continue
        after = [b for b in r["blocks"] if b["end"] > ev.cluster.metrics_warmup_s(r["blocks"][-1]["end"])]
        swept = all((u.regime, u.seed, u.router, x) in points for x in ev.grid)
        split = static_best_ratio(points, u.regime, u.seed, u.router, ev.grid) if swept else None
        for kind in dict.fromkeys(b["kind"] for b in after):
            blocks = [b for b in after if b["kind"] == kind]
            stars = [b["r_star"] for b in blocks]
            common = band_overlap([b["band"] for b in blocks])
            held = (None if split is None else
                    sum(b["band"][0] <= split <= b["band"][1] for b in blocks) / len(blocks))
            out.append({"regime": u.regime, "seed": u.seed, "router": u.router, "kind": kind,
                        "blocks": len(blocks), "r_star_min": min(stars), "r_star_max": max(stars),
                        "spread": max(stars) - min(stars), "common_lo": common and common[0],
                        "common_hi": common and common[1], "static_best": split,
                        "static_best_in_band": held})
    out.sort(key=lambda row: (row["regime"], row["seed"], row["router"]))
    return out


def check_table(ev: EvalConfig, results: dict[Unit, object], s5: str = "whole") -> dict:
    """The scenario check (S1-S5) per regime, from the static points under the check's router."""
    points = {(u.regime, u.seed, u.ratio): r for u, r in results.items()
              if u.kind == "point" and u.router == ev.check_router}
    out = {}
    for regime in ev.regimes:
        per_seed = {s: properties([points[(regime, s, r)] for r in ev.grid], s5) for s in ev.seeds}
        out[regime] = {"seeds": {str(s): v for s, v in per_seed.items()}, "summary": summarize_check(per_seed)}
    return out


def _mean(values) -> float | None:
    v = [x for x in values if x is not None and np.isfinite(x)]
    return float(np.mean(v)) if v else None


def tenancy_table(ev: EvalConfig, results: dict[Unit, object]) -> list[dict]:
    """The multi-tenant section: per regime, load and tenancy, over the seeds, each class's P99
    (mean) and window SLO satisfaction (the worst seed's), the total goodput, shed and Jain's
    index over normalised service (means), the largest service gap between tenants of a band
    (the worst seed's); on a regime with bursts, the worst window SLO satisfaction in the bursts'
    windows of any tenant but the noisy ones; and `unaccounted`, requests neither completed nor
    shed (0)."""
    runs: dict[tuple, list[dict]] = {}
    quiet: list[str] = []
    for u, r in results.items():
        if u.kind == "tenancy":
            runs.setdefault((u.regime, u.load, u.payload[1].tenancy), []).append(r["summary"])
            quiet = [t.name for t in u.payload[1].classes.tenants if not t.bursts]
    out = []
    for (regime, load, tenancy), found in sorted(runs.items(), key=lambda kv: (
            ev.regimes.index(kv[0][0]), kv[0][1], TENANCIES.index(kv[0][2]))):
        row = {"regime": regime, "load": load, "rps": ev.class_rps(regime, load), "tenancy": tenancy,
               "seeds": len(found)}
        for c in found[0]["classes"]:
            row[f"{c}_p99_ms"] = _mean(s["classes"][c]["p99_ms"] for s in found)
            row[f"{c}_window_slo"] = _worst(s["classes"][c]["window_slo_satisfaction"] for s in found)
        row["goodput_rps"] = _mean(sum(c["goodput_rps"] for c in s["classes"].values()) for s in found)
        row["shed"] = _mean(s["shed"] for s in found)
        row["jain"] = _mean(s["fairness"]["jain"] for s in found)
        row["max_gap_s"] = _most(s["fairness"].get("max_gap_s") for s in found)
        row["others_burst_window_slo"] = _worst(s["tenants"][t].get("burst_window_slo_satisfaction")
                                                for s in found for t in quiet)
        row["unaccounted"] = sum(g["requests"] - g["completed"] - g["shed"] for s in found
                                 for g in [s] + list(s["classes"].values()) + list(s["tenants"].values()))
        out.append(row)
    return out


def class_capacity_table(ev: EvalConfig, results: dict[Unit, object]) -> list[dict]:
    """Capacity at SLO per class: per regime and tenancy, the lowest seed's capacity (the highest
    rate at which every class kept its window SLO), each seed's, the class that failed first
    above it (at the lowest failing rate, the worst seed's), and the ratio to `blind`'s."""
    caps: dict[tuple, dict] = {}
    for u, b in results.items():
        if u.kind == "class-capacity":
            caps.setdefault((u.regime, u.payload.cfg.tenancy), {})[u.seed] = b
    out = []
    for (regime, tenancy), per_seed in sorted(caps.items(), key=lambda kv: (ev.regimes.index(kv[0][0]),
                                                                           TENANCIES.index(kv[0][1]))):
        values = [b.capacity for b in per_seed.values()]
        fails = [p for b in per_seed.values() for p in b.probes if not p.passed and p.rate == b.fails_at]
        out.append({"regime": regime, "tenancy": tenancy, "capacity_rps": None if None in values else min(values),
                    "per_seed": {str(s): b.capacity for s, b in sorted(per_seed.items())},
                    "binding_class": min(fails, key=lambda p: p.satisfaction if p.satisfaction is not None else -1.0
                                         ).worst_class if fails else None})
    for row in out:
        ref = next((r for r in out if r["regime"] == row["regime"] and r["tenancy"] == "blind"), None)
        ok = ref is not None and ref["capacity_rps"] and row["capacity_rps"] is not None
        row["vs_blind"] = row["capacity_rps"] / ref["capacity_rps"] if ok else None
    return out


def _worst(values) -> float | None:
    v = [x for x in values if x is not None and np.isfinite(x)]
    return float(min(v)) if v else None


def _most(values) -> float | None:
    v = [x for x in values if x is not None and np.isfinite(x)]
    return float(max(v)) if v else None
