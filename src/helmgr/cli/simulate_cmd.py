"""`helmgr simulate`: one run of the cluster simulator."""
from __future__ import annotations

import click

from helmgr.cli.output import (check_out, emit_json, json_option, json_text, markdown_table, out_option,
                               progress, result_dir, stderr, stdout, table)
from helmgr.cli.types import POSITIVE, Finite, profile_checked
from helmgr.cli.workload_cmd import build_workload, workload_options
from helmgr.memory.refill import REFILL_MODES
from helmgr.core.profiles import available
from helmgr.policy import POLICIES
from helmgr.routing import ROUTERS
from helmgr.sim import SimConfig, parse_fault, simulate
from helmgr.sim.config import ENGINES, SIM_PATHS

SHOWN = ("requests", "completed", "p50_ms", "p95_ms", "p99_ms", "p999_ms", "slo_ms", "slo_attainment",
         "window_slo_satisfaction", "throughput_rps", "goodput_rps", "emb_hit_rate", "kv_hit_rate", "h2d_gb",
         "refill_blocked_s", "mean_ratio", "burst_violation_share", "utilization", "peak_utilization", "overloaded",
         "rerouted", "wall_s", "sim_path")


def sim_options(f):
    """Options that build the simulated cluster; shared by simulate, sweep and compare."""
    options = [
        click.option("--nodes", type=click.IntRange(min=1), default=None, help="GPU nodes [default: the scenario's, 8]."),
        click.option("--policy", type=click.Choice(sorted(POLICIES)), default="static", show_default=True,
                     help="Memory policy that sets each node's EMB:KV ratio."),
        click.option("--ratio", type=Finite(0.0, 1.0), default=0.5, show_default=True,
                     help="EMB share of each node's pool (initial; fixed for static)."),
        click.option("--router", type=click.Choice(list(ROUTERS)), default="prefix-aware", show_default=True),
        click.option("--hardware", default="a100-80g", show_default=True, callback=profile_checked("hardware"),
                     help=f"Hardware preset ({', '.join(sorted(available('hardware')))}) or profile TOML."),
        click.option("--model", default="large", show_default=True, callback=profile_checked("model"),
                     help=f"Model preset ({', '.join(sorted(available('model')))}) or profile TOML."),
        click.option("--slo-ms", type=POSITIVE, default=None,
                     help="P99 latency target [default: the scenario's, 20 (v2); v1: the model preset's]."),
        click.option("--refill", type=click.Choice(list(REFILL_MODES)), default="lazy", show_default=True,
                     help="How grown EMB capacity is filled: sync (blocks the node), lazy, background."),
        click.option("--fail-node", "faults", multiple=True, metavar="I@T1[:T2]",
                     help="Take node I down at T1 s (back, cold, at T2 s). Repeatable."),
        click.option("--tick-ms", type=POSITIVE, default=10.0, show_default=True,
                     help="Controller tick."),
        click.option("--refresh-s", type=POSITIVE, default=2.0, show_default=True,
                     help="EMB cache refresh interval."),
        click.option("--max-batch", type=click.IntRange(1, 65536), default=None,
                     help="Requests a node takes together when it frees up [default: the scenario's, 8 (v2) or 1 (v1)]."),
        click.option("--engine", type=click.Choice(ENGINES), default=None,
                     help="Node model: serial (one request at a time, v1), batched, or pipelined (copies of the next "
                          "batch during this one's compute) [default: the scenario's, pipelined (v2)]."),
        click.option("--sim-path", type=click.Choice(SIM_PATHS), default="auto", show_default=True,
                     help="Per-request path: compiled, python, or auto (compiled where the configuration allows; "
                          "the summary's sim_path says which ran). Both give the same results."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def build_config(nodes, policy, ratio, router, hardware, model, slo_ms, refill, faults, tick_ms, refresh_s,
                 max_batch, seed, engine: str = "serial", sim_path: str = "auto") -> SimConfig:
    return SimConfig(nodes=nodes, policy=policy, ratio=ratio, router=router, hardware=hardware, model=model,
                     slo_ms=slo_ms, refill=refill, faults=tuple(parse_fault(f, nodes) for f in faults),
                     tick_s=tick_ms / 1e3, refresh_s=refresh_s, max_batch=max_batch, seed=seed,
                     engine=engine, path=sim_path).validate()


@click.command("simulate")
@workload_options
@sim_options
@json_option
@out_option
def simulate_cmd(scenario, regime, duration, seed, rps, trace, trace_format, time_compression, clone_users, overlay,
                 nodes, policy, ratio, router, hardware, model, slo_ms, refill, faults, tick_ms, refresh_s, max_batch,
                 engine, sim_path, as_json, out_dir):
    """Simulate a cluster serving a workload; report latency, SLO, hit rates and H2D traffic.

    With no options: the default scenario v2 (8 x A100-80G, large HSTU, batches of up to 8 on two
    engines, steady traffic, 360 s); `--scenario v1` the first version's.

    \b
    helmgr simulate --workload burst --ratio 0.7 --json
    helmgr simulate --nodes 8 --fail-node 2@20:40 --out results/fault
    """
    check_out(out_dir)
    cfg = build_config(nodes, policy, ratio, router, hardware, model, slo_ms, refill, faults, tick_ms, refresh_s,
                       max_batch, seed, engine, sim_path)
    w = build_workload(regime, duration, seed, rps, trace, trace_format, time_compression, clone_users, overlay,
                       scenario=scenario)
    with progress("simulating", w.duration_s) as bar:
        task = bar.add_task(f"simulating {w.name}", total=round(w.duration_s))
        result = simulate(cfg, w, on_progress=lambda t: bar.update(task, completed=round(t)))
    summary = result.summary
    with result_dir(out_dir) as scratch:
        if scratch is not None:
            from helmgr.experiments.plots import plot_simulation
            title = f"{w.name}, {nodes} nodes, {summary['policy']} r={ratio:g}, {summary['router']}"
            pngs = plot_simulation(result.series, title, scratch)
            (scratch / "summary.json").write_text(json_text(summary))
            (scratch / "summary.md").write_text(f"# {title}\n\n" + markdown_table({k: summary[k] for k in SHOWN})
                                                + "".join(f"\n![{p}]({p})\n" for p in pngs))
    if as_json:
        emit_json(summary)
    else:
        stdout.print(table(f"{w.name}: {nodes} nodes, {summary['policy']} r={ratio:g}, {summary['router']}",
                           {k: summary[k] for k in SHOWN}))
        if out_dir is not None:
            stderr.print(f"wrote {out_dir}/summary.json, summary.md and plots")
