"""`helmgr simulate`: one run of the cluster simulator."""
from __future__ import annotations

import os
from dataclasses import replace

import click

from helmgr.cli.output import (check_out, emit_json, json_option, json_text, markdown_table, out_option,
                               progress, result_dir, stderr, stdout, table)
from helmgr.cli.types import POSITIVE, Finite, classes_checked, profile_checked
from helmgr.cli.workload_cmd import workload_options, workload_spec
from helmgr.memory.refill import REFILL_MODES
from helmgr.core.profiles import available
from helmgr.policy import POLICIES
from helmgr.policy.policies import ABLATIONS as POLICY_ABLATIONS
from helmgr.routing import ROUTERS
from helmgr.routing.routers import ABLATIONS as ROUTER_ABLATIONS
from helmgr.sim import SimConfig, parse_fault, simulate
from helmgr.sim.config import ENGINES, MAX_EMB_SAMPLE, SIM_PATHS, TENANCIES
from helmgr.sim.metrics import TAIL

SHOWN = ("requests", "completed", "p50_ms", "p95_ms", "p99_ms", "p999_ms", *TAIL, "slo_ms", "slo_attainment",
         "window_slo_satisfaction", "throughput_rps", "goodput_rps", "emb_hit_rate", "kv_hit_rate", "h2d_gb",
         "refill_blocked_s", "mean_ratio", "burst_violation_share", "utilization", "peak_utilization", "overloaded",
         "rerouted", "wall_s", "sim_path")


SHOWCASE_HELP = " [default: static; with neither --policy nor --router, full HELM beside static-best + prefix-aware]"


def _kinds(known, product: str, ablations) -> str:
    """A registry's names as help text: the product, the baselines, the ablations (labelled)."""
    baselines = [n for n in known if n != product and n not in ablations]
    return f"{product} (HELM); baselines: {', '.join(baselines)}; ablations: {', '.join(ablations)}"


def sim_options(f=None, *, showcase: bool = False):
    """Options that build the simulated cluster; shared by simulate, sweep, compare and the rest.
    `showcase`: --policy and --router default to None (simulate's full HELM against the baseline)."""
    if f is None:
        return lambda g: sim_options(g, showcase=showcase)
    options = [
        click.option("--nodes", type=click.IntRange(min=1), default=None, help="GPU nodes [default: 8]."),
        click.option("--policy", type=click.Choice(sorted(POLICIES)), default=None if showcase else "static",
                     show_default=not showcase,
                     help="Memory policy that sets each node's EMB:KV ratio: "
                          + _kinds(POLICIES, "helm", POLICY_ABLATIONS) + "." + (SHOWCASE_HELP if showcase else "")),
        click.option("--ratio", type=Finite(0.0, 1.0), default=0.5, show_default=True,
                     help="EMB share of each node's pool (initial; fixed for static)."),
        click.option("--router", type=click.Choice(list(ROUTERS)), default=None if showcase else "prefix-aware",
                     show_default=not showcase,
                     help="Request router: " + _kinds(ROUTERS, "helm", ROUTER_ABLATIONS)
                          + (". [default: prefix-aware; see --policy]" if showcase else ".")),
        click.option("--hardware", default="a100-80g", show_default=True, callback=profile_checked("hardware"),
                     help=f"Hardware preset ({', '.join(sorted(available('hardware')))}) or profile TOML."),
        click.option("--model", default="large", show_default=True, callback=profile_checked("model"),
                     help=f"Model preset ({', '.join(sorted(available('model')))}) or profile TOML."),
        click.option("--slo-ms", type=POSITIVE, default=None,
                     help="P99 latency target [default: 20]."),
        click.option("--refill", type=click.Choice(list(REFILL_MODES)), default="lazy", show_default=True,
                     help="How grown EMB capacity is filled: sync (blocks the node), lazy, background, "
                          "or recovery (background while HELM's recovery tier holds the node, else lazy)."),
        click.option("--fail-node", "faults", multiple=True, metavar="I@T1[:T2]",
                     help="Take node I down at T1 s (back, cold, at T2 s). Repeatable."),
        click.option("--tick-ms", type=POSITIVE, default=10.0, show_default=True,
                     help="Controller tick."),
        click.option("--refresh-s", type=POSITIVE, default=2.0, show_default=True,
                     help="EMB cache refresh interval."),
        click.option("--max-batch", type=click.IntRange(1, 65536), default=None,
                     help="Requests a node takes together when it frees up [default: 8]."),
        click.option("--engine", type=click.Choice(ENGINES), default=None,
                     help="Node model: batched, or pipelined (two engines: copies of the next batch during this "
                          "one's compute) [default: pipelined]."),
        click.option("--sim-path", type=click.Choice(SIM_PATHS), default="auto", show_default=True,
                     help="Per-request path: compiled, python, or auto (compiled where the configuration allows; "
                          "the summary's sim_path says which ran). Both give the same results."),
        click.option("--emb-sample", type=click.IntRange(1, MAX_EMB_SAMPLE), default=1, show_default=True,
                     help="EMB caches track one item id in this many (a power of two) and scale their misses up "
                          "by it: faster, hit rates and P99 estimated (docs/simulator.md)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def class_options(f):
    """--classes and --tenancy (simulate, compare, capacity): the class table and how nodes serve it."""
    f = click.option("--tenancy", type=click.Choice(TENANCIES), default=None,
                     help="How each node serves the classes [default: helm with --classes]: blind (FCFS, one LRU; figures per "
                          "class only), strict "
                          "(priority bands, FCFS in each), quota (FCFS; each tenant a static KV partition, its "
                          "share), pools (separate nodes per class, sized by the classes' traffic shares; FCFS), "
                          "helm (bands with minimum shares; tenants by deficit round robin on uncached work; KV "
                          "evicted lowest band first down to kv_floor; with the HELM router, a sheddable class's "
                          "request predicted late is refused).")(f)
    return click.option("--classes", "class_table", default=None, metavar="NAME|FILE", callback=classes_checked,
                        help=f"SLO classes and tenants ({', '.join(available('classes'))}, or a TOML file): "
                             "figures per class and tenant, each against its class's target.")(f)


def with_classes(cfg: SimConfig, class_table, tenancy: str | None) -> SimConfig:
    """`cfg` serving `class_table` under `tenancy`, by default `helm` (`blind` without a table:
    nothing is served by class)."""
    default = "blind" if class_table is None else "helm"
    return replace(cfg, classes=class_table, tenancy=tenancy or default).validate()


def build_config(nodes, policy, ratio, router, hardware, model, slo_ms, refill, faults, tick_ms, refresh_s,
                 max_batch, seed, engine: str = "pipelined", sim_path: str = "auto", emb_sample: int = 1) -> SimConfig:
    return SimConfig(nodes=nodes, policy=policy, ratio=ratio, router=router, hardware=hardware, model=model,
                     slo_ms=slo_ms, refill=refill, faults=tuple(parse_fault(f, nodes) for f in faults),
                     tick_s=tick_ms / 1e3, refresh_s=refresh_s, max_batch=max_batch, seed=seed,
                     engine=engine, path=sim_path, emb_sample=emb_sample).validate()


@click.command("simulate")
@workload_options
@sim_options(showcase=True)
@class_options
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Worker processes for the side-by-side runs [default: all cores].")
@json_option
@out_option
def simulate_cmd(regime, duration, seed, rps, trace, trace_format, time_compression, clone_users, overlay,
                 nodes, policy, ratio, router, hardware, model, slo_ms, refill, faults, tick_ms, refresh_s, max_batch,
                 engine, sim_path, emb_sample, class_table, tenancy, jobs, as_json, out_dir):
    """Simulate a cluster serving a workload; report latency, SLO, hit rates and H2D traffic.

    With neither --policy nor --router: full HELM (the controller and the HELM router) beside
    static-best + prefix-aware, with each one's capacity headroom where capacity at SLO is stored
    for this configuration. With no options at all: the default scenario (8 x A100-80G, large
    HSTU, batches of up to 8 on two engines, steady traffic, 360 s). Name a policy or a router for one run (the other defaults to static / prefix-aware).

    \b
    helmgr simulate --out results/helm                 # HELM vs static-best + prefix-aware, with plots
    helmgr simulate --workload burst --policy static --ratio 0.7 --json
    helmgr simulate --nodes 8 --policy helm --router helm --fail-node 2@20:40 --out results/fault
    """
    check_out(out_dir)
    side_by_side = policy is None and router is None
    cfg = build_config(nodes, policy or "static", ratio, router or "prefix-aware", hardware, model, slo_ms, refill,
                       faults, tick_ms, refresh_s, max_batch, seed, engine, sim_path, emb_sample)
    cfg = with_classes(cfg, class_table, tenancy)
    spec = workload_spec(regime, duration, seed, rps, trace, trace_format, time_compression, clone_users, overlay)
    w = spec.build()                         # a bad trace or fault is refused here, before any work
    cfg.validate(w.duration_s)
    if side_by_side:
        return _side_by_side(spec, cfg, jobs, as_json, out_dir)
    with progress("simulating", w.duration_s) as bar:
        task = bar.add_task(f"simulating {w.name}", total=round(w.duration_s))
        result = simulate(cfg, w, on_progress=lambda t: bar.update(task, completed=round(t)))
    summary = result.summary
    with result_dir(out_dir) as scratch:
        if scratch is not None:
            from helmgr.experiments.plots import plot_simulation
            title = f"{w.name}, {nodes} nodes, {summary['policy']} r={ratio:g}, {summary['router']}"
            pngs = plot_simulation(result.series, title, scratch)
            if class_table is not None:
                from helmgr.experiments.plots import plot_class_windows
                from helmgr.sim.class_metrics import class_window_p99
                windows = class_window_p99(result.cluster.rec, class_table, w.duration_s, cfg.window_s)
                pngs += plot_class_windows(windows, result.series.bursts, f"{title}: per class", scratch)
            (scratch / "summary.json").write_text(json_text(summary))
            groups = "" if class_table is None else ("\n" + markdown_table(group_rows(summary), GROUP_SHOWN)
                                                     + f"\n{fairness_line(summary['fairness'])}\n")
            (scratch / "summary.md").write_text(f"# {title}\n\n" + markdown_table({k: summary[k] for k in SHOWN})
                                                + groups + "".join(f"\n![{p}]({p})\n" for p in pngs))
    if as_json:
        emit_json(summary)
    else:
        stdout.print(table(f"{w.name}: {nodes} nodes, {summary['policy']} r={ratio:g}, {summary['router']}",
                           {k: summary[k] for k in SHOWN}))
        if class_table is not None:
            stdout.print(table("per class and tenant", group_rows(summary), GROUP_SHOWN))
            stdout.print(fairness_line(summary["fairness"]))
        if out_dir is not None:
            stderr.print(f"wrote {out_dir}/summary.json, summary.md and plots")


GROUP_SHOWN = ("slo_ms", "requests", "shed", "p50_ms", "p99_ms", "slo_attainment", "window_slo_satisfaction", "goodput_rps",
               "kv_hit_rate", "emb_hit_rate")


def fairness_line(fairness: dict) -> str:
    """The run's fairness figures in words (a figure with nothing to measure: its reason)."""
    def shown(key: str, fmt: str) -> str:
        v = fairness.get(key)
        return fairness.get("nulls", {}).get(key, "none") if v is None or v != v else fmt.format(v)
    return (f"Jain's index {shown('jain', '{:.3f}')} (normalised service), {shown('jain_attainment', '{:.3f}')} "
            f"(SLO attainment); longest service gap within a band: {shown('max_gap_s', '{:.3f} s')}")


def group_rows(summary: dict) -> dict:
    """A run's class and tenant figures as table rows (GROUP_SHOWN)."""
    rows = {f"class {n}": tuple(f[k] for k in GROUP_SHOWN) for n, f in summary["classes"].items()}
    return rows | {f"tenant {n} ({f['class']})": tuple(f[k] for k in GROUP_SHOWN) for n, f in summary["tenants"].items()}


SIDE_BY_SIDE = ("p50_ms", "p99_ms", "p999_ms", "tail_wait_ms", "tail_service_ms", "tail_cold_share", "slo_ms",
                "window_slo_satisfaction", "slo_attainment", "throughput_rps", "emb_hit_rate", "kv_hit_rate",
                "mean_ratio", "utilization", "overloaded", "h2d_gb", "burst_violation_share", "wall_s", "sim_path")


def _side_by_side(spec, cfg, jobs, as_json, out_dir) -> None:
    """Full HELM beside static-best + prefix-aware (experiments.showcase)."""
    from helmgr.experiments.showcase import BASELINE_ROUTER, SOURCE, SWEEP, reference, showcase
    stored = reference(spec, cfg) is not None
    n_runs = 2 if stored else 1 + len(SWEEP)
    if not stored and not as_json:
        stderr.print(f"static-best is stored for the default scenario's regimes only: sweeping "
                     f"{', '.join(f'{r:g}' for r in SWEEP)} under {BASELINE_ROUTER} ({n_runs} runs; "
                     "name --policy or --router for one run)")
    with progress("simulating", n_runs) as bar:
        task = bar.add_task(f"HELM and static-best + {BASELINE_ROUTER}", total=n_runs)
        sc = showcase(spec, cfg, jobs or os.cpu_count() or 1, on_done=lambda _: bar.advance(task))
    (helm, helm_series), (base, base_series) = sc.helm, sc.baseline
    split = base["ratio"]
    source = (f"the evaluation's static-best for {spec.regime} ({SOURCE[spec.regime]})" if sc.stored
              else f"the best of {len(SWEEP)} static ratios on this run")
    helm_label, base_label = "HELM (helm + helm router)", f"static-best {split:g} + {BASELINE_ROUTER}"
    rows = {k: (helm[k], base[k]) for k in SIDE_BY_SIDE}
    for name in helm.get("classes", {}):
        for k in ("p99_ms", "window_slo_satisfaction"):
            rows[f"{k} [{name}]"] = (helm["classes"][name][k], base["classes"][name][k])
    caps = sc.capacity_rps or {}
    rows["capacity_rps"] = (caps.get("helm"), caps.get("baseline"))
    rows["capacity_headroom"] = (sc.headroom("helm"), sc.headroom("baseline"))
    verdict = (f"HELM's P99 is {abs(sc.p99_reduction):.1%} {'below' if sc.p99_reduction >= 0 else 'above'} "
               f"static-best + {BASELINE_ROUTER}'s (static {split:g}: {source}).")
    result = {"helm": helm, "static_best": base, "static_best_source": "stored" if sc.stored else "swept",
              "p99_reduction": sc.p99_reduction, "capacity_rps": sc.capacity_rps,
              "capacity_headroom": None if sc.capacity_rps is None else
              {k: sc.headroom(k) for k in sc.capacity_rps}}
    name = spec.regime if spec.trace is None else "trace"
    title = f"{name}: {cfg.nodes} nodes, full HELM vs static-best + {BASELINE_ROUTER}"
    with result_dir(out_dir) as scratch:
        if scratch is not None:
            from helmgr.experiments.plots import plot_showcase, plot_simulation
            plot_showcase({helm_label: helm_series, base_label: base_series}, title, scratch / "showcase.png")
            pngs = ["showcase.png"] + plot_simulation(helm_series, f"{title}: HELM", scratch)
            (scratch / "summary.json").write_text(json_text(result))
            (scratch / "summary.md").write_text(f"# {title}\n\n{verdict}\n\n"
                                                + markdown_table(rows, (helm_label, base_label))
                                                + "".join(f"\n![{p}]({p})\n" for p in pngs))
    if as_json:
        emit_json(result)
        return
    stdout.print(table(title, rows, (helm_label, base_label)))
    stdout.print(verdict)
    if sc.capacity_rps is None:
        where = f"stored for {spec.regime}" if sc.stored else "stored for this configuration"
        stdout.print(f"capacity at SLO: not {where} (helmgr capacity measures it)")
    elif "helm" not in sc.capacity_rps:
        stdout.print("HELM's capacity at SLO: not stored for this HELM (its base policy, adapter, recovery or "
                     "router changed since it was measured; helmgr capacity measures it)")
    if out_dir is not None:
        stderr.print(f"wrote {out_dir}/summary.json, summary.md, showcase.png and HELM's plots")
