"""`helmgr sweep`: the static EMB:KV ratio over a grid, one simulation per ratio, in parallel."""
from __future__ import annotations

import math
import os

import click
from click.core import ParameterSource
from rich.table import Table

from helmgr.cli.output import (check_out, emit_json, json_option, json_text, out_option, progress,
                               result_dir, stdout)
from helmgr.cli.simulate_cmd import build_config, sim_options
from helmgr.cli.types import parallel_options, ratio_grid
from helmgr.cli.workload_cmd import workload_options, workload_spec
from helmgr.core.errors import HelmInputError
from helmgr.experiments.sweep import sweep

COLUMNS = ("ratio", "p99_ms", "p50_ms", "slo_attainment", "window_slo_satisfaction", "emb_hit_rate", "kv_hit_rate",
           "h2d_gb", "utilization")


@click.command("sweep")
@workload_options
@sim_options
@click.option("--ratios", default="0.05:0.95:0.05", show_default=True,
              help="Static ratios: start:stop:step (inclusive) or a comma list.")
@parallel_options
@json_option
@out_option
def sweep_cmd(regime, duration, seed, rps, trace, trace_format, time_compression, clone_users, overlay,
              nodes, policy, ratio, router, hardware, model, slo_ms, refill, faults, tick_ms, refresh_s, max_batch, engine,
              sim_path, emb_sample, ratios, jobs, ray_address, as_json, out_dir):
    """Sweep the static EMB ratio: P99 and SLO attainment per ratio, and the best one.

    \b
    helmgr sweep --workload burst --ratios 0.05:0.95:0.05 --out results/sweep-burst
    helmgr sweep --workload burst --ray-address auto --out results/sweep-burst
    """
    if policy != "static":
        raise HelmInputError(f"--policy {policy!r}: a sweep runs static splits, one a ratio of --ratios")
    if click.get_current_context().get_parameter_source("ratio") is ParameterSource.COMMANDLINE:
        raise HelmInputError(f"--ratio {ratio:g}: a sweep runs every ratio of --ratios")
    check_out(out_dir)
    grid = ratio_grid(ratios)
    cfg = build_config(nodes, "static", grid[0], router, hardware, model, slo_ms, refill, faults, tick_ms, refresh_s,
                       max_batch, seed, engine, sim_path, emb_sample)
    spec = workload_spec(regime, duration, seed, rps, trace, trace_format, time_compression, clone_users, overlay)
    w = spec.build()                                    # validates the workload options up front
    jobs = jobs or os.cpu_count() or 1
    with progress("sweeping", len(grid)) as bar:
        task = bar.add_task(f"sweep {w.name}", total=len(grid))
        rows = sweep(spec, cfg, grid, jobs, lambda: bar.advance(task), ray_address)
    for row in rows:
        row.pop("window_p99_ms")
    summary = {"workload": w.name, "nodes": nodes, "router": router, "seed": seed} | _extremes(rows) | {"rows": rows}
    best = next((r for r in rows if r["ratio"] == summary["best_ratio"]), None)
    with result_dir(out_dir) as scratch:
        if scratch is not None:
            from helmgr.experiments.plots import plot_sweep
            (scratch / "sweep.json").write_text(json_text(summary))
            (scratch / "sweep.md").write_text(_markdown(summary))
            plot_sweep(rows, f"{w.name}: static sweep, {nodes} nodes, {router}", scratch / "sweep.png")
    if as_json:
        emit_json(summary)
    else:
        t = Table(title=f"sweep {w.name}: " + (f"best r = {best['ratio']:g} (P99 {best['p99_ms']:.1f} ms)" if best
                                                 else "no ratio measured a P99"))
        for c in COLUMNS:
            t.add_column(c, justify="right")
        for row in rows:
            t.add_row(*(f"{row[c]:.4g}" for c in COLUMNS), style="bold green" if row is best else None)
        stdout.print(t)


def _extremes(rows: list[dict]) -> dict:
    """Best and worst ratio by P99, over the ratios that measured one."""
    measured = [r for r in rows if math.isfinite(r["p99_ms"])]
    if not measured:
        why = "no ratio measured a P99 (no request completed after the warm-up)"
        keys = ("best_ratio", "best_p99_ms", "worst_ratio", "worst_p99_ms", "worst_over_best")
        return dict.fromkeys(keys) | {"nulls": dict.fromkeys(keys, why)}
    best = min(measured, key=lambda x: x["p99_ms"])
    worst = max(measured, key=lambda x: x["p99_ms"])
    return {"best_ratio": best["ratio"], "best_p99_ms": best["p99_ms"], "worst_ratio": worst["ratio"],
            "worst_p99_ms": worst["p99_ms"],
            "worst_over_best": worst["p99_ms"] / best["p99_ms"] if best["p99_ms"] > 0 else float("nan")}


def _markdown(summary: dict) -> str:
    lines = [f"# Static sweep: {summary['workload']}, {summary['nodes']} nodes, {summary['router']}, seed {summary['seed']}",
             "", _best_line(summary), "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---:|" * len(COLUMNS)]
    lines += ["| " + " | ".join(f"{r[c]:.4g}" for c in COLUMNS) + " |" for r in summary["rows"]]
    return "\n".join(lines) + "\n\n![P99 and SLO against the ratio](sweep.png)\n"


def _best_line(summary: dict) -> str:
    if summary["best_ratio"] is None:
        return "No ratio measured a P99 (no request completed after the warm-up)."
    return (f"Best ratio **{summary['best_ratio']:g}** (P99 {summary['best_p99_ms']:.2f} ms); worst "
            f"{summary['worst_ratio']:g} (P99 {summary['worst_p99_ms']:.2f} ms, {summary['worst_over_best']:.2f}x).")
