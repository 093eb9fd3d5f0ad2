"""`helmgr evaluate`: the published table in one command (docs/evaluation.md), resumable."""
from __future__ import annotations

import functools
import os
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import click
from click.core import ParameterSource
from rich.table import Table

from helmgr.cli.output import check_out, emit_json, json_option, json_text, progress, result_dir, stderr, stdout
from helmgr.cli.simulate_cmd import build_config, sim_options
from helmgr.cli.types import (NON_NEGATIVE, POSITIVE, Finite, allow_large_option, default_labels, names, option_costs,
                              parallel_options, positive_list, ratio_grid, seed_list)
from helmgr.cli.workload_cmd import cluster_defaults
from helmgr.experiments import commands, report
from helmgr.experiments.eval_markdown import CAP, CLASS_CAP, CTRL, HEAD, first_look, fmt, markdown
from helmgr.experiments.evaluate import DEFAULT_GRID, EvalConfig, config_dict, evaluate
from helmgr.experiments.phase_oracle import LOOKAHEAD_S
from helmgr.experiments.scenario import S5_MEASURES
from helmgr.policy import POLICIES
from helmgr.core.classes import load_table
from helmgr.core.validate import Cost, check_costs
from helmgr.routing import ROUTERS
from helmgr.workload import REGIMES, default_config

# what --quick changes (an option given on the command line wins)
FULL = {"seeds": "1,2,3", "ratios": ",".join(f"{r:g}" for r in DEFAULT_GRID), "time_compression": None,
        "capacity_workloads": None, "capacity_duration": None, "capacity_tol": 0.02}
QUICK = {"seeds": "1", "ratios": "0.3,0.5,0.7,0.9", "time_compression": 2.0, "capacity_workloads": "steady",
         "capacity_duration": 40.0, "capacity_tol": 0.05}
DEFAULT_OUT = Path("results/evaluate")


@click.command("evaluate")
@click.option("--workloads", default="steady,burst,trend", show_default=True, help="Comma list of regimes.")
@click.option("--seeds", default=None, help=f"Comma list of seeds [default: {FULL['seeds']}; --quick {QUICK['seeds']}].")
@click.option("--duration", type=POSITIVE, default=None,
              help="Simulated seconds of each run [default: 360 / --time-compression].")
@click.option("--time-compression", type=POSITIVE, default=None, metavar="F",
              help=f"Each regime's whole shape (run, phases, bursts, day) F times shorter [default: 1; --quick "
                   f"{QUICK['time_compression']:g}].")
@click.option("--policies", default="helm", show_default=True, help="Online memory policies, run under every router.")
@click.option("--routers", default="least-loaded,prefix-aware,helm", show_default=True, help="Comma list of routers.")
@click.option("--ratios", default=None, help=f"Static grid (static-best, the oracle, the check) [default: {FULL['ratios']}; "
                                             f"--quick {QUICK['ratios']}].")
@click.option("--rate-scale", type=POSITIVE, default=1.0, show_default=True, metavar="F",
              help="Multiply each regime's base rate by F (e.g. 4 with --nodes 32: the 8-node scenario's load per node).")
@sim_options
@click.option("--no-oracle", is_flag=True, help="Skip the phase oracle.")
@click.option("--oracle-lookahead", type=NON_NEGATIVE, default=LOOKAHEAD_S, show_default=True, metavar="S",
              help="The phase oracle judges each block's ratio by it and the blocks ending within S s after it.")
@click.option("--no-capacity", is_flag=True, help="Skip capacity at SLO.")
@click.option("--capacity-workloads", default=None,
              help=f"Regimes whose capacity is measured [default: all of --workloads; --quick "
                   f"{QUICK['capacity_workloads']}: a short probe is faithful only to a stationary regime].")
@click.option("--capacity-duration", type=POSITIVE, default=None,
              help=f"Simulated seconds of each capacity probe [default: the runs'; --quick {QUICK['capacity_duration']:g}].")
@click.option("--capacity-tol", type=Finite(0, 1, min_open=True, max_open=True), default=None,
              help=f"Capacity bisection tolerance [default: {FULL['capacity_tol']:g}; --quick {QUICK['capacity_tol']:g}].")
@click.option("--classes", "class_table", default=None, metavar="NAME|FILE",
              help="A class table (docs/tenancy.md): adds full HELM under every --tenancy at each --class-loads, "
                   "and (unless --no-capacity) its capacity at SLO per class.")
@click.option("--class-loads", default="1", show_default=True, metavar="F,...",
              help="With --classes: the rates of its runs, as multiples of each regime's base rate.")
@click.option("--s5", type=click.Choice(S5_MEASURES), default="whole", show_default=True, help="The check's S5 measure.")
@click.option("--quick", is_flag=True, help="A first look: one seed, 4 ratios, each regime's whole shape in half the "
                                           "time (180-s runs), and a coarser capacity on steady.")
@click.option("--fresh", is_flag=True, help="Rerun every unit (ignore what the results folder holds).")
@parallel_options
@json_option
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_OUT,
              show_default=True, help="Results folder: the report, and runs/ (what a rerun resumes from).")
@functools.partial(allow_large_option, runs=False)
@cluster_defaults
def evaluate_cmd(workloads, seeds, duration, time_compression, policies, routers, ratios, rate_scale, nodes, policy, ratio, router,
                 hardware, model, slo_ms, refill, faults, tick_ms, refresh_s, max_batch, engine, sim_path, emb_sample, no_oracle,
                 oracle_lookahead, no_capacity, capacity_workloads, capacity_duration, capacity_tol, class_table, class_loads, s5, quick, fresh, jobs, ray_address, as_json, out_dir,
                 allow_large):
    """Regimes x seeds x policies x routers, static-best per router, the phase oracle, capacity at
    SLO and the scenario check; reported both ways (the controller against static-best under the
    HELM router; full HELM against static-best with least-loaded and with prefix-aware routing),
    with a Markdown report, plots and the exact command of every figure.

    Each finished run is kept under OUT/runs and not rerun: an interrupted evaluation resumes.
    --router is the scenario check's router; --ratio the online policies' starting ratio.

    \b
    helmgr evaluate --quick
    helmgr evaluate --out results/eval --jobs 2
    helmgr evaluate --workloads burst --seeds 1,2 --ray-address auto
    """
    if policy != "static":
        raise click.UsageError(f"--policy {policy!r}: evaluate runs the online policies of --policies (a comma list)")
    preset = QUICK if quick else FULL
    pick = {"seeds": seeds, "ratios": ratios, "time_compression": time_compression,
            "capacity_workloads": capacity_workloads,
            "capacity_duration": capacity_duration, "capacity_tol": capacity_tol}
    pick = {k: preset[k] if v is None else v for k, v in pick.items()}
    regimes = tuple(names(workloads, REGIMES, "workloads"))
    cap_regimes = None if pick["capacity_workloads"] is None else tuple(
        r for r in names(pick["capacity_workloads"], REGIMES, "capacity-workloads") if r in regimes)
    ev = EvalConfig(cluster=build_config(nodes, "static", ratio, router, hardware, model, slo_ms, refill, faults,
                                         tick_ms, refresh_s, max_batch, 0, engine, sim_path, emb_sample),
                    regimes=regimes, seeds=tuple(seed_list(pick["seeds"])),
                    policies=tuple(names(policies, list(POLICIES), "policies")),
                    routers=tuple(names(routers, list(ROUTERS), "routers")), grid=tuple(ratio_grid(pick["ratios"])),
                    duration_s=duration, time_compression=pick["time_compression"], check_router=router,
                    oracle_routers=() if no_oracle else ("helm",), oracle_lookahead_s=oracle_lookahead,
                    capacity=not no_capacity, capacity_regimes=cap_regimes,
                    capacity_duration_s=pick["capacity_duration"], capacity_tol=pick["capacity_tol"],
                    rate_scale=rate_scale, classes=class_table,
                    class_loads=tuple(positive_list(class_loads, "class-loads")), allow_large=allow_large)
    if class_table is not None:                      # the table, and a node per class (--tenancy pools)
        load_table(class_table).pool_sizes(nodes)
    elif click.get_current_context().get_parameter_source("class_loads") is ParameterSource.COMMANDLINE:
        raise click.UsageError(f"--class-loads {class_loads!r} sets the rates of the multi-tenant runs: give --classes")
    if len(ev.grid) < 2:
        raise click.UsageError(f"--ratios {pick['ratios']!r}: the evaluation needs at least two ratios")
    durations = {regime: ev.spec(regime, ev.seeds[0]).build().duration_s  # validates the workload options
                 for regime in ev.regimes}
    check_costs(_run_costs(ev, durations), allow_large)
    if out_dir == DEFAULT_OUT:
        DEFAULT_OUT.parent.mkdir(exist_ok=True)
    check_out(out_dir)
    if fresh and (out_dir / "runs").is_dir():
        import shutil
        shutil.rmtree(out_dir / "runs")
    wall = time.perf_counter()
    with progress("evaluating", None) as bar:
        def track(label: str, total: int):
            task = bar.add_task(label, total=total or None)
            return lambda k=1: bar.advance(task, k)
        done = evaluate(ev, out_dir, jobs or os.cpu_count() or 1, ray_address, track)
    result = assemble(ev, done["results"], s5) | {"wall_s": time.perf_counter() - wall, "cpu_s": done["cpu_s"],
                                                  "ran": done["ran"], "kept": len(done["results"]) - done["ran"]}
    result["duration_s"] = durations
    result["command"] = "helmgr " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "helmgr evaluate"
    with result_dir(out_dir) as scratch:
        _write(result, ev, done["results"], scratch)
    if as_json:
        emit_json(result)
    else:
        _print(result)
        stderr.print(f"wrote {out_dir}/evaluate.md, evaluate.json and plots ({result['ran']} units run, "
                     f"{result['kept']} kept from before)")


def _run_costs(ev: EvalConfig, durations: dict) -> list[Cost]:
    """What each regime's largest run asks for (requests, memory, controller ticks, EMB re-ranks),
    checked as `simulate` checks one run, and each capacity search's first probe (its doubling
    stops at the limits unless --allow-large)."""
    top = max((1.0,) + ev.class_loads if ev.classes is not None else (1.0,))
    runs = [(g, top, durations[g], "") for g in ev.regimes]
    if ev.capacity:
        runs += [(g, 1.0, ev.spec(g, ev.seeds[0], ev.capacity_duration_s).seconds, "capacity probe, ")
                 for g in (ev.regimes if ev.capacity_regimes is None else ev.capacity_regimes)]
    costs = []
    for g, load, seconds, what in runs:
        o = {"rps": ev.class_rps(g, load), "duration": seconds, "nodes": ev.cluster.nodes,
             "tick_ms": ev.cluster.tick_s * 1e3, "refresh_s": ev.cluster.refresh_s}
        rate = (f"{default_config(g).rps:g} req/s x --rate-scale {ev.rate_scale:g}"
                + (f" x --class-loads {load:g}" if load != 1.0 else ""))
        labels = default_labels(o) | {"rps": rate, "duration": "{:g} s"}      # (rate: our words, no field)
        costs += [replace(c, because=f"{g}: {what}{c.because}") for c in option_costs(o, labels)]
    return costs


def assemble(ev: EvalConfig, results: dict, s5: str) -> dict:
    table = report.rows(ev, results)
    out = {"config": config_dict(ev), "slo_ms": _slo(results),
           "system": [h for base in report.SYSTEM_BASELINES if base[1] in ev.routers
                      for h in report.headline(table, ev, report.FULL, base)] if "helm" in ev.routers else [],
           "controller": report.headline(table, ev, *report.CONTROLLER) if "helm" in ev.routers else [],
           "capacity": report.capacity_table(ev, results),
           "scenario_check": report.check_table(ev, results, s5), "routers": report.router_table(ev, results),
           "oracle_blocks": report.oracle_table(ev, results), "rows": table,
           "tenancy": report.tenancy_table(ev, results), "class_capacity": report.class_capacity_table(ev, results)}
    out["commands"] = _commands(ev, results)
    return out


def _slo(results: dict) -> float | None:
    return next((r.summary["slo_ms"] for u, r in results.items() if u.kind == "point"), None)


def _commands(ev: EvalConfig, results: dict) -> dict:
    units = {u.name: commands.unit_command(ev, u) for u in results}
    static = {f"{g} seed {s}: static-best @ {rt}": commands.static_best_command(ev, g, s, rt)
              for g in ev.regimes for s in ev.seeds for rt in ev.point_routers}
    checks = {f"{g}: scenario check": commands.check_command(ev, g) for g in ev.regimes}
    return units | static | checks


def _write(result: dict, ev: EvalConfig, results: dict, scratch: Path) -> None:
    from helmgr.experiments.eval_plots import plot_capacity, plot_p99, plot_ratios, plot_routers
    (scratch / "evaluate.json").write_text(json_text(result))
    pngs = ["evaluate_p99.png"]
    plot_p99(result["rows"], ev.regimes, result["slo_ms"], scratch / pngs[0])
    if result["capacity"]:
        pngs.append("evaluate_capacity.png")
        plot_capacity(result["capacity"], ev.regimes, scratch / pngs[-1])
    if result["routers"]:
        pngs.append("evaluate_routers.png")
        plot_routers(result["routers"], ev.regimes, ev.point_routers, result["slo_ms"], scratch / pngs[-1])
    traces = _ratio_traces(ev, results)
    if traces:
        pngs.append("evaluate_ratios.png")
        plot_ratios(traces, scratch / pngs[-1])
    (scratch / "evaluate.md").write_text(markdown(result, pngs))


def _ratio_traces(ev: EvalConfig, results: dict) -> dict:
    """Per regime, for the first seed: the oracle and the online policies under its router."""
    out = {}
    for u, r in results.items():
        if u.kind == "oracle" and u.seed == ev.seeds[0]:
            runs = {f"{v.policy}@{v.router}": x["window_ratio"] for v, x in results.items()
                    if v.kind == "run" and v.regime == u.regime and v.seed == u.seed and v.router == u.router}
            out[u.regime] = (r, runs)
    return out


def _print(result: dict) -> None:
    for line in first_look(result["config"])[:1]:
        stdout.print(line.replace("**", ""))
    for title, rows, cols in (("full HELM vs static-best + prefix-aware (headline), + least-loaded", result["system"],
                               HEAD),
                              ("controller vs static-best, HELM router", result["controller"], CTRL),
                              ("capacity at SLO (req/s)", result["capacity"], CAP),
                              ("tenants and SLO classes", result["tenancy"], list(result["tenancy"][0]) if result["tenancy"] else ()),
                              ("capacity at SLO per class (req/s)", result["class_capacity"], CLASS_CAP)):
        if not rows:
            continue
        t = Table(title=title)
        for col in cols:
            t.add_column(col, justify="right")
        for r in rows:
            t.add_row(*(fmt(r.get(col)) for col in cols))
        stdout.print(t)
    t = Table(title="scenario check")
    for col in ("regime", "property", "pass"):
        t.add_column(col)
    for regime, r in result["scenario_check"].items():
        for name, p in r["summary"].items():
            t.add_row(regime, name, fmt(p["pass"]))
    stdout.print(t)

