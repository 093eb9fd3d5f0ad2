"""`helmgr compare`: every memory policy (and router) on the same workload and seed, side by side,
with the offline oracle's r* to measure each policy's distance from it."""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import click
import numpy as np
from rich.table import Table

from helmgr.cli.output import emit_json, json_option, out_option, progress, result_dir, stderr
from helmgr.cli.simulate_cmd import build_config, sim_options
from helmgr.cli.sweep_cmd import parse_ratios, sweep_rows
from helmgr.cli.workload_cmd import build_workload, workload_options
from helmgr.core.errors import HelmInputError
from helmgr.policy import POLICIES
from helmgr.routing import ROUTERS
from helmgr.sim import simulate
from helmgr.sim.metrics import oracle_distance
from helmgr.experiments.oracle import run_oracle

ALL = ("static", "static-best", "independent", "adaptive", "latency-driven", "oracle")
COLUMNS = ("policy", "router", "p99_ms", "p50_ms", "slo_attainment", "window_slo_satisfaction", "mean_ratio",
           "oracle_distance", "held_oracle_distance", "burst_violation_share", "wall_s")


def _names(text: str, known, what: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in known]
    if bad or not names:
        raise HelmInputError(f"--{what} {text!r}: unknown {bad[0] if bad else 'empty list'} (known: {', '.join(known)})")
    return names


def _run_policy(args):
    workload_args, cfg = args
    r = simulate(cfg, build_workload(*workload_args))
    return r.summary, r.series


@click.command("compare")
@workload_options
@sim_options
@click.option("--policies", default=",".join(ALL), show_default=True, help="Comma list of memory policies.")
@click.option("--routers", default=None, help="Comma list of routers [default: --router].")
@click.option("--ratios", default="0.05:0.95:0.05", show_default=True,
              help="Grid for static-best and the oracle: start:stop:step or a comma list.")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Worker processes [default: all cores].")
@json_option
@out_option
def compare_cmd(regime, duration, seed, rps, trace, trace_format, time_compression, clone_users, overlay,
                nodes, policy, ratio, router, hardware, model, slo_ms, refill, faults, tick_ms, refresh_s, max_batch,
                policies, routers, ratios, jobs, as_json, out_dir):
    """Run every policy on the same workload and seed; P99, SLO and distance from the oracle.

    static-best is the grid ratio with the lowest P99 (a sweep of this run, in hindsight); the
    oracle picks the best cluster-wide ratio per 1-s window by replaying it at every grid ratio
    from its own state (r*). held r* is, per window, the best of the sweep's held ratios; each
    policy's mean |r - r*| and |r - held r*| are reported.

    \b
    helmgr compare --workload burst --out results/compare-burst
    helmgr compare --workload steady --policies static,adaptive,oracle --ratios 0.1:0.9:0.1
    """
    wall = time.perf_counter()
    names = _names(policies, ALL + tuple(p for p in POLICIES if p not in ALL), "policies")
    router_names = _names(routers, list(ROUTERS), "routers") if routers else [router]
    grid = parse_ratios(ratios)
    workload_args = (regime, duration, seed, rps, trace, trace_format, time_compression, clone_users, overlay)
    w = build_workload(*workload_args)
    jobs = jobs or os.cpu_count() or 1
    rows, timelines, r_star, held_r_star = [], {}, None, None
    runs = [n for n in names if n in POLICIES]
    cfgs = {rt: build_config(nodes, "static", ratio, rt, hardware, model, slo_ms, refill, faults, tick_ms, refresh_s,
                             max_batch, seed) for rt in router_names}
    with progress("comparing", None) as bar:
        pairs = [(rt, n) for rt in router_names for n in runs]      # every router x policy, in one pool
        task = bar.add_task(f"{w.name}: {len(pairs)} runs", total=len(pairs))
        with ProcessPoolExecutor(max_workers=min(jobs, max(1, len(pairs)))) as pool:
            futures = [pool.submit(_run_policy, (workload_args, replace(cfgs[rt], policy=n))) for rt, n in pairs]
            for f in futures:
                f.add_done_callback(lambda _: bar.advance(task))
            for (rt, n), f in zip(pairs, futures):
                summary, series = f.result()
                rows.append(summary)
                timelines[(n, rt)] = series
    for rt in router_names if {"static-best", "oracle"} & set(names) else []:
        cfg = cfgs[rt]
        with progress("comparing", None) as bar:
            task = bar.add_task(f"{w.name} / {rt}: static-best", total=("static-best" in names) * len(grid))
            done = lambda: bar.advance(task)
            if "static-best" in names:
                sweep = sweep_rows(workload_args, cfg, grid, min(jobs, len(grid)), done)
                held = np.array([x.pop("window_p99_ms") for x in sweep])           # ratios x windows
                held_r_star = np.asarray(grid)[np.argmin(np.where(np.isnan(held), np.inf, held), axis=0)]
                best = dict(min(sweep, key=lambda x: x["p99_ms"]))
                best["policy"] = "static-best"
                rows.append(best)
                timelines[("static-best", rt)] = None
            if "oracle" in names:
                task2 = bar.add_task(f"{w.name} / {rt}: oracle", total=int(-(-w.duration_s // 1)))
                o = run_oracle(cfg, build_workload(*workload_args), grid, jobs,
                               on_progress=lambda k: bar.update(task2, completed=k))
                rows.append(o.summary)
                timelines[("oracle", rt)] = o.series
                r_star = o.r_star
    for key, ref in (("oracle_distance", r_star), ("held_oracle_distance", held_r_star)):
        if ref is None:
            continue
        for row in rows:
            series = timelines.get((row["policy"], row["router"]))
            if series is None:                           # static-best: one ratio held throughout
                row[key] = float(np.abs(row["ratio"] - ref).mean())
            elif not (key == "oracle_distance" and row["policy"] == "oracle"):
                row[key] = oracle_distance(series.timeline, row["nodes"], row["duration_s"], ref)
    result = {"workload": w.name, "nodes": nodes, "seed": seed, "grid": grid, "wall_s": time.perf_counter() - wall,
              "r_star": None if r_star is None else [float(x) for x in r_star],
              "held_r_star": None if held_r_star is None else [float(x) for x in held_r_star], "results": rows}
    with result_dir(out_dir) as scratch:
        if scratch is not None:
            from helmgr.experiments.plots import plot_compare
            (scratch / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
            (scratch / "compare.md").write_text(_markdown(result))
            plot_compare(rows, timelines, r_star, f"{w.name}, {nodes} nodes, seed {seed}", scratch)
    if as_json:
        emit_json(result)
    else:
        t = Table(title=f"compare {w.name}: {nodes} nodes, seed {seed} ({result['wall_s']:.0f} s)")
        for c in COLUMNS:
            t.add_column(c, justify="right")
        for row in rows:
            t.add_row(*(_fmt(row.get(c)) for c in COLUMNS))
        stderr.print(t)


def _fmt(v) -> str:
    if v is None:
        return "—"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _markdown(result: dict) -> str:
    lines = [f"# Compare: {result['workload']}, {result['nodes']} nodes, seed {result['seed']}", "",
             f"Wall time {result['wall_s']:.0f} s; grid {result['grid'][0]:g}..{result['grid'][-1]:g} "
             f"({len(result['grid'])} ratios). Oracle distance: mean |r - r*| per 1-s window, r the mean of "
             "the nodes' ratios, r* cluster-wide.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in COLUMNS) + " |" for r in result["results"]]
    return "\n".join(lines) + "\n\n![P99 and SLO](compare_p99_slo.png)\n![ratios](compare_ratios.png)\n" \
                              "![latency CDFs](compare_cdf.png)\n"
