"""The helmgr command line that reproduces each figure of an evaluation (the report names the exact
command of every figure)."""
from __future__ import annotations

from helmgr.experiments.evaluate import EvalConfig, Unit
from helmgr.experiments.phase_oracle import LOOKAHEAD_S
from helmgr.sim import SimConfig

DEFAULTS = SimConfig()


def cluster_flags(cfg: SimConfig) -> str:
    """The cluster options the run sets away from the defaults (`SimConfig()`), each after a space."""
    flags = []
    for name, flag in (("nodes", "--nodes"), ("engine", "--engine"), ("max_batch", "--max-batch"),
                       ("hardware", "--hardware"), ("model", "--model"), ("refill", "--refill")):
        if getattr(cfg, name) != getattr(DEFAULTS, name):
            flags.append(f"{flag} {getattr(cfg, name)}")
    if cfg.slo_ms != DEFAULTS.slo_ms and cfg.slo_ms is not None:
        flags.append(f"--slo-ms {cfg.slo_ms:g}")
    if cfg.tick_s != DEFAULTS.tick_s:
        flags.append(f"--tick-ms {cfg.tick_s * 1e3:g}")
    if cfg.refresh_s != DEFAULTS.refresh_s:
        flags.append(f"--refresh-s {cfg.refresh_s:g}")
    if cfg.emb_sample != DEFAULTS.emb_sample:
        flags.append(f"--emb-sample {cfg.emb_sample}")
    return "".join(f" {f}" for f in flags)


def run_flags(ev: EvalConfig) -> str:
    """The cluster options, and --allow-large where the evaluation was given it."""
    return cluster_flags(ev.cluster) + (" --allow-large" if ev.allow_large else "")


def grid_flag(grid) -> str:
    return "--ratios " + ",".join(f"{r:g}" for r in grid)


def workload_flags(ev: EvalConfig, regime: str, duration: float | None, rate: bool = True) -> str:
    """The workload options; `rate` False where the command names its own (capacity's start)."""
    flags = f"--workload {regime}" + (f" --time-compression {ev.time_compression:g}" if ev.time_compression else "")
    rps = ev.rps(regime) if rate else None
    return flags + (f" --duration {duration:g}" if duration is not None else "") + (
        f" --rps {rps:g}" if rps is not None else "")


def unit_command(ev: EvalConfig, unit: Unit) -> str:
    """The command whose JSON holds this unit's figures."""
    cluster = run_flags(ev)
    wl = workload_flags(ev, unit.regime, ev.duration_s)
    if unit.kind == "run":
        return f"helmgr simulate {wl} --seed {unit.seed}{cluster} --policy {unit.policy} --router {unit.router} --json"
    if unit.kind == "point":
        return (f"helmgr simulate {wl} --seed {unit.seed}{cluster} --policy static --ratio {unit.ratio:g} "
                f"--router {unit.router} --json")
    if unit.kind == "tenancy":
        wl = workload_flags(ev, unit.regime, ev.duration_s, rate=False) + f" --rps {ev.class_rps(unit.regime, unit.load):g}"
        return (f"helmgr simulate {wl} --seed {unit.seed}{cluster} --policy helm --router helm --classes {ev.classes} "
                f"--tenancy {unit.payload[1].tenancy} --json")
    if unit.kind == "oracle":
        ahead = f" --oracle-lookahead {ev.oracle_lookahead_s:g}" if ev.oracle_lookahead_s != LOOKAHEAD_S else ""
        return (f"helmgr compare {wl} --seed {unit.seed}{cluster} --policies oracle --routers {unit.router} "
                f"{grid_flag(ev.grid)}{ahead} --json")
    task = unit.payload
    policy = "static" if unit.policy == "static-best" else unit.policy
    ratio = f" --ratio {unit.ratio:g}" if unit.ratio is not None else ""
    classes = f" --classes {ev.classes} --tenancy {task.cfg.tenancy}" if unit.kind == "class-capacity" else ""
    return (f"helmgr capacity {workload_flags(ev, unit.regime, ev.capacity_duration_s, rate=False)} --seeds {unit.seed}"
            f"{cluster} --policy {policy}{ratio} --router {unit.router}{classes} --rps {task.start:g} "
            f"--tol {task.tol:g} --json")


def static_best_command(ev: EvalConfig, regime: str, seed: int, router: str) -> str:
    return (f"helmgr sweep {workload_flags(ev, regime, ev.duration_s)} --seed {seed}{run_flags(ev)} "
            f"--router {router} {grid_flag(ev.grid)} --json")


def check_command(ev: EvalConfig, regime: str) -> str:
    dur = f" --duration {ev.duration_s:g}" if ev.duration_s is not None else ""
    dur += f" --time-compression {ev.time_compression:g}" if ev.time_compression else ""
    dur += f" --rps {ev.rps(regime):g}" if ev.rps(regime) is not None else ""
    return (f"helmgr scenario --check --workloads {regime} "
            f"--seeds {','.join(map(str, ev.seeds))}{dur}{run_flags(ev)} --router {ev.check_router} "
            f"{grid_flag(ev.grid)} --json")
