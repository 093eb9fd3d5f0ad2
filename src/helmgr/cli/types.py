"""Option types and the checks a command runs before any work (a bad value is one line
naming it, exit 2).

click's FloatRange lets `inf` and `nan` through (`nan` compares false with every bound), so every
float option is a `Finite`; seeds are bounded integers; `checked` adds `--allow-large` and refuses,
before the command starts, a run whose estimate (core.validate) is past a limit.
"""
from __future__ import annotations

import functools
import math
from dataclasses import replace

import click
from click.core import ParameterSource

from helmgr.core.classes import load_table
from helmgr.core.errors import HelmInputError
from helmgr.core.profiles import load_hardware, load_model
from helmgr.core.validate import (GIB, LIMITS, SEED_MAX, Cost, check_costs, count_lines, refresh_rows,
                                  run_memory_bytes)
from helmgr.sim.config import SimConfig, check_faults, parse_fault
from helmgr.workload.synthetic import SyntheticConfig, default_config


class Finite(click.FloatRange):
    """A FloatRange that refuses non-finite values (`inf`, `-inf`, `nan`, `1e999`)."""

    name = "finite float"

    def convert(self, value, param, ctx):
        number = value if isinstance(value, float) else click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


POSITIVE = Finite(min=0, min_open=True)
NON_NEGATIVE = Finite(min=0)
SEED = click.IntRange(0, SEED_MAX)


def profile_checked(kind: str):
    """A callback for `--hardware` / `--model`: load (and so validate) the profile while the options
    are parsed, so a bad file is refused before any work; the option's value stays the name."""
    def callback(ctx, param, value):
        if value is not None:
            (load_hardware if kind == "hardware" else load_model)(value)
        return value
    return callback


def classes_checked(ctx, param, value):
    """A callback for `--classes`: the class table, loaded (and so checked) while options are parsed."""
    return None if value is None else load_table(value)


BENCH_NODES_MAX = 16_384             # the router index holds a 1M-item bitmap per node (~128 KiB each)


def node_sizes(ctx, param, value):
    """A callback for `bench --nodes`: a comma list of cluster sizes, each in [1, BENCH_NODES_MAX]
    (None: the command's default)."""
    if value is None:
        return None
    try:
        sizes = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise HelmInputError(f"--nodes {value!r} is not a comma list of node counts (e.g. 32,1024)") from None
    bad = [n for n in sizes if not 1 <= n <= BENCH_NODES_MAX]
    if bad or not sizes:
        raise HelmInputError(f"--nodes {value!r}: every node count must be >= 1 and at most {BENCH_NODES_MAX:,}"
                             + (f", got {bad[0]}" if bad else ""))
    return sizes


def names(text: str, known, what: str) -> list[str]:
    """A comma list of names, each one of `known` (`--what` in the error)."""
    listed = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in listed if x not in known]
    if bad or not listed:
        raise HelmInputError(f"--{what} {text!r}: unknown {bad[0] if bad else 'empty list'} (known: {', '.join(known)})")
    return listed


def seed_list(text: str, option: str = "--seeds") -> list[int]:
    """A comma list of seeds (`option`), each in [0, SEED_MAX]."""
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise HelmInputError(f"{option} {text!r} is not a comma list of integers") from None
    if not seeds or any(not 0 <= s <= SEED_MAX for s in seeds):
        raise HelmInputError(f"{option} {text!r}: give one or more seeds in [0, {SEED_MAX}]")
    return seeds


def positive_list(text: str, what: str) -> list[float]:
    """A comma list of finite positive numbers (`--what` in the error)."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise HelmInputError(f"--{what} {text!r} is not a comma list of numbers") from None
    bad = [v for v in values if not (math.isfinite(v) and v > 0)]
    if bad or not values:
        raise HelmInputError(f"--{what} {text!r}: every value must be a finite number > 0, got "
                             f"{bad[0] if bad else 'none'}")
    return values


def parallel_options(f):
    """--jobs and --ray-address: where the independent runs go (experiments.parallel)."""
    f = click.option("--ray-address", default=None, metavar="ADDR",
                     help="Run on a Ray cluster: 'auto', an address (host:6379, ray://host:10001), or 'local' "
                          "(start one here with --jobs CPUs) [default: local processes].")(f)
    return click.option("--jobs", type=click.IntRange(min=1), default=None,
                        help="Worker processes (1: in this process) [default: all cores].")(f)


GRID_POINTS_MAX = 1_000_001          # a ratio grid finer than 1e-6 is below one page of any pool


def grid_size(text: str) -> float:
    """Points of a `start:stop:step` (inclusive: stop is the last point when whole steps reach it,
    else the last point before it) or comma-list grid, without building it."""
    try:
        if ":" in text:
            start, stop, step = (float(x) for x in text.split(":"))
            if not all(map(math.isfinite, (start, stop, step))) or step <= 0 or stop < start:
                raise ValueError
            steps = (stop - start) / step          # whole steps that stay within stop (a hair of rounding kept)
            return math.floor(steps * (1 + 1e-12) + 1e-9) + 1 if math.isfinite(steps) else math.inf
        return len([float(x) for x in text.split(",")])
    except ValueError:
        raise HelmInputError(f"--ratios {text!r} is not start:stop:step or a comma list of numbers") from None


def ratio_grid(text: str) -> list[float]:
    """'0.05:0.95:0.05' (start:stop:step, inclusive) or '0.1,0.3,0.5': every ratio in [0, 1]."""
    n = grid_size(text)
    if n > GRID_POINTS_MAX:
        count = f"{n:,}" if n < 1e12 else f"{float(n):.3g}"
        raise HelmInputError(f"--ratios {text!r} has {count} points (at most {GRID_POINTS_MAX:,})")
    if ":" in text:
        start, _, step = (float(x) for x in text.split(":"))
        values = [round(start + k * step, 10) for k in range(n)]
    else:
        values = [float(x) for x in text.split(",")]
    bad = [v for v in values if not 0.0 <= v <= 1.0]
    if bad or not values:
        raise HelmInputError(f"--ratios {text!r}: every ratio must be in [0, 1], got {bad[0] if bad else 'none'}")
    return values


def _run_count(o: dict) -> tuple[float, str] | None:
    """Simulation runs a sweep (one per ratio) or a compare (policies x routers, plus a sweep and an
    oracle replay per router) queues."""
    if o.get("ratios") is None:
        return None
    grid = grid_size(o["ratios"])
    if "policies" not in o:
        return grid, f"--ratios {o['ratios']!r}"
    names = [x for x in o["policies"].split(",") if x.strip()]
    routers = len([x for x in (o.get("routers") or "x").split(",") if x.strip()]) or 1
    grid_runs = grid * sum(n.strip() in ("static-best", "oracle") for n in names)
    return routers * (len(names) + grid_runs), f"--ratios {o['ratios']!r} with --policies {o['policies']!r}"


LABELS = {"rps": "--rps {:g}", "duration": "--duration {:g}", "tick_ms": "--tick-ms {:g}", "refresh_s": "--refresh-s {:g}",
          "nodes": "--nodes {}", "clone_users": "--clone-users {}"}
# how a cost names a value the command was not given: as the default it is
DEFAULTED = {"rps": "{:g} req/s", "duration": "{:g} s", "tick_ms": "a {:g}-ms tick", "refresh_s": "a refresh every {:g} s",
             "nodes": "{} nodes"}


def defaulted(keys, time_compression: float | None = None) -> dict[str, str]:
    """`DEFAULTED`'s labels of `keys` (a run's length after its --time-compression)."""
    out = {k: DEFAULTED[k] for k in keys}
    if "duration" in out and time_compression:
        out["duration"] += f" (--time-compression {time_compression:g})"
    return out


def option_costs(o: dict, labels: dict[str, str] | None = None) -> list[Cost]:
    """What the options ask of one run (requests, ticks, memory) and of the command (runs).
    `labels`: how a cost names a value (a format with one field), by key, over `LABELS`."""
    lab = LABELS | (labels or {})
    duration, nodes = o.get("duration", 0.0), o.get("nodes", 0)
    dur = lab["duration"].format(duration)
    costs, trace_rows, requests = [], 0.0, 0.0
    if o.get("trace") is not None:
        lines = count_lines(o["trace"])
        if lines is not None:
            trace_rows = requests = float(lines) * o.get("clone_users", 1)
            costs.append(Cost("requests", requests, LIMITS.requests,
                              f"--trace {o['trace']!r} ({lines:,} lines) x {lab['clone_users'].format(o.get('clone_users', 1))}"))
    else:
        rps = o.get("rps") or (default_config(o["regime"]) if o.get("regime") else SyntheticConfig()).rps
        requests = rps * duration
        costs.append(Cost("requests", requests, LIMITS.requests, f"{lab['rps'].format(rps)} x {dur}"))
    if "tick_ms" in o:
        ticks = duration / (o["tick_ms"] / 1e3) + duration
        costs.append(Cost("controller ticks", ticks, LIMITS.events, f"{dur} / {lab['tick_ms'].format(o['tick_ms'])}"))
    memory = run_memory_bytes(requests, nodes, trace_rows) / GIB
    costs.append(Cost("GiB of memory", memory, LIMITS.memory_gib,
                      f"{lab['nodes'].format(nodes)} with ~{requests:.3g} requests" + (" replayed" if trace_rows else "")))
    if "refresh_s" in o and o.get("trace") is None:
        items = SyntheticConfig().n_items
        rows = refresh_rows(duration, o["refresh_s"], nodes, items)
        costs.append(Cost("EMB rows re-ranked", rows, LIMITS.refresh_rows,
                          f"{dur} / {lab['refresh_s'].format(o['refresh_s'])} x {lab['nodes'].format(nodes)} x "
                          f"{items:,} items"))
    runs = _run_count(o)
    if runs is not None:
        costs.append(Cost("runs", runs[0], LIMITS.runs, runs[1]))
    return costs


def spec_costs(spec, nodes: int, what: str = "", labels: dict[str, str] | None = None, tick_ms: float | None = None,
               refresh_s: float | None = None) -> list[Cost]:
    """What one run of a workload spec (`WorkloadSpec`) asks for on `nodes` nodes, `what` (e.g.
    "steady: ") before each cost's options, `labels` (see `option_costs`) naming the options the
    values came from. The rate, duration, tick and refresh a command did not set are named as the
    defaults they are."""
    default = SimConfig()
    o = {"rps": spec.rps, "regime": spec.regime, "duration": spec.seconds, "nodes": nodes, "trace": spec.trace,
         "clone_users": spec.clone_users, "tick_ms": tick_ms or default.tick_s * 1e3,
         "refresh_s": refresh_s or default.refresh_s}
    unset = [k for k, v in (("rps", spec.rps), ("duration", spec.duration_s), ("tick_ms", tick_ms),
                            ("refresh_s", refresh_s)) if v is None]
    auto = defaulted(unset, spec.time_compression)
    return [replace(c, because=what + c.because) for c in option_costs(o, auto | (labels or {}))]


def check_options(o: dict, allow_large: bool = False) -> None:
    """The checks that need several options at once, before the command does any work; a cost
    names the options the command was given, and a value it was not as the default it is."""
    if o.get("faults"):
        nodes = o.get("nodes")
        check_faults(tuple(parse_fault(f, nodes) for f in o["faults"]), o.get("duration"))
    check_costs(option_costs(o, default_labels(o)), allow_large)


def default_labels(o: dict) -> dict[str, str]:
    """`option_costs` labels for the values of `o` the running command's line did not give."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return {}
    unset = [k for k in DEFAULTED if not (k in ctx.params and ctx.get_parameter_source(k) is ParameterSource.COMMANDLINE)]
    return defaulted(unset, o.get("time_compression"))


def checked(f):
    """Add `--allow-large` to a command and run `check_options` on its options before it starts."""
    @functools.wraps(f)
    def command(*args, allow_large: bool = False, **options):
        check_options(options, allow_large)
        return f(*args, **options)
    return allow_large_option(command)


def allow_large_option(f, runs: bool = True):
    """--allow-large: run past the limits `check_costs` holds a command to (`runs`: the command's
    count of runs among them)."""
    return click.option("--allow-large", is_flag=True, help=(
        f"Run even past the limits checked before a run: {LIMITS.requests:,.0f} requests, "
        f"{LIMITS.events:,.0f} controller ticks, {LIMITS.refresh_rows:.0e} EMB rows re-ranked and "
        f"{LIMITS.memory_gib:g} GiB per run" + (f", {LIMITS.runs:,} runs per command." if runs else ".")))(f)
