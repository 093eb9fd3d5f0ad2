"""`helmgr no-tuning`: the regret of a split where it was not tuned, and of full HELM, over a grid of
conditions (experiments.notuning)."""
from __future__ import annotations

import os
import time

import click
from rich.table import Table

from helmgr.cli.output import check_out, emit_json, json_option, json_text, out_option, progress, result_dir, stdout
from helmgr.cli.types import (POSITIVE, Finite, allow_large_option, defaulted, names, parallel_options, ratio_grid,
                              spec_costs)
from helmgr.core.profiles import available
from helmgr.core.validate import LIMITS, Cost, check_costs
from helmgr.experiments.evaluate import DEFAULT_GRID
from helmgr.experiments.notuning import grid_conditions, no_tuning
from helmgr.sim import SimConfig
from helmgr.workload import FORMATS, REGIMES, WorkloadSpec
from helmgr.workload.trace import WIDEN


@click.command("no-tuning")
@click.option("--hardware", default="a100-80g,h100-80g,h200-141g", show_default=True, help="Comma list of hardware presets.")
@click.option("--models", default="large,small", show_default=True, help="Comma list of model presets.")
@click.option("--workloads", default="steady,burst,trend", show_default=True,
              help="Comma list of regimes ('' for none, with --trace).")
@click.option("--trace", "traces", multiple=True, type=click.Path(dir_okay=False, exists=True),
              help="Also a replayed log (repeatable), on the first hardware and model.")
@click.option("--trace-format", type=click.Choice(FORMATS), default="inter", show_default=True)
@click.option("--clone-users", type=click.IntRange(min=1), default=32, show_default=True,
              help="Each log user replayed this many times, each clone over its own item ids (a widened catalogue).")
@click.option("--trace-time-compression", type=POSITIVE, default=100.0, show_default=True, metavar="F",
              help="Each log's time divided by F.")
@click.option("--trace-duration", type=POSITIVE, default=180.0, show_default=True, help="Simulated seconds of a log.")
@click.option("--seed", type=click.IntRange(0), default=1, show_default=True)
@click.option("--ratios", default=",".join(f"{r:g}" for r in DEFAULT_GRID), show_default=True,
              help="The fixed splits: start:stop:step or a comma list.")
@click.option("--time-compression", type=POSITIVE, default=None, metavar="F",
              help="Each regime's whole shape F times shorter [default: 1, 360-s runs].")
@click.option("--capacity-workloads", default="", help="Regimes whose capacity at SLO is measured [default: none].")
@click.option("--capacity-duration", type=POSITIVE, default=None, help="Simulated seconds of each capacity probe.")
@click.option("--capacity-tol", type=Finite(0, 1, min_open=True, max_open=True), default=0.05, show_default=True)
@parallel_options
@json_option
@out_option
@allow_large_option
def notuning_cmd(hardware, models, workloads, traces, trace_format, clone_users, trace_time_compression, trace_duration,
                 seed, ratios, time_compression,
                 capacity_workloads, capacity_duration, capacity_tol, jobs, ray_address, as_json, out_dir, allow_large):
    """Regret of full HELM, of every fixed split, of the minimax split and of the split tuned on the
    default condition (the first hardware, model and regime), over a grid of conditions, each
    against its own hindsight static-best under the HELM router: the controller needs no sweep.

    \b
    helmgr no-tuning --time-compression 2 --out results/no-tuning
    helmgr no-tuning --trace ../shared/data/amazon-beauty.txt --trace-format sequences --json
    """
    check_out(out_dir)
    wall = time.perf_counter()
    hw = names(hardware, sorted(available("hardware")), "hardware")
    ms = names(models, sorted(available("model")), "models")
    regimes = names(workloads, REGIMES, "workloads") if workloads.strip() or not traces else []
    cap = tuple(names(capacity_workloads, REGIMES, "capacity-workloads")) if capacity_workloads.strip() else ()
    grid = ratio_grid(ratios)
    logs = tuple(WorkloadSpec(duration_s=trace_duration, seed=seed, trace=t, trace_format=trace_format,
                              time_compression=trace_time_compression, clone_users=clone_users,
                              overlays=(WIDEN,) if clone_users > 1 else ()) for t in traces)
    conditions = grid_conditions(hw, ms, regimes, seed, time_compression, logs)
    nodes = SimConfig().nodes
    costs = [c for spec in dict.fromkeys(c.spec for c in conditions) for c in _costs(spec, nodes)]
    probes = [WorkloadSpec(r, capacity_duration, seed, time_compression=time_compression) for r in cap]
    costs += [c for w in probes for c in spec_costs(w, nodes, f"{w.regime}: capacity probe, ",
                                                    NODES | {"duration": "--capacity-duration {:g}"})]
    costs.append(Cost("runs", len(conditions) * (len(grid) + 1), LIMITS.runs,
                      f"{len(conditions)} conditions x (--ratios {ratios!r} + full HELM)"))
    check_costs(costs, allow_large)
    for c in conditions:
        c.spec.build()                                 # a bad trace is refused before any run
    total = len(conditions) * (len(grid) + 1)
    with progress("no-tuning", total) as bar:
        task = bar.add_task(f"{len(conditions)} conditions x {len(grid) + 1} runs", total=None)
        result = no_tuning(conditions, grid, jobs=jobs or os.cpu_count() or 1, ray_address=ray_address,
                           on_done=lambda: bar.advance(task), capacity_regimes=cap, tol=capacity_tol,
                           capacity_s=capacity_duration, allow_large=allow_large)
    result = {"seed": seed, "time_compression": time_compression, "wall_s": time.perf_counter() - wall} | result
    with result_dir(out_dir) as scratch:
        if scratch is not None:
            (scratch / "no-tuning.json").write_text(json_text(result))
            (scratch / "no-tuning.md").write_text(markdown(result))
    if as_json:
        emit_json(result)
        return
    stdout.print(summary_table(result))


NODES = defaulted(["nodes"])               # the study's cluster: the default scenario's, no option


def _costs(spec: WorkloadSpec, nodes: int) -> list[Cost]:
    """A condition's run's costs, a log's named by its own options (--trace-duration, ...)."""
    if spec.trace is None:
        return spec_costs(spec, nodes, f"{spec.regime}: ", NODES)
    return spec_costs(spec, nodes, f"--trace {spec.trace!r}: ", NODES | {"duration": "--trace-duration {:g}"})


def _rows(result: dict) -> list[tuple[str, str, str, str]]:
    rows = [("full HELM", "—", result["helm"]["worst"], result["helm"]["mean"])]
    rows += [(k.replace("_", "-") + " split", f"{v['ratio']:g}", v["worst"], v["mean"])
             for k, v in (("minimax", result["minimax"]), ("default_tuned", result["default_tuned"]))]
    rows += [("fixed", r, v["worst"], v["mean"]) for r, v in result["fixed"].items()]
    return [(a, b, f"{w:+.1%}", f"{m:+.1%}") for a, b, w, m in rows]


def summary_table(result: dict) -> Table:
    t = Table(title=f"regret against each condition's hindsight static-best ({len(result['conditions'])} conditions, "
                    f"{result['wall_s']:.0f} s)")
    for col in ("configuration", "split", "worst", "mean"):
        t.add_column(col, justify="right")
    for row in _rows(result):
        t.add_row(*row)
    return t


def markdown(result: dict) -> str:
    lines = ["# No tuning: regret against each condition's hindsight static-best (HELM router)", "",
             f"Seed {result['seed']}, time compression {result['time_compression'] or 1:g}, {result['wall_s']:.0f} s.", "",
             "| configuration | split | worst | mean |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in _rows(result)]
    lines += ["", "| condition | hindsight split | its P99 ms | full HELM P99 ms | HELM's regret |", "|---|---|---|---|---|"]
    lines += [f"| {c['condition']} | {c['best_ratio']:g} | {c['p99_ms'][str(c['best_ratio'])]:.3f} | "
              f"{c['helm_p99_ms']:.3f} | {c['helm_regret']:+.1%} |" for c in result["conditions"]]
    for row in result.get("capacity", []):
        lines.append(f"\n- capacity, {row['condition']}: " + ", ".join(
            f"{k} {row[k]:,.0f}" if row[k] is not None else f"{k} —"
            for k in ("hindsight", "helm", "minimax", "default_tuned")))
    return "\n".join(lines) + "\n"
