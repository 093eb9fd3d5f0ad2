"""`helmgr bench`: speed figures: routing decisions, controller decisions, the simulator."""
from __future__ import annotations

import click
from rich.table import Table

from helmgr.cli.output import emit_json, json_option, progress, stdout
from helmgr.cli.types import names, node_sizes
from helmgr.core.errors import HelmInputError
from helmgr.policy import POLICIES
from helmgr.routing.routers import ROUTERS
from helmgr.sim.config import MAX_EMB_SAMPLE, SIM_PATHS


@click.command("bench")
@click.option("--router", "router_name", type=click.Choice(list(ROUTERS)), default="helm", show_default=True,
              help="Time this router's decisions.")
@click.option("--nodes", default=None, callback=node_sizes,
              help="Comma list of cluster sizes [default: 32,1024; with --sim 8,32,128].")
@click.option("--decisions", type=click.IntRange(100, 10_000_000), default=20000, show_default=True, help="Decisions per run.")
@click.option("--repeats", type=click.IntRange(1, 1000), default=3, show_default=True,
              help="Runs per size; the figures are their median.")
@click.option("--controller", is_flag=True, help="Time the HELM controller's decisions instead.")
@click.option("--policy", "policy_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="With --controller: an exported base policy [default: the shipped one].")
@click.option("--cold-mb", type=click.IntRange(0, 1024), default=0, show_default=True,
              help="With --controller: write over a buffer of this many MB between two decisions, "
                   "as the rest of a serving process would (a cold decision; a few times the last-level cache "
                   "is enough).")
@click.option("--sim", is_flag=True, help="Simulated requests per wall-second of the default scenario instead, "
                                          "with the split of wall time by phase and memory per node.")
@click.option("--routers", default="least-loaded,helm", show_default=True, help="With --sim: comma list of routers.")
@click.option("--duration", type=click.FloatRange(min=0.5, max=3600), default=10.0, show_default=True,
              help="With --sim: simulated seconds per run, at most --max-requests requests (128 nodes: 3.9 s).")
@click.option("--max-requests", type=click.IntRange(1000, 100_000_000), default=150_000, show_default=True,
              help="With --sim: cap on one run's requests (shortens the large clusters' runs).")
@click.option("--sim-path", "sim_paths", default="auto", show_default=True,
              help="With --sim: comma list of per-request paths to time (auto, compiled, python).")
@click.option("--emb-sample", "emb_samples", default="1", show_default=True,
              help="With --sim: comma list of EMB sampling rates to time (simulate --emb-sample).")
@click.option("--policies", "sim_policies", default="static", show_default=True,
              help="With --sim: comma list of memory policies to time (static at 0.5; helm: full HELM).")
@json_option
def bench_cmd(router_name, nodes, decisions, repeats, controller, policy_path, cold_mb, sim, routers, duration,
              max_requests, sim_paths, emb_samples, sim_policies, as_json):
    """Microseconds per routing decision (p50, p99, mean) at each cluster size, or with
    --controller per controller decision (p50, p99, p99.9).

    The router's index is filled as in a running cluster (resident bitmaps over 1 M items, users'
    prefixes spread over the nodes); requests are the default steady workload's. The controller
    sees varying window stats with a 4x burst every 5,000 windows.

    \b
    helmgr bench --router helm --nodes 32,1024
    helmgr bench --controller
    helmgr bench --controller --cold-mb 16 --decisions 2000
    helmgr bench --sim --nodes 8,32,128 --routers least-loaded,helm
    helmgr bench --sim --nodes 8 --routers helm --policies static,helm
    """
    if cold_mb and not controller:
        raise HelmInputError(f"--cold-mb {cold_mb} goes with --controller")
    if policy_path is not None and not controller:
        raise HelmInputError(f"--policy {policy_path!r} is the controller's: it goes with --controller")
    if sim:
        if controller:
            raise HelmInputError("--sim and --controller are two benches; choose one")
        return _sim(nodes or [8, 32, 128], names(routers, list(ROUTERS), "routers"), duration, max_requests,
                    names(sim_paths, list(SIM_PATHS), "sim-path"), sample_rates(emb_samples),
                    names(sim_policies, list(POLICIES), "policies"), as_json)
    if controller:
        from helmgr.experiments.bench import controller_bench
        r = controller_bench(policy_path, decisions, cold_mb=cold_mb)
        if as_json:
            emit_json(r)
        else:
            cold = f", {cold_mb} MB written between decisions" if cold_mb else ""
            stdout.print(f"controller ({r['policy']}{cold}): {r['steps']:,} decisions: p50 {r['p50_us']:.1f} us, "
                         f"p99 {r['p99_us']:.1f} us, p99.9 {r['p999_us']:.1f} us")
        return
    from helmgr.experiments.bench import router_bench
    sizes = nodes or [32, 1024]
    with progress("bench", None) as bar:
        task = bar.add_task(f"{router_name}: runs", total=len(sizes) * repeats)
        result = router_bench(router_name, sizes, decisions, repeats, on_done=lambda: bar.advance(task))
    if as_json:
        emit_json(result)
        return
    t = Table(title=f"{router_name}: us per decision ({decisions:,} decisions, median of {repeats} runs)")
    for c in ("nodes", "p50 us", "p99 us", "mean us", "p50 of each run"):
        t.add_column(c, justify="right")
    for row in result["sizes"]:
        t.add_row(str(row["nodes"]), f"{row['p50_us']:.2f}", f"{row['p99_us']:.2f}", f"{row['mean_us']:.2f}",
                  ", ".join(f"{x:.2f}" for x in row["p50_us_runs"]))
    stdout.print(t)


def sample_rates(text: str) -> list[int]:
    """`--emb-sample`'s comma list, each a power of two in [1, MAX_EMB_SAMPLE]."""
    try:
        rates = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise HelmInputError(f"--emb-sample {text!r} is not a comma list of integers") from None
    bad = [k for k in rates if not 1 <= k <= MAX_EMB_SAMPLE or k & (k - 1)]
    if bad or not rates:
        raise HelmInputError(f"--emb-sample {text!r}: {bad[0] if bad else 'empty list'} is not a power of two in "
                             f"[1, {MAX_EMB_SAMPLE}]")
    return rates


def _sim(sizes: list[int], routers: list[str], duration: float, max_requests: int, paths: list[str],
         samples: list[int], policies: list[str], as_json: bool) -> None:
    from helmgr.experiments.bench import sim_bench
    with progress("bench", None) as bar:
        task = bar.add_task("simulator: runs",
                            total=len(sizes) * len(routers) * len(paths) * len(samples) * len(policies))
        r = sim_bench(sizes, routers, duration, max_requests, on_done=lambda: bar.advance(task), paths=paths,
                      samples=samples, policies=policies)
    if as_json:
        emit_json(r)
        return
    t = Table(title=f"simulated req/s, default scenario ({r['rps_per_node']:g} req/s per node), one core; "
                    "wall time by phase (%)")
    sampled = samples != [1]                   # the sampling column only where a row is sampled
    policied = policies != ["static"]          # the policy column only where a row is not static
    cols = ("nodes", *(("policy",) if policied else ()), "router", "path", *(("sample",) if sampled else ()), "sim s",
            "requests", "req/s", "ids/req", "MB/node", *r["phases"])
    for c in cols:
        t.add_column(c.replace("_", " "), justify="right")
    for row in r["rows"]:
        t.add_row(str(row["nodes"]), *((row["policy"],) if policied else ()), row["router"], row["sim_path"],
                  *((str(row["emb_sample"]),) if sampled else ()),
                  f"{row['duration_s']:.1f}", f"{row['requests']:,}", f"{row['req_per_s']:,.0f}",
                  f"{row['ids_per_request']:,.0f}",
                  f"{row['setup_bytes_per_node'] / 2**20:.1f}",
                  *(f"{100 * row['phase_share'][p]:.0f}" for p in r["phases"]))
    stdout.print(t)
