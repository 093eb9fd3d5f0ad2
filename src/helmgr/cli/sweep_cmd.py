"""`helmgr sweep`: the static EMB:KV ratio over a grid, one simulation per ratio, in parallel."""
from __future__ import annotations

import json
import os

import click
from rich.table import Table

from helmgr.cli.output import emit_json, json_option, out_option, progress, result_dir, stderr
from helmgr.cli.simulate_cmd import build_config, sim_options
from helmgr.cli.workload_cmd import workload_options, workload_spec
from helmgr.core.errors import HelmInputError
from helmgr.experiments.sweep import sweep

COLUMNS = ("ratio", "p99_ms", "p50_ms", "slo_attainment", "window_slo_satisfaction", "emb_hit_rate", "kv_hit_rate",
           "h2d_gb", "utilization")


def parse_ratios(text: str) -> list[float]:
    """'0.05:0.95:0.05' (start:stop:step, inclusive) or '0.1,0.3,0.5'."""
    try:
        if ":" in text:
            start, stop, step = (float(x) for x in text.split(":"))
            if step <= 0 or stop < start:
                raise ValueError
            n = int(round((stop - start) / step)) + 1
            values = [round(start + k * step, 10) for k in range(n)]
        else:
            values = [float(x) for x in text.split(",")]
    except ValueError:
        raise HelmInputError(f"--ratios {text!r} is not start:stop:step or a comma list of numbers") from None
    bad = [v for v in values if not 0.0 <= v <= 1.0]
    if bad or not values:
        raise HelmInputError(f"--ratios {text!r}: every ratio must be in [0, 1], got {bad[0] if bad else 'none'}")
    return values


@click.command("sweep")
@workload_options
@sim_options
@click.option("--ratios", default="0.05:0.95:0.05", show_default=True,
              help="Static ratios: start:stop:step (inclusive) or a comma list.")
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="Worker processes [default: all cores].")
@json_option
@out_option
def sweep_cmd(regime, duration, seed, rps, trace, trace_format, time_compression, clone_users, overlay,
              nodes, policy, ratio, router, hardware, model, slo_ms, refill, faults, tick_ms, refresh_s, max_batch,
              ratios, jobs, as_json, out_dir):
    """Sweep the static EMB ratio: P99 and SLO attainment per ratio, and the best one.

    \b
    helmgr sweep --workload burst --ratios 0.05:0.95:0.05 --out results/sweep-burst
    """
    grid = parse_ratios(ratios)
    cfg = build_config(nodes, "static", grid[0], router, hardware, model, slo_ms, refill, faults, tick_ms, refresh_s,
                       max_batch, seed)
    spec = workload_spec(regime, duration, seed, rps, trace, trace_format, time_compression, clone_users, overlay)
    w = spec.build()                                    # validates the workload options up front
    jobs = jobs or os.cpu_count() or 1
    with progress("sweeping", len(grid)) as bar:
        task = bar.add_task(f"sweep {w.name}", total=len(grid))
        rows = sweep(spec, cfg, grid, min(jobs, len(grid)), lambda: bar.advance(task))
    for row in rows:
        row.pop("window_p99_ms")
    best = min(rows, key=lambda x: x["p99_ms"])
    worst = max(rows, key=lambda x: x["p99_ms"])
    summary = {"workload": w.name, "nodes": nodes, "router": router, "seed": seed, "best_ratio": best["ratio"],
               "best_p99_ms": best["p99_ms"], "worst_ratio": worst["ratio"], "worst_p99_ms": worst["p99_ms"],
               "worst_over_best": worst["p99_ms"] / best["p99_ms"], "rows": rows}
    with result_dir(out_dir) as scratch:
        if scratch is not None:
            from helmgr.experiments.plots import plot_sweep
            (scratch / "sweep.json").write_text(json.dumps(summary, indent=2) + "\n")
            (scratch / "sweep.md").write_text(_markdown(summary))
            plot_sweep(rows, f"{w.name}: static sweep, {nodes} nodes, {router}", scratch / "sweep.png")
    if as_json:
        emit_json(summary)
    else:
        t = Table(title=f"sweep {w.name}: best r = {best['ratio']:g} (P99 {best['p99_ms']:.1f} ms)")
        for c in COLUMNS:
            t.add_column(c, justify="right")
        for row in rows:
            t.add_row(*(f"{row[c]:.4g}" for c in COLUMNS), style="bold green" if row is best else None)
        stderr.print(t)


def _markdown(summary: dict) -> str:
    lines = [f"# Static sweep: {summary['workload']}, {summary['nodes']} nodes, {summary['router']}, seed {summary['seed']}",
             "", f"Best ratio **{summary['best_ratio']:g}** (P99 {summary['best_p99_ms']:.2f} ms); worst "
             f"{summary['worst_ratio']:g} (P99 {summary['worst_p99_ms']:.2f} ms, {summary['worst_over_best']:.2f}x).", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---:|" * len(COLUMNS)]
    lines += ["| " + " | ".join(f"{r[c]:.4g}" for c in COLUMNS) + " |" for r in summary["rows"]]
    return "\n".join(lines) + "\n\n![P99 and SLO against the ratio](sweep.png)\n"
