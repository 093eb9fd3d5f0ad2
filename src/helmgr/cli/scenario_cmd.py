"""`helmgr scenario --check`: the scenario check S1-S5 (docs/concepts.md) on a scenario's regimes and seeds."""
from __future__ import annotations

import os

import click
from rich.table import Table

from helmgr.cli.output import check_out, emit_json, json_option, json_text, out_option, progress, result_dir, stdout
from helmgr.cli.simulate_cmd import build_config, sim_options
from helmgr.cli.types import POSITIVE, allow_large_option, names, parallel_options, ratio_grid, seed_list, spec_costs
from helmgr.core.errors import HelmInputError
from helmgr.core.validate import LIMITS, Cost, check_costs
from helmgr.experiments.evaluate import DEFAULT_GRID
from helmgr.experiments.scenario import S5_MEASURES, scenario_check
from helmgr.cli.workload_cmd import cluster_defaults
from helmgr.workload import REGIMES, WorkloadSpec, default_config

PROPERTIES = ("S1", "S2", "S3", "S4", "S5")


@click.command("scenario")
@click.option("--check", is_flag=True, required=True, help="Run the scenario check (the command's one action).")
@click.option("--workloads", default="steady,burst,trend", show_default=True,
              help="Comma list of regimes to check (S1 only for one without phases of two kinds).")
@click.option("--seeds", default="1,2,3", show_default=True, help="Comma list of workload seeds.")
@click.option("--duration", type=POSITIVE, default=None, help="Simulated seconds [default: 360].")
@click.option("--rps", type=POSITIVE, default=None, help="Base request rate [default: the regime's, 1,300; trend 2,200].")
@click.option("--time-compression", type=POSITIVE, default=None, metavar="F",
              help="Each regime's whole shape (run, phases, bursts, day) F times shorter.")
@sim_options
@click.option("--ratios", default=",".join(f"{r:g}" for r in DEFAULT_GRID), show_default=True,
              help="Static ratios: start:stop:step or a list (default: evaluate's grid, r_min to r_max).")
@click.option("--s5", type=click.Choice(S5_MEASURES), default="whole", show_default=True,
              help="S5 on the whole run (its P99 and windows), or per phase kind (the worst kind's "
                   "P99 at the single best ratio over its own best; docs/tradeoff.md says why).")
@parallel_options
@json_option
@out_option
@allow_large_option
@cluster_defaults
def scenario_cmd(check, workloads, seeds, duration, rps, time_compression, nodes, policy, ratio, router, hardware, model,
                 slo_ms, refill, faults, tick_ms, refresh_s, max_batch, engine, sim_path, emb_sample, ratios, s5, jobs, ray_address,
                 as_json, out_dir, allow_large):
    """Does the scenario pose the question? S1-S5 (docs/concepts.md) per regime and seed, from static sweeps
    cut by the workload's phases; pass/fail, plots with --out.

    \b
    helmgr scenario --check --workloads burst,trend --seeds 1,2,3 --out results/scenario
    helmgr scenario --check --workloads burst --seeds 1 --json
    """
    check_out(out_dir)
    regimes = names(workloads, REGIMES, "workloads")
    seed_values = seed_list(seeds)
    grid = ratio_grid(ratios)
    if len(grid) < 2:
        raise HelmInputError(f"--ratios {ratios!r}: the check needs at least two ratios")
    cfg = build_config(nodes, "static", grid[0], router, hardware, model, slo_ms, refill, faults, tick_ms, refresh_s,
                       max_batch, 0, engine, sim_path, emb_sample)
    specs = [WorkloadSpec(r, duration, s, rps, time_compression=time_compression) for r in regimes for s in seed_values]
    costs = [c for w in specs[::len(seed_values)]                                       # each regime's run
             for c in spec_costs(w, nodes, f"{w.regime}: ", tick_ms=tick_ms, refresh_s=refresh_s)]
    costs.append(Cost("runs", len(specs) * len(grid), LIMITS.runs,
                      f"--workloads {workloads!r} x --seeds {seeds!r} x --ratios {ratios!r}"))
    check_costs(costs, allow_large)
    first = specs[0].build()                           # validates the workload options up front
    with progress("checking", len(specs) * len(grid)) as bar:
        task = bar.add_task(f"scenario check: {len(specs)} workloads x {len(grid)} ratios",
                            total=len(specs) * len(grid))
        result = scenario_check(specs, cfg, grid, jobs or os.cpu_count() or 1, ray_address,
                                lambda: bar.advance(task), s5)
    result = {"nodes": nodes, "engine": engine, "max_batch": max_batch, "router": router,
              "hardware": hardware, "model": model, "rps": {r: rps or default_config(r).rps for r in regimes},
              "duration_s": first.duration_s} | result
    some = next(iter(result["regimes"].values()))
    result["slo_ms"] = next(iter(some["seeds"].values()))["slo_ms"]
    with result_dir(out_dir) as scratch:
        if scratch is not None:
            from helmgr.experiments.plots import plot_scenario
            (scratch / "scenario.json").write_text(json_text(result))
            pngs = plot_scenario(result, scratch)
            (scratch / "scenario.md").write_text(_markdown(result, pngs))
    if as_json:
        emit_json(result)
        return
    for regime, r in result["regimes"].items():
        t = Table(title=f"scenario check / {regime}: " + ("PASS" if all(p["pass"] for p in r["summary"].values())
                                                              else "FAIL"))
        t.add_column("property")
        for s in r["seeds"]:
            t.add_column(f"seed {s}", justify="right")
        t.add_column("threshold", justify="right")
        t.add_column("pass")
        for name, p in r["summary"].items():
            t.add_row(name, *(_fmt(v) for v in p["values"].values()), _fmt(p["threshold"]), "yes" if p["pass"] else "no")
        stdout.print(t)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3g}"


def _markdown(result: dict, pngs: list[str]) -> str:
    lines = ["# Scenario check", "",
             f"{result['nodes']} nodes, engine {result['engine']} (batches of up to {result['max_batch']}), "
             f"{result['router']} routing, {result['hardware']} + {result['model']}, base rate "
             + ", ".join(f"{r} {v:g}" for r, v in result["rps"].items()) + " req/s, "
             f"{result['duration_s']:g} s; ratios {', '.join(f'{r:g}' for r in result['ratios'])}.", ""]
    for regime, r in result["regimes"].items():
        seeds = list(r["seeds"])
        lines += [f"## {regime}", "", "| property | " + " | ".join(f"seed {s}" for s in seeds) + " | threshold | pass |",
                  "|---|" + "---:|" * len(seeds) + "---:|---|"]
        for name, p in r["summary"].items():
            lines.append(f"| {name} | " + " | ".join(_fmt(v) for v in p["values"].values())
                         + f" | {_fmt(p['threshold'])} | {'yes' if p['pass'] else 'no'} |")
        lines.append("")
    return "\n".join(lines + [f"![{p}]({p})" for p in pngs]) + "\n"
