"""`helmgr plan`: nodes, split policy and router for a target rate and SLO."""
from __future__ import annotations

import functools
import os
import time

import click
from rich.table import Table

from helmgr.cli.output import check_out, emit_json, json_option, json_text, out_option, progress, result_dir, stdout
from helmgr.cli.simulate_cmd import build_config, sim_options
from helmgr.cli.types import POSITIVE, Finite, allow_large_option, check_options, parallel_options, seed_list
from helmgr.cli.workload_cmd import cluster_defaults
from helmgr.core.errors import HelmInputError
from helmgr.experiments.plan import CANDIDATES, PlanConfig, plan
from helmgr.policy import POLICIES
from helmgr.routing import ROUTERS

FULL = {"seeds": "1,2,3", "duration": 60.0, "tol": 0.02, "candidates": ",".join(f"{p}@{r}" for p, r in CANDIDATES)}
QUICK = {"seeds": "1", "duration": 20.0, "tol": 0.05, "candidates": "helm@helm,static@prefix-aware"}


def _pairs(text: str) -> tuple[tuple[str, str], ...]:
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        policy, _, router = item.partition("@")
        if policy not in POLICIES or router not in ROUTERS:
            raise HelmInputError(f"--candidates {text!r}: {item!r} is not POLICY@ROUTER "
                                 f"(policies: {', '.join(POLICIES)}; routers: {', '.join(ROUTERS)})")
        out.append((policy, router))
    if not out:
        raise HelmInputError(f"--candidates {text!r}: name at least one POLICY@ROUTER")
    return tuple(out)


@click.command("plan")
@click.option("--rps", type=POSITIVE, required=True, help="Target request rate of the whole cluster.")
@click.option("--workload", "traffic", default="steady", show_default=True, help="The traffic to plan for.")
@click.option("--seeds", default=None, help=f"Comma list of seeds [default: {FULL['seeds']}; --quick {QUICK['seeds']}].")
@click.option("--duration", type=POSITIVE, default=None,
              help=f"Simulated seconds of each run [default: {FULL['duration']:g}; --quick {QUICK['duration']:g}].")
@sim_options
@click.option("--candidates", default=None, help=f"Comma list of POLICY@ROUTER [default: {FULL['candidates']}; "
                                                 f"--quick {QUICK['candidates']}]; static holds --ratio.")
@click.option("--tol", type=Finite(0, 1, min_open=True, max_open=True), default=None,
              help=f"Capacity bisection tolerance [default: {FULL['tol']:g}; --quick {QUICK['tol']:g}].")
@click.option("--quick", is_flag=True, help="One seed, short runs, two candidates; the headroom is estimated.")
@parallel_options
@json_option
@out_option
@functools.partial(allow_large_option, runs=False)
@cluster_defaults
def plan_cmd(rps, traffic, seeds, duration, nodes, policy, ratio, router, hardware, model, slo_ms, refill,
             faults, tick_ms, refresh_s, max_batch, engine, sim_path, emb_sample, candidates, tol, quick, jobs, ray_address,
             as_json, out_dir, allow_large):
    """How many nodes serve RPS within the SLO, with which split policy and router, and the
    headroom left: capacity at SLO of each candidate on a probe cluster (--nodes), scaled to the
    target, the choice simulated back at the target rate.

    \b
    helmgr plan --rps 5000 --slo-ms 20 --quick
    helmgr plan --rps 20000 --hardware h100-80g --out results/plan
    """
    if policy != "static":
        raise click.UsageError(f"--policy {policy!r}: plan weighs the POLICY@ROUTER pairs of --candidates")
    preset = QUICK if quick else FULL
    check_options({"rps": rps, "duration": duration or preset["duration"], "nodes": nodes, "tick_ms": tick_ms,
                   "refresh_s": refresh_s}, allow_large)         # the check at the target rate
    check_out(out_dir)
    wall = time.perf_counter()
    pc = PlanConfig(rps=rps, cluster=build_config(nodes, "static", ratio, router, hardware, model, slo_ms, refill,
                                                  faults, tick_ms, refresh_s, max_batch, 0, engine, sim_path, emb_sample),
                    regime=traffic, seeds=tuple(seed_list(seeds or preset["seeds"])),
                    duration_s=duration or preset["duration"], tol=tol or preset["tol"],
                    candidates=_pairs(candidates or preset["candidates"]), quick=quick,
                    allow_large=allow_large)
    pc.spec(pc.seeds[0]).build()                     # validates the workload options up front
    with progress("planning", None) as bar:
        task = bar.add_task(f"capacity of {len(pc.candidates)} candidates x {len(pc.seeds)} seeds", total=None)
        result = plan(pc, jobs or os.cpu_count() or 1, ray_address, lambda: bar.advance(task))
    result = {"workload": traffic, "hardware": hardware, "model": model,
              "slo_ms": pc.cluster.slo_ms, "quick": quick, "wall_s": time.perf_counter() - wall} | result
    with result_dir(out_dir) as scratch:
        if scratch is not None:
            from helmgr.experiments.eval_plots import plot_plan
            (scratch / "plan.json").write_text(json_text(result))
            plot_plan(result, scratch / "plan_capacity.png")
    if as_json:
        emit_json(result)
        return
    t = Table(title=f"plan for {rps:g} req/s at P99 <= {pc.cluster.slo_ms:g} ms ({hardware}, {model}; "
                    f"{result['wall_s']:.0f} s)")
    for c in ("candidate", f"capacity on {pc.cluster.nodes} nodes", "per node", "nodes needed"):
        t.add_column(c, justify="right")
    for r in result["candidates"]:
        t.add_row(f"{r['policy']}@{r['router']}", _num(r["capacity_rps"]), _num(r["per_node_rps"]), _num(r["nodes"]))
    stdout.print(t)
    p = result["plan"]
    if p is None:
        stdout.print(f"no plan: {result['reason']}")
        return
    if p["met_slo"] is None:
        stdout.print(f"plan: {p['nodes']} nodes, {p['policy']} split, {p['router']} routing, from capacity on "
                     f"{pc.cluster.nodes} nodes scaled linearly, not simulated: {p['unchecked']}")
        return
    how = "measured" if p["capacity_measured"] else "estimated (linear, --quick)"
    sat = [c["window_slo_satisfaction"] for c in p["checks"] if c["window_slo_satisfaction"] is not None]
    p99 = [c["p99_ms"] for c in p["checks"] if c["p99_ms"] is not None]
    measured = (f"window SLO {min(sat):.3f}, P99 {max(p99):.2f} ms" if len(sat) == len(p["checks"]) and p99
                else "a seed's run was stopped: it fell a second behind")
    headroom = f", headroom {p['headroom']:+.0%}" if p["headroom"] is not None else ""
    stdout.print(f"plan: {p['nodes']} nodes, {p['policy']} split, {p['router']} routing; simulated at {rps:g} req/s "
                 f"it {'meets' if p['met_slo'] else 'MISSES'} the SLO ({measured}); capacity "
                 f"{_num(p['capacity_rps'])} req/s {how}{headroom}")


def _num(v) -> str:
    return "—" if v is None else f"{v:,.0f}"
