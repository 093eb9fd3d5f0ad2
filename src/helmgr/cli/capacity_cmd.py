"""`helmgr capacity`: capacity at SLO of one policy + router, one bisection per seed."""
from __future__ import annotations

import functools
import os
import time

import click
from rich.table import Table

from helmgr.cli.output import check_out, emit_json, json_option, json_text, out_option, progress, result_dir, stdout
from helmgr.cli.simulate_cmd import build_config, class_options, sim_options, with_classes
from helmgr.cli.types import POSITIVE, Finite, allow_large_option, check_options, parallel_options, seed_list
from helmgr.cli.workload_cmd import cluster_defaults
from helmgr.experiments.capacity import TARGET, TOL, capacity
from helmgr.experiments.showcase import HELM, stack_revision
from helmgr.workload import WorkloadSpec


@click.command("capacity")
@click.option("--workload", "regime", default="steady", show_default=True, help="Synthetic regime.")
@click.option("--duration", type=POSITIVE, default=None, help="Simulated seconds of each probe [default: 360].")
@click.option("--time-compression", type=POSITIVE, default=None, metavar="F",
              help="The regime's whole shape (run, phases, bursts, day) F times shorter.")
@click.option("--seeds", default="1", show_default=True, help="Comma list of seeds: one bisection each, in parallel.")
@click.option("--rps", type=POSITIVE, default=None, help="The first rate probed [default: the regime's base rate].")
@sim_options
@class_options
@click.option("--tol", type=Finite(0, 1, min_open=True, max_open=True), default=TOL, show_default=True,
              help="Stop when the failing rate is within this share above the passing one.")
@click.option("--target", type=Finite(0, 1, min_open=True), default=TARGET, show_default=True,
              help="Window SLO satisfaction a rate must keep.")
@parallel_options
@json_option
@out_option
@functools.partial(allow_large_option, runs=False)
@cluster_defaults
def capacity_cmd(regime, duration, time_compression, seeds, rps, nodes, policy, ratio, router, hardware, model, slo_ms, refill,
                 faults, tick_ms, refresh_s, max_batch, engine, sim_path, emb_sample, class_table, tenancy, tol, target, jobs,
                 ray_address, as_json, out_dir, allow_large):
    """The highest base request rate at which POLICY + ROUTER keeps window SLO satisfaction >=
    TARGET (and is not overloaded): bisection over the rate to within TOL, per seed; the
    capacity is the lowest seed's. With --classes, every class must keep it, each against its
    own target. The first probe is held to the limits every run is; the search probes no rate
    whose run would pass them (a capacity at that rate, with no failing rate, is at least it)
    unless --allow-large.

    \b
    helmgr capacity --policy helm --router helm --seeds 1,2,3
    helmgr capacity --workload burst --ratio 0.7 --router prefix-aware --duration 120 --json
    """
    check_options({"rps": rps, "regime": regime, "duration": duration, "nodes": nodes, "tick_ms": tick_ms,
                   "refresh_s": refresh_s, "time_compression": time_compression}, allow_large)
    check_out(out_dir)
    wall = time.perf_counter()
    seed_values = seed_list(seeds)
    cfg = build_config(nodes, policy, ratio, router, hardware, model, slo_ms, refill, faults, tick_ms, refresh_s,
                       max_batch, seed_values[0], engine, sim_path, emb_sample)
    cfg = with_classes(cfg, class_table, tenancy)
    spec = WorkloadSpec(regime, duration, seed_values[0], time_compression=time_compression)
    spec.build()                                       # validates the workload options up front
    with progress("bisecting", len(seed_values)) as bar:
        task = bar.add_task(f"capacity of {policy}@{router}: {len(seed_values)} seeds", total=len(seed_values))
        out = capacity(spec, cfg, seed_values, jobs or os.cpu_count() or 1, ray_address, tol, target, rps,
                       lambda: bar.advance(task), allow_large)
    result = {"workload": regime, "nodes": nodes, "policy": policy, "router": router,
              "ratio": ratio, "tol": tol, "target": target, "wall_s": time.perf_counter() - wall,
              "class_table": None if class_table is None else class_table.source,
              "tenancy": None if class_table is None else cfg.tenancy,
              "helm_revision": stack_revision() if (policy, router) == HELM else None} | out
    with result_dir(out_dir) as scratch:
        if scratch is not None:
            (scratch / "capacity.json").write_text(json_text(result))
    if as_json:
        emit_json(result)
        return
    t = Table(title=f"capacity at SLO: {policy}@{router}, {regime}, {nodes} nodes ({result['wall_s']:.0f} s)")
    for c in ("seed", "capacity_rps", "fails_at_rps", "probes"):
        t.add_column(c, justify="right")
    for s, b in out["seeds"].items():
        t.add_row(s, _fmt(b["capacity_rps"]), _fmt(b["fails_at_rps"]), str(len(b["probes"])))
    t.add_row("all", _fmt(out["capacity_rps"]), "", "")
    stdout.print(t)


def _fmt(v) -> str:
    return "—" if v is None else f"{v:,.0f}"
