"""`helmgr train`: PPO on the simulator, exported to a numpy policy file."""
from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource

from helmgr.cli.output import emit_json, json_option, progress, stdout, table
from helmgr.cli.types import POSITIVE, SEED, Finite, allow_large_option, defaulted, names, seed_list, spec_costs
from helmgr.core.errors import HelmInputError
from helmgr.core.profiles import available
from helmgr.core.validate import LIMITS, Cost, check_costs
from helmgr.core.files import check_writable
from helmgr.core.extras import require
from helmgr.workload.synthetic import parse_regime
from helmgr.workload.trace import FORMATS, OVERLAYS, WIDEN

TRACE_TRAIN_S = 600.0       # a log's replay for training, by default: episodes of 15 + 120 s in its first 480 s
ENV_GIB = 0.5               # one environment's worker process: interpreter, torch and its workload (~0.4 GB measured)


@click.command("train")
@click.option("--timesteps", type=click.IntRange(64, 10**9), default=20000, show_default=True,
              help="Transitions: one node's 1-s control window each (with --nodes N, N a simulated second).")
@click.option("--seed", type=SEED, default=1, show_default=True)
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=Path("policy.npz"),
              show_default=True, help="Where the exported policy goes (.npz).")
@click.option("--workloads", default="steady,trend,burst", show_default=True,
              help="Comma list of regimes episodes are drawn from.")
@click.option("--episode-s", type=Finite(min=2), default=120.0, show_default=True,
              help="Controlled seconds an episode (after its warm-up), a stretch of the regime's run.")
@click.option("--hardware", default="a100-80g", show_default=True,
              help="Comma list of hardware presets episodes are drawn from.")
@click.option("--model", default="large", show_default=True, help="Comma list of model presets episodes are drawn from.")
@click.option("--runs-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
              help="Where the run's CSV log of reward and losses goes.")
@click.option("--nodes", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Nodes of the default cluster an episode runs (each its share of the rate and users) under "
                   "the router, each deciding its own ratio and paid its own reward: one transition a node "
                   "(1: a node alone).")
@click.option("--envs", "n_envs", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Environments stepped in parallel worker processes.")
@click.option("--relative", is_flag=True,
              help="Pay the reward minus a twin cluster's held at the starting ratio (2x the simulation).")
@click.option("--init", "init_path", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Start the actor from this policy file (one with fewer inputs is widened; the critic starts "
                   "fresh, the actor held for its first steps) instead of from scratch.")
@click.option("--checkpoint-every", type=click.IntRange(min=1), default=None, metavar="N",
              help="Also export the policy every N transitions, as checkpoint-<transitions>.npz in the run's folder.")
@click.option("--target-kl", type=Finite(0, 10, min_open=True), default=None, metavar="KL",
              help="Stop a PPO update's epochs once its approximate KL passes 1.5 x KL [default: none, every epoch].")
@click.option("--seeds", default=None, metavar="LIST",
              help="Train one policy per seed (in parallel, --jobs), validate each, write the best to --out "
                   "(instead of --seed).")
@click.option("--validate-seeds", default="101,102,103", show_default=True,
              help="With --seeds: the workload seeds of the validation runs (the regimes on the 8-node cluster).")
@click.option("--validate-duration", type=Finite(min=1), default=None,
              help="With --seeds: simulated seconds of each validation run [default: 360].")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="With --seeds: worker processes for the training runs and the validation runs [default: all cores].")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Train on this log's replay instead of the synthetic regimes (served whole by --nodes nodes), "
                   "then validate on its held-out tail beside the shipped policy.")
@click.option("--trace-format", type=click.Choice(FORMATS), default="inter", show_default=True,
              help="With --trace: inter (RecBole atomic file) or sequences ('user item item ...' per line).")
@click.option("--duration", type=Finite(min=1), default=None,
              help=f"With --trace: the replay's length in simulated seconds [default: {TRACE_TRAIN_S:g}].")
@click.option("--time-compression", type=POSITIVE, default=None,
              help="With --trace: divide the log's time by this [default: fit it into --duration].")
@click.option("--clone-users", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --trace: replay each log user this many times under new ids.")
@click.option("--overlay", type=click.Choice(OVERLAYS), multiple=True,
              help="With --trace: apply a regime to the log (repeatable): trend, burst.")
@click.option("--widen-catalogue", is_flag=True,
              help="With --trace: clone k of --clone-users K reads its own item ids (K x the catalogue).")
@click.option("--holdout", type=Finite(0.05, 0.5), default=0.2, show_default=True,
              help="With --trace: the share of the replay, at its end, never trained on and validated on.")
@json_option
@allow_large_option
def train_cmd(timesteps, seed, out_path, workloads, episode_s, hardware, model, runs_dir, nodes, n_envs,
              relative, init_path, checkpoint_every, target_kl, seeds, validate_seeds, validate_duration, jobs,
              trace, trace_format, duration, time_compression, clone_users, overlay, widen_catalogue, holdout,
              as_json, allow_large):
    """Train the base policy with PPO (Stable-Baselines3) and export it for the numpy controller.

    \b
    helmgr train --timesteps 20000 --seed 1 --out policy.npz
    helmgr train --timesteps 200000 --seed 2 --hardware a100-80g,h100-80g,h200-141g --model large,small --envs 2
    helmgr train --timesteps 150000 --seeds 1,2,3 --relative --out policy.npz      # the best on validation seeds
    helmgr train --timesteps 61440 --seeds 7,8 --relative --init src/helmgr/controller/default_policy.npz
    helmgr train --timesteps 368640 --seeds 11 --nodes 4 --relative --checkpoint-every 61440
    helmgr train --trace ml-100k.inter --timesteps 20000 --overlay burst --out mine.npz   # on a log, validated
    """
    require("train", what="helmgr train")
    check_paths(out_path, runs_dir)
    regimes = tuple(x.strip() for x in workloads.split(",") if x.strip())
    for r in regimes:
        parse_regime(r)                                   # names the bad one
    if not regimes:
        raise HelmInputError(f"--workloads {workloads!r} names no regime")
    presets = {kind: names(text, available(kind), kind) for kind, text in (("hardware", hardware), ("model", model))}
    if nodes > 1 and n_envs > 1:
        raise HelmInputError(f"--nodes {nodes} runs one cluster as {nodes} environments; --envs {n_envs} "
                             "cannot be used with it")
    given = {p: click.get_current_context().get_parameter_source(p) is ParameterSource.COMMANDLINE
             for p in ("seed", "validate_seeds", "validate_duration")}
    if seeds is None and (given["validate_seeds"] or given["validate_duration"]):
        raise HelmInputError("--validate-seeds and --validate-duration set the validation of --seeds: give --seeds")
    if seeds is not None and given["seed"]:
        raise HelmInputError(f"--seed {seed} and --seeds {seeds!r}: give one (--seeds trains one policy a seed)")
    check_costs(_costs(regimes if trace is None else (), episode_s, nodes, n_envs, seeds is not None and regimes,
                       validate_duration), allow_large)
    env = {"regimes": regimes, "episode_s": episode_s, "relative": relative, "nodes": nodes,
           "hardware": tuple(presets["hardware"]), "model": tuple(presets["model"])}
    if trace is not None:
        env = _traced(env, workloads, seeds, trace, trace_format, duration, time_compression, clone_users, overlay,
                      widen_catalogue, holdout, seed, allow_large)
    elif duration is not None or time_compression is not None or clone_users != 1 or overlay or widen_catalogue:
        raise HelmInputError("--duration, --time-compression, --clone-users, --overlay and --widen-catalogue "
                             "describe a log's replay: give --trace LOG")
    if init_path is not None:
        check_init(init_path)
    if seeds is not None:
        return _select(timesteps, seed_list(seeds), seed_list(validate_seeds, "--validate-seeds"), validate_duration,
                       env, n_envs, out_path, runs_dir, jobs, as_json, init_path, checkpoint_every, target_kl)
    from helmgr.learn.train import train
    with progress("train", timesteps) as bar:
        what = Path(trace).name if trace is not None else "+".join(regimes)
        task = bar.add_task(f"PPO {what} seed {seed}", total=timesteps)
        result = train(timesteps, seed, out_path, runs_dir, env, on_progress=lambda n: bar.update(task, completed=n),
                       n_envs=n_envs, init=init_path, checkpoint_every=checkpoint_every, target_kl=target_kl)
    if trace is not None:
        from helmgr.experiments.training import validate_trace
        result["validation"] = validate_trace(str(out_path), env, jobs or 2)
    if as_json:
        emit_json(result)
        return
    stdout.print(f"policy -> {result['out']}  (log {result['log']}, {result['wall_s']:.0f} s)")
    if trace is not None:
        v = result["validation"]
        a, b = v["held_out_s"]
        stdout.print(table(f"held-out tail of the replay, {a:g}-{b:g} s, {v['nodes']} x {v['hardware']}, "
                           f"{v['model']}, base policy alone, HELM router",
                           {name: (v[name]["p99_ms"], v[name]["window_slo_satisfaction"], v[name]["mean_ratio"])
                            for name in ("trained", "shipped")},
                           ("P99 ms", "window SLO", "mean ratio")))


def _costs(regimes, episode_s: float, nodes: int, n_envs: int, validated, validate_duration) -> list[Cost]:
    """What training asks for: each regime's episode workload (its run, or warm-up and episode if
    longer) on `nodes`, the environments' worker processes, and with `validated` regimes each
    validation run."""
    from helmgr.learn.env import WARMUP_S
    from helmgr.sim import SimConfig
    from helmgr.workload import WorkloadSpec, default_config
    default_nodes = SimConfig().nodes                      # the validation runs' cluster, the default scenario's
    share = nodes / default_nodes                          # an episode's nodes carry their share of the rate
    simulated = WARMUP_S + episode_s                       # an episode ends after its warm-up and control
    episodes = [WorkloadSpec(r, simulated, rps=default_config(r).rps * share) for r in regimes]
    costs = [c for w in episodes for c in spec_costs(w, nodes, f"{w.regime} episodes: ", defaulted(["rps"]) | {
        "duration": f"{{:g}} s (--episode-s {episode_s:g} after a {WARMUP_S:g}-s warm-up)"})]
    costs.append(Cost("GiB of memory", n_envs * ENV_GIB, LIMITS.memory_gib,
                      f"--envs {n_envs} worker processes x ~{ENV_GIB:g} GiB"))
    return costs + [c for r in validated or () for c in spec_costs(
        WorkloadSpec(r, validate_duration), default_nodes, f"{r} validation: ",
        defaulted(["nodes"]) | {"duration": "--validate-duration {:g}"})]


def _traced(env: dict, workloads: str, seeds, trace, fmt, duration, time_compression, clone_users, overlay, widen,
            holdout, seed, allow_large: bool = False) -> dict:
    """`env` training on a log's replay (`learn.env.HelmEnv`'s `trace`), the log read and checked
    here, before any training: a bad file, a replay too short for an episode before its held-out
    tail, or options that do not go with --trace are refused."""
    from helmgr.learn.env import HelmEnv
    from helmgr.workload import WorkloadSpec
    from helmgr.workload.trace import replayed_before
    if workloads != "steady,trend,burst":
        raise HelmInputError(f"--workloads {workloads!r} names synthetic regimes; --trace trains on the log instead")
    if seeds is not None:
        raise HelmInputError("--seeds validates on the synthetic regimes; with --trace give one --seed (the "
                             "policy is validated on the log's held-out tail)")
    if widen and clone_users < 2:
        raise HelmInputError("--widen-catalogue needs --clone-users K > 1 (clone k takes item ids i + k x items)")
    spec = {"trace": trace, "trace_format": fmt, "duration_s": duration or TRACE_TRAIN_S, "seed": seed,
            "time_compression": time_compression, "clone_users": clone_users,
            "overlays": tuple(overlay) + ((WIDEN,) if widen else ())}
    check_costs(spec_costs(WorkloadSpec(**spec), env["nodes"]), allow_large)
    w = WorkloadSpec(**spec).build()                      # names a bad file or line
    env = env | {"regimes": ("trace",), "trace": spec, "holdout": holdout}
    e = HelmEnv(**env)
    end = e.train_end_s(w.duration_s)
    if end - e.warmup_s - e.episode_s < 0:
        raise HelmInputError(f"the replay's first {end:g} s (before the held-out "
                             f"{holdout:g}) cannot hold an episode of {e.warmup_s:g} + {e.episode_s:g} s: give a "
                             f"longer --duration or a shorter --episode-s")
    sent = replayed_before(w, end)
    if sent < end:
        how = f"--time-compression {time_compression:g}" if time_compression is not None else "fitting the log"
        raise HelmInputError(f"the replay's first {end:g} s ({how}) hold {sent} requests, under one a second: "
                             "nothing to control; replay it faster or shorter")
    return env


def _select(timesteps, seeds, validate_seeds, duration, env, n_envs, out_path, runs_dir, jobs, as_json,
            init_path=None, checkpoint_every=None, target_kl=None) -> None:
    """Several seeds, the best on validation runs (experiments.training)."""
    import os
    from datetime import datetime, timezone

    from helmgr.experiments.training import SelectConfig, select_policy
    sc = SelectConfig(tuple(seeds), timesteps, env, n_envs, tuple(validate_seeds), validate_duration_s=duration,
                      init=None if init_path is None else str(init_path), checkpoint_every=checkpoint_every,
                      target_kl=target_kl)
    report = runs_dir / f"select__{'-'.join(map(str, seeds))}__{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}"
    steps = sc.steps()
    with progress("train", steps) as bar:
        task = bar.add_task(f"{len(seeds)} PPO seeds, then {steps - len(seeds)} validation runs", total=steps)
        sel = select_policy(sc, out_path, report, runs_dir, jobs or os.cpu_count() or 1,
                            on_done=lambda _: bar.advance(task))
    if as_json:
        emit_json(sel)
        return
    rows = {f"seed {c['seed']}" + (" (chosen)" if c["seed"] == sel["chosen_seed"] else ""):
            (c["final_reward"], c["score_p99_ms"], c["train_wall_s"]) for c in sel["candidates"]}
    if sel["incumbent"] is not None:
        rows["the shipped policy"] = (None, sel["incumbent"]["score_p99_ms"], None)
    stdout.print(table("base policy candidates", rows, ("final episode reward", "validation P99 (geo-mean ms)",
                                                        "training s")))
    stdout.print(f"policy -> {out_path}  (report {report}/selection.json, training.png)")


def check_init(path: Path) -> None:
    """Refuse, before training, an --init file that is not a policy whose layers can start
    training's actor (`learn.train.check_fits`)."""
    from helmgr.controller.mlp import MLPPolicy
    from helmgr.learn.train import check_fits
    try:
        check_fits(MLPPolicy.load(path))                  # load names a file that is not a policy
    except ValueError as e:
        raise HelmInputError(f"--init {str(path)!r}: {e}") from None


def check_paths(out_path: Path, runs_dir: Path) -> None:
    """Refuse, before training, a policy file or log folder that cannot be written: `--out` a
    folder or in a missing or unwritable folder; `--runs-dir` a file or under an unwritable one."""
    if out_path.is_dir():
        raise HelmInputError(f"--out {str(out_path)!r} is a folder")
    check_writable("--out", out_path, out_path.resolve().parent)
    if runs_dir.exists() and not runs_dir.is_dir():
        raise HelmInputError(f"--runs-dir {str(runs_dir)!r} exists and is not a folder")
    here = runs_dir.resolve()
    while not here.exists():                              # train creates the missing folders
        here = here.parent
    if not here.is_dir():
        raise HelmInputError(f"--runs-dir {str(runs_dir)!r}: {str(here)!r} is not a folder")
    check_writable("--runs-dir", runs_dir, here)
