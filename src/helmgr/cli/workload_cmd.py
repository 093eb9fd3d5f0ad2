"""`helmgr workload`: generate a stream (synthetic or trace replay) and describe it."""
from __future__ import annotations

import functools

import click

from helmgr.cli.output import (check_out, emit_json, json_option, json_text, markdown_table, out_option, progress,
                               result_dir, stderr, stdout, table)
from helmgr.cli.types import POSITIVE as positive, SEED, checked
from helmgr.core.errors import HelmInputError
from helmgr.sim.config import SimConfig
from helmgr.workload import FORMATS, OVERLAYS, WorkloadSpec, describe
from helmgr.workload.trace import WIDEN


def workload_options(f):
    """Options that pick a workload; shared by every command that runs one."""
    options = [
        click.option("--workload", "regime", default="steady", show_default=True,
                     help="Synthetic regime: steady, trend, burst, or trend+burst."),
        click.option("--duration", type=positive, default=None,
                     help="Simulated seconds [default: 360; a trace: 120]."),
        click.option("--seed", type=SEED, default=0, show_default=True, help="Random seed."),
        click.option("--rps", type=positive, default=None,
                     help="Base request rate of the synthetic workload, whole cluster [default: the regime's: "
                          "1,300; trend 2,200]."),
        click.option("--trace", type=click.Path(dir_okay=False), default=None, help="Replay this log instead of the synthetic workload."),
        click.option("--trace-format", type=click.Choice(FORMATS), default="inter", show_default=True,
                     help="inter: RecBole atomic file; sequences: 'user item item ...' per line."),
        click.option("--time-compression", type=positive, default=None,
                     help="A log: divide its time by this [default: fit the whole log into --duration]. A "
                          "synthetic regime: its whole shape (run, phases, bursts, day) this many times shorter."),
        click.option("--clone-users", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Replay each log user this many times under new ids, with jittered times."),
        click.option("--overlay", type=click.Choice(OVERLAYS), multiple=True,
                     help="Apply a regime to the log (repeatable): trend (popularity drift), burst (spikes of new sessions)."),
        click.option("--widen-catalogue", is_flag=True,
                     help="Give clone k of --clone-users K its own item ids (i + k x items): K x the catalogue."),
    ]
    f = widened(cluster_defaults(checked(f)))      # --allow-large; the run's estimate is checked first
    for option in reversed(options):
        f = option(f)
    return f


CLUSTER_OPTIONS = ("nodes", "max_batch", "engine", "slo_ms")     # left unset: SimConfig's default


def cluster_defaults(f):
    """Fill the options left unset: on commands that pick one workload, --duration (the regime's,
    or a trace's default); on commands that build a cluster, --nodes, --max-batch, --engine and
    --slo-ms from `SimConfig`'s defaults (the default scenario's cluster)."""
    @functools.wraps(f)
    def command(*args, **options):
        if "regime" in options and options.get("duration") is None:
            options["duration"] = WorkloadSpec(options["regime"], trace=options.get("trace"),
                                               time_compression=options.get("time_compression")).seconds
        default = SimConfig()
        for key in CLUSTER_OPTIONS:
            if key in options and options[key] is None:
                options[key] = getattr(default, key)
        return f(*args, **options)
    return command


def widened(f):
    """Carry --widen-catalogue to the workload as the trace overlay `widen` (what the spec holds)."""
    @functools.wraps(f)
    def command(*args, widen_catalogue: bool, **options):
        if widen_catalogue:
            if options["trace"] is None or options["clone_users"] < 2:
                raise click.UsageError("--widen-catalogue needs --trace and --clone-users K > 1 "
                                       "(clone k takes item ids i + k x items)")
            options["overlay"] = tuple(options["overlay"]) + (WIDEN,)
        return f(*args, **options)
    return command


def workload_spec(regime, duration, seed, rps, trace, trace_format, time_compression, clone_users,
                  overlay) -> WorkloadSpec:
    """The workload options as a picklable spec (what worker processes build their stream from)."""
    if trace is None and (overlay or clone_users != 1):
        raise HelmInputError("--overlay and --clone-users shape a log's replay: give --trace LOG")
    return WorkloadSpec(regime, duration, seed, rps, trace, trace_format, time_compression, clone_users,
                        tuple(overlay))


@click.command()
@workload_options
@json_option
@out_option
def workload(regime, duration, seed, rps, trace, trace_format, time_compression, clone_users, overlay, as_json,
             out_dir):
    """Generate a request stream and describe it: rates, users, prefixes, item skew, hot-set turnover.

    \b
    helmgr workload --workload burst --duration 120 --seed 1 --json
    helmgr workload --trace ml-100k.inter --trace-format inter --clone-users 8 --out results/ml100k
    """
    check_out(out_dir)
    w = workload_spec(regime, duration, seed, rps, trace, trace_format, time_compression, clone_users,
                      overlay).build()
    with progress("generating", None) as bar:
        task = bar.add_task("generating", total=int(-(-w.duration_s // 1.0)))
        summary, series = describe(w.chunks(1.0), w.duration_s, w.n_items, on_chunk=lambda: bar.advance(task),
                                   phases=w.phases)
    summary = {"workload": w.name, "seed": seed, "bursts": len(w.bursts)} | summary
    with result_dir(out_dir) as scratch:
        if scratch is not None:
            from helmgr.experiments.plots import plot_workload
            (scratch / "workload.json").write_text(json_text(summary))
            (scratch / "workload.md").write_text(f"# Workload `{w.name}` (seed {seed})\n\n" + markdown_table(summary)
                                                 + "\n![arrival rate and hot-set turnover](workload.png)\n")
            plot_workload(series, f"{w.name}, seed {seed}", scratch / "workload.png", w.bursts)
    if as_json:
        emit_json(summary)
    else:
        stdout.print(table(f"workload {w.name}", summary))
        if out_dir is not None:
            stderr.print(f"wrote {out_dir}/workload.json, workload.md, workload.png")
