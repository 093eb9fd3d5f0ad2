"""`helmgr compare`: every memory policy (and router) on the same workload and seed, side by side,
with the phase oracle's r* to measure each policy's distance from it, band distance and regret."""
from __future__ import annotations

import os
import time

import click
from rich.table import Table

from helmgr.cli.output import (check_out, emit_json, json_option, json_text, out_option, progress,
                               result_dir, stdout)
from helmgr.cli.simulate_cmd import build_config, class_options, sim_options, with_classes
from helmgr.cli.types import NON_NEGATIVE, names, parallel_options, ratio_grid
from helmgr.cli.workload_cmd import workload_options, workload_spec
from helmgr.experiments.compare import ALL, OFFLINE, compare, oracle_check
from helmgr.experiments.phase_oracle import LOOKAHEAD_S
from helmgr.policy import POLICIES
from helmgr.routing import ROUTERS

COLUMNS = ("policy", "router", "p99_ms", "p50_ms", "slo_attainment", "window_slo_satisfaction", "mean_ratio",
           "oracle_distance", "band_distance", "band_distance_in_phase", "regret", "held_oracle_distance",
           "burst_violation_share", "wall_s")


@click.command("compare")
@workload_options
@sim_options
@class_options
@click.option("--policies", default=",".join(ALL), show_default=True, help="Comma list of memory policies.")
@click.option("--routers", default=None, help="Comma list of routers [default: --router].")
@click.option("--ratios", default="0.05:0.95:0.05", show_default=True,
              help="Grid for static-best and the oracle: start:stop:step or a comma list.")
@click.option("--oracle-lookahead", type=NON_NEGATIVE, default=LOOKAHEAD_S, show_default=True, metavar="S",
              help="Judge each oracle block's ratio by its requests and those of the blocks ending within S s after "
                   "it (0: the block alone).")
@parallel_options
@json_option
@out_option
def compare_cmd(regime, duration, seed, rps, trace, trace_format, time_compression, clone_users, overlay,
                nodes, policy, ratio, router, hardware, model, slo_ms, refill, faults, tick_ms, refresh_s, max_batch, engine,
                sim_path, emb_sample, class_table, tenancy, policies, routers, ratios, oracle_lookahead, jobs,
                ray_address, as_json, out_dir):
    """Run every policy on the same workload and seed; P99, SLO and distance from the oracle.

    static-best is the grid ratio with the lowest P99 (a sweep of this run, in hindsight). The
    oracle (the phase oracle) cuts the run into blocks (the workload's phases, at most 10 s
    each), replays each block at every grid ratio from its own state (judged with the next 30 s:
    --oracle-lookahead), fits each block's log P99 by a convex curve and follows the fit's argmin
    r*. Each policy's oracle distance (mean |r - r*| per 1-s window), band distance (from the
    ratios within 2 % of the fit's minimum; raw, and in phase: leaving out the blocks whose
    lookahead leaves their phase kind and the first 20 s after each phase change) and regret
    (P99 / the oracle's - 1) are reported, and its mean |r - held r*|, held r* being per window
    the best of the sweep's held ratios. On a workload with one kind of phase (steady) the
    oracle's check: the splits inside every block's band after the warm-up, and static-best's
    regret (<= 1 %). With --classes, each run's figures per class against its own target, and
    the fairness between tenants, under --tenancy.

    \b
    helmgr compare --workload burst --out results/compare-burst
    helmgr compare --workload burst --classes surfaces --tenancy helm --router helm --policies helm,static
    helmgr compare --workload steady --policies static,adaptive,oracle --ratios 0.1:0.9:0.1
    helmgr compare --workload trend --ray-address auto
    """
    check_out(out_dir)
    wall = time.perf_counter()
    known = ALL + tuple(p for p in (*OFFLINE, *POLICIES) if p not in ALL)
    policy_names = names(policies, known, "policies")
    router_names = names(routers, list(ROUTERS), "routers") if routers is not None else [router]
    grid = ratio_grid(ratios)
    spec = workload_spec(regime, duration, seed, rps, trace, trace_format, time_compression, clone_users, overlay)
    w = spec.build()                                     # validates the workload options up front
    cfgs = {rt: with_classes(build_config(nodes, "static", ratio, rt, hardware, model, slo_ms, refill, faults, tick_ms,
                                          refresh_s, max_batch, seed, engine, sim_path, emb_sample),
                             class_table, tenancy).validate(w.duration_s) for rt in router_names}
    tenancy = next(iter(cfgs.values())).tenancy
    with progress("comparing", None) as bar:
        def track(label: str, total: int):
            task = bar.add_task(f"{w.name} / {label}", total=total)
            return lambda k=1: bar.advance(task, k)
        c = compare(spec, cfgs, policy_names, grid, jobs or os.cpu_count() or 1, track, ray_address, oracle_lookahead)
    rows, timelines, r_star = c.rows, c.timelines, c.r_star
    result = {"workload": w.name, "nodes": nodes, "seed": seed, "grid": grid, "wall_s": time.perf_counter() - wall,
              "class_table": None if class_table is None else class_table.source,
              "tenancy": None if class_table is None else tenancy,
              "r_star": _floats(r_star), "held_r_star": _floats(c.held_r_star),
              "oracle_blocks": {rt: o.block_table() for rt, o in c.oracles.items()} or None, "results": rows,
              "oracle_check": oracle_check(c)}
    with result_dir(out_dir) as scratch:
        if scratch is not None:
            from helmgr.experiments.plots import plot_compare
            (scratch / "compare.json").write_text(json_text(result))
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
        stdout.print(t)
        if class_table is not None:
            heads, body = class_columns(rows)
            t = Table(title=f"per class ({class_table.source}, --tenancy {tenancy}): P99 ms and window SLO "
                            "satisfaction against each class's own target")
            for c in heads:
                t.add_column(c, justify="right")
            for cells in body:
                t.add_row(*(_fmt(v) for v in cells))
            stdout.print(t)


def class_columns(rows: list[dict]) -> tuple[list[str], list[list]]:
    """Each run's figures per class (P99, window SLO satisfaction), its shed and its fairness (Jain's
    index over normalised service, the largest service gap): headers and one row per run. A run
    with no class figures (the phase oracle's, stitched from blocks) has none."""
    names = next((list(r["classes"]) for r in rows if "classes" in r), [])
    heads = ["policy", "router"] + [f"{c} {k}" for c in names for k in ("p99_ms", "window_slo")] + \
        ["goodput_rps", "shed", "jain", "max_gap_s"]
    body = []
    for r in rows:
        cls, fair = r.get("classes", {}), r.get("fairness", {})
        cells = [r["policy"], r["router"]]
        for c in names:
            f = cls.get(c, {})
            cells += [f.get("p99_ms"), f.get("window_slo_satisfaction")]
        goodput = sum(f["goodput_rps"] for f in cls.values()) if cls else None
        body.append(cells + [goodput, r.get("shed") if cls else None, fair.get("jain"), fair.get("max_gap_s")])
    return heads, body


def _floats(x) -> list[float] | None:
    return None if x is None else [float(v) for v in x]


def _fmt(v) -> str:
    if v is None:
        return "—"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _markdown(result: dict) -> str:
    lines = [f"# Compare: {result['workload']}, {result['nodes']} nodes, seed {result['seed']}", "",
             f"Wall time {result['wall_s']:.0f} s; grid {result['grid'][0]:g}..{result['grid'][-1]:g} "
             f"({len(result['grid'])} ratios). The oracle is the phase oracle: r* per block (the workload's "
             "phases, at most 10 s each) from a convex fit of log P99 of the block replayed at every grid "
             "ratio. Oracle distance: mean |r - r*| per 1-s window, r the mean of the nodes' ratios, r* "
             "cluster-wide; band distance: from r to the ratios within 2 % of the fit's minimum; in phase: "
             "the same over the blocks whose lookahead stays in their own phase kind (all blocks without "
             "--oracle-lookahead); regret: P99 / the oracle's - 1.", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in COLUMNS) + " |" for r in result["results"]]
    if any("classes" in r for r in result["results"]):
        heads, body = class_columns(result["results"])
        lines += ["", f"Per class ({result['class_table']}, `--tenancy {result['tenancy']}`): P99 (ms) "
                  "and window SLO satisfaction against each class's own target; goodput, shed, and fairness: Jain's "
                  "index over the tenants' normalised service and the largest service gap (s) between tenants of a "
                  "band. The oracle's run is stitched from blocks and has none.", "",
                  "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        lines += ["| " + " | ".join(_fmt(v) for v in cells) + " |" for cells in body]
    return "\n".join(lines) + "\n\n![P99 and SLO](compare_p99_slo.png)\n![ratios](compare_ratios.png)\n" \
                              "![latency CDFs](compare_cdf.png)\n"
