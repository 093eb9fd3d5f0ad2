"""The report of `helmgr evaluate` as Markdown (evaluate.md): every table the evaluation assembles,
with what each column means, the plots and every figure's command."""
from __future__ import annotations

HEAD = ("regime", "config", "baseline", "p99_ms", "baseline_p99_ms", "p99_reduction", "mean_window_p99_ms",
        "baseline_mean_window_p99_ms", "window_slo", "baseline_window_slo", "burst_violations_provisioned",
        "baseline_burst_violations_provisioned", "burst_violations", "baseline_burst_violations", "throughput_ratio",
        "utilization", "baseline_utilization")
CTRL = HEAD[:7] + ("window_slo", "regret", "band_distance", "band_distance_in_phase", "oracle_distance")
CAP = ("regime", "config", "capacity_rps", "vs_static_best_prefix_aware", "static_ratio")
CLASS_CAP = ("regime", "tenancy", "capacity_rps", "vs_blind", "binding_class")
BLOCKS = ("regime", "seed", "router", "kind", "blocks", "r_star_min", "r_star_max", "spread", "common_lo", "common_hi",
          "static_best", "static_best_in_band")
ROWS = ("regime", "seed", "policy", "router", "ratio", "p99_ms", "tail_wait_ms", "tail_service_ms", "tail_cold_share",
        "mean_window_p99_ms", "window_slo_satisfaction", "utilization", "overloaded", "mean_ratio",
        "burst_violation_share_provisioned", "burst_violation_share", "oracle_distance", "band_distance", "band_distance_in_phase", "regret")


def fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return ",".join(map(str, v)) or "—"
    return str(v)


def _md_table(rows: list[dict], cols) -> list[str]:
    return (["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            + ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows] + [""])


def _overload_note(rows: list[dict]) -> list[str]:
    marks = [f"{r['regime']}: {r['baseline']} overloaded on seeds {fmt(r['baseline_overloaded_seeds'])}"
             for r in rows if r["baseline_overloaded_seeds"]]
    marks += [f"{r['regime']}: {r['config']} overloaded on seeds {fmt(r['overloaded_seeds'])}"
              for r in rows if r["overloaded_seeds"]]
    return ([("Overloaded (left out of the reduction): " + "; ".join(marks)), ""] if marks else [])


def _beaten(rows: list[dict]) -> list[str]:
    """A warning where a run beats the phase oracle by more than 1 %: there the oracle's r* is not
    the optimum (docs/evaluation.md: its blocks are judged alone; --oracle-lookahead)."""
    beaten = [f"{r['regime']} seed {r['seed']}: {r['policy']}@{r['router']} {r['regret']:+.1%}" for r in rows
              if r["regret"] is not None and r["regret"] < -0.01]
    return ([f"**The oracle is beaten** (regret < -1 %) — {'; '.join(beaten)}: there its r* is not the optimum "
             "and its distances mean little (docs/evaluation.md, the oracle's lookahead).", ""] if beaten else [])


def markdown(result: dict, pngs: list[str]) -> str:
    c = result["config"]
    lines = ["# Evaluation", ""] + first_look(c) + [
             f"`{result['command']}` — {result['wall_s']:.0f} s wall ({result['ran']} units run, {result['kept']} kept"
             + (f"; {result['cpu_s']:.0f} worker-seconds in its units, the serial time" if result.get("cpu_s") else "")
             + "). "
             f"{c['cluster']['nodes']} nodes, {c['cluster']['hardware']} + {c['cluster']['model']}, "
             + (f"base rates x {c['rate_scale']:g}, " if c.get("rate_scale", 1.0) != 1.0 else "") + "seeds "
             f"{', '.join(map(str, c['seeds']))}, grid {', '.join(f'{r:g}' for r in c['grid'])}, "
             f"runs of {', '.join(f'{d:g}' for d in sorted(set(result['duration_s'].values())))} s. A reduction is 1 - P99 / the baseline's, per seed, "
             "then the mean; a baseline in overload is never its denominator. Burst violations: the share of "
             "provisioned bursts (peak utilization <= 0.85 at static-best under the HELM router) with a window "
             "over the SLO; all bursts beside. Band distance in phase leaves out the blocks whose lookahead "
             "leaves their phase kind and the 20 s after each phase change; trend is judged by P99 and mean "
             "window P99.", "",
             "## Full HELM against static-best + prefix-aware (the headline), static-best + least-loaded beside", ""]
    lines += _md_table(result["system"], HEAD) + _overload_note(result["system"])
    lines += ["## The controller against static-best under the HELM router (the phase oracle's regret beside it)", ""]
    lines += _md_table(result["controller"], CTRL) + _overload_note(result["controller"]) + _beaten(result["rows"])
    if result["capacity"]:
        lines += ["## Capacity at SLO (the lowest seed's; req/s)", "",
                  f"Window SLO satisfaction >= 95 %, bisection to {c['capacity_tol']:g}, "
                  + (f"{c['capacity_duration_s']:g}-s probes" if c["capacity_duration_s"] else "probes as long as the runs")
                  + "; static-best is held "
                  "at the ratio best at the base rate.", ""]
        lines += _md_table(result["capacity"], CAP)
    lines += _router_lines(result["routers"])
    if result.get("oracle_blocks"):
        lines += ["## The phase oracle's blocks after the warm-up", "",
                  "Per phase kind: r* across the blocks (`spread`: max - min), the ratios inside every block's "
                  "band (within 2 % of its fitted minimum; `common_lo`-`common_hi`, — where no ratio is), and "
                  "the share of blocks whose band holds static-best's split under that router.", ""]
        lines += _md_table(result["oracle_blocks"], BLOCKS)
    if result.get("tenancy"):
        lines += ["## Tenants and SLO classes: full HELM under each tenancy", "",
                  f"Class table `{c['classes']}`; each class's P99 (ms, the mean of the seeds) and window SLO "
                  "satisfaction against its own target (the worst seed's); goodput, shed and Jain's index over "
                  "the tenants' normalised service, the means; `max_gap_s`: the longest a tenant with a request "
                  "queued at a node went unserved "
                  "after another tenant of its band was served (the worst seed's); `others_burst_window_slo`: the worst window SLO satisfaction of a tenant other than "
                  "the noisy one in the windows of the bursts; `unaccounted`: requests neither completed nor "
                  "shed, over the runs, classes and tenants.", ""]
        lines += _md_table(result["tenancy"], list(result["tenancy"][0]))
    if result.get("class_capacity"):
        lines += ["Capacity at SLO per class (req/s, the lowest seed's): the highest base rate at which every class "
                  "keeps window SLO satisfaction >= 95 %; `binding_class`: the class that failed first above it.", ""]
        lines += _md_table(result["class_capacity"], CLASS_CAP)
    lines += ["## Scenario check (S1-S3 gated, S4-S5 reported)", "", "| regime | property | " + " | ".join(
        f"seed {s}" for s in c["seeds"]) + " | threshold | pass | gated |",
        "|---|---|" + "---:|" * len(c["seeds"]) + "---:|---|---|"]
    for regime, r in result["scenario_check"].items():
        for name, p in r["summary"].items():
            lines.append(f"| {regime} | {name} | " + " | ".join(fmt(v) for v in p["values"].values())
                         + f" | {fmt(p['threshold'])} | {fmt(p['pass'])} | {fmt(p.get('gated'))} |")
    lines += ["", "## Every run", ""] + _md_table(result["rows"], ROWS)
    lines += [f"![{p}]({p})" for p in pngs] + ["", "## Commands (each figure's)", ""]
    lines += [f"- {name}: `{cmd}`" for name, cmd in result["commands"].items()]
    return "\n".join(lines) + "\n"


def first_look(c: dict) -> list[str]:
    """What an evaluation of one seed cannot show: a difference within a run's own noise."""
    if len(c["seeds"]) > 1:
        return []
    return ["**A first look, one seed:** a 360-s run's P99 moves with its luck alone by 1-2 % on steady, "
            "4-10 % on trend and 4-19 % on burst (docs/results/2026-12-05-p99-noise-floor.md): a difference "
            "smaller than that, here, is not a finding. The full evaluation (three seeds, the whole grid) is.", ""]


def _router_lines(rows: list[dict]) -> list[str]:
    """The routers at each static split: the table, and how often the HELM router is below them all."""
    if not rows:
        return []
    others = [k[3:] for k in rows[0] if k.startswith("vs_")]
    cols = ("regime", "ratio", "helm", *others, *(f"vs_{rt}" for rt in others), "below_all")
    below, points = sum(r["below_all"] for r in rows), sum(r["seeds"] for r in rows)
    worst = {rt: max(rows, key=lambda r: r[f"vs_{rt}"]) for rt in others}
    lines = ["## Routers at each static split", "",
             "P99 in ms, the mean of the seeds; `vs_R` is the HELM router's P99 against router R's on the worst "
             "seed (P99 / R's - 1); `below_all` counts the seeds where it is strictly below every other router. "
             f"It is below them all at {below} of {points} (split, seed) points; its worst against "
             + ", ".join(f"{rt} is {100 * w[f'vs_{rt}']:+.1f} % ({w['regime']}, {w['ratio']:g})" for rt, w in worst.items())
             + ".", ""]
    return lines + _md_table(rows, cols)
