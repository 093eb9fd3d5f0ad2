"""Several PPO seeds of the base policy, and the one that ships chosen on validation runs no
training episode drew (issue 22).

`select_policy` trains one policy per seed (`learn.train.train`, seeds in parallel), runs every
candidate as the base policy alone (`helm-base`: the tier training makes, with the safety step)
on the cluster it will serve — by default the default cluster's 8 nodes under the HELM router —
for each validation regime and seed, and keeps the candidate with the lowest geometric mean of
the validation P99s (a run with nothing measured, or overloaded, scores infinity). Training
draws each episode's workload seed from 31 bits, so validation seeds 101–103 are ones it has
almost surely never seen. Outputs: the chosen policy at `out` (its `meta` gains `selected`),
and in `report_dir` every candidate, `selection.json` and `training.png` (each seed's mean
episode reward against timesteps). The shipped policy is validated beside them (`incumbent`),
so the selection says whether the new one beats it; it is never the one written.
"""
from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from helmgr.controller.controller import default_policy_digest, default_policy_file
from helmgr.controller.mlp import MLPPolicy
from helmgr.core.jsonsafe import dumps
from helmgr.experiments.parallel import run_all
from helmgr.sim import SimConfig, simulate
from helmgr.workload import WorkloadSpec

VALIDATION_FIELDS = ("p99_ms", "window_slo_satisfaction", "mean_ratio", "utilization", "overloaded")


@dataclass(frozen=True)
class SelectConfig:
    seeds: tuple[int, ...]
    timesteps: int
    env: dict = field(default_factory=dict)        # HelmEnv options (regimes, presets, relative, ...)
    n_envs: int = 1                                # environments per training run
    validate_seeds: tuple[int, ...] = (101, 102, 103)
    validate_regimes: tuple[str, ...] = ("steady", "burst", "trend")
    validate_duration_s: float | None = None       # None: the regime's (360 s)
    validate_rps: float | None = None              # None: each regime's
    cluster: SimConfig | None = None               # None: the default cluster, HELM router
    incumbent: bool = True                         # validate the shipped policy beside them (never chosen)
    init: str | None = None                        # a policy file every seed's actor starts from (learn.train)
    checkpoint_every: int | None = None            # transitions between exports into each run's folder
    target_kl: float | None = None                 # PPO's: an update's epochs stop past 1.5 x this KL

    def steps(self) -> int:
        """What `select_policy` reports done (`on_done`): each training run, then each validation
        run, the shipped policy's included."""
        per_policy = len(self.validate_seeds) * len(self.validate_regimes)
        return len(self.seeds) + (len(self.seeds) + self.incumbent) * per_policy

    def validation_cluster(self) -> SimConfig:
        if self.cluster is not None:
            return self.cluster
        return SimConfig(router="helm")


def _train(args: tuple) -> dict:
    from helmgr.learn.train import train
    timesteps, seed, out, runs_dir, env, n_envs, init, every, target_kl = args
    return train(timesteps, seed, out, runs_dir, env, n_envs=n_envs, init=init and Path(init), checkpoint_every=every,
                 target_kl=target_kl)


def _validate(args: tuple[str, WorkloadSpec, SimConfig]) -> dict:
    from helmgr.policy.helm import HelmBase
    path, spec, cfg = args
    summary = simulate(replace(cfg, policy="helm-base"), spec.build(), policy=HelmBase(path=path)).summary
    return {k: summary[k] for k in VALIDATION_FIELDS}


def _validate_trace(args: tuple[str | None, dict, SimConfig, float]) -> dict:
    from helmgr.policy.helm import HelmBase
    path, trace, cfg, start = args
    summary = simulate(replace(cfg, policy="helm-base"), WorkloadSpec(**trace).build(), policy=HelmBase(path=path),
                       measure_from_s=start).summary
    return {k: summary[k] for k in VALIDATION_FIELDS}


def validate_trace(path: str, env: dict, jobs: int = 1) -> dict:
    """A policy trained on a log's replay (`learn.env.HelmEnv`'s `trace`) and the shipped one,
    each as the base alone (`helm-base`) on the environment's cluster (its nodes, hardware and
    model, the HELM router), measured on the replay's held-out tail only: the whole replay runs,
    the part training drew from as the warm-up. Returns each one's measures and the ratio of
    their P99s."""
    from helmgr.learn.env import HelmEnv
    e = HelmEnv(**env)
    duration = WorkloadSpec(**e.trace).build().duration_s
    start = e.train_end_s(duration)
    hardware, model = e.hardwares[0], e.models[0]
    cfg = SimConfig(nodes=e.nodes, router="helm", hardware=hardware, model=model, seed=e.trace.get("seed", 0))
    runs = run_all(_validate_trace, [(path, e.trace, cfg, start), (None, e.trace, cfg, start)], min(jobs, 2),
                   names=["trained policy on the held-out tail", "shipped policy on the held-out tail"])
    trained, shipped = runs
    ratio = (trained["p99_ms"] / shipped["p99_ms"] if trained["p99_ms"] and shipped["p99_ms"] else None)
    return {"held_out_s": [start, duration], "nodes": e.nodes, "hardware": hardware, "model": model,
            "trained": trained, "shipped": shipped, "p99_trained_over_shipped": ratio}


def score(runs: list[dict]) -> float:
    """Geometric mean of the runs' P99 (ms); infinite if any run measured nothing or overloaded."""
    p99 = [r["p99_ms"] for r in runs]
    if any(p is None or not p > 0 or r["overloaded"] for p, r in zip(p99, runs)):
        return math.inf
    return math.exp(sum(math.log(p) for p in p99) / len(p99))


def curve(log: Path) -> tuple[list[int], list[float]]:
    """(timesteps, mean episode reward) from a training run's progress.csv."""
    steps, reward = [], []
    with open(log, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("rollout/ep_rew_mean"):
                steps.append(int(float(row["time/total_timesteps"])))
                reward.append(float(row["rollout/ep_rew_mean"]))
    return steps, reward


def validate(paths: list[str], sc: SelectConfig, jobs: int = 1, labels: list[str] | None = None,
             on_done: Callable[[], None] | None = None) -> list[dict]:
    """Each policy file as the base alone (`helm-base`) on `sc`'s validation cluster, for each
    validation regime and seed: per file, its runs (`validation`) and their `score_p99_ms`."""
    cfg = sc.validation_cluster()
    specs = [WorkloadSpec(r, sc.validate_duration_s, v, sc.validate_rps)
             for r in sc.validate_regimes for v in sc.validate_seeds]
    labels = labels or [Path(p).name for p in paths]
    tasks = [(str(p), spec, replace(cfg, seed=spec.seed)) for p in paths for spec in specs]
    names = [f"{who}: {spec.regime} validation seed {spec.seed}" for who in labels for spec in specs]
    runs = run_all(_validate, tasks, jobs, names=names, on_done=on_done and (lambda i: on_done()))
    out = []
    for k in range(len(paths)):
        mine = runs[k * len(specs):(k + 1) * len(specs)]
        out.append({"score_p99_ms": score(mine),
                    "validation": [{"regime": s.regime, "seed": s.seed} | r for s, r in zip(specs, mine)]})
    return out


def select_policy(sc: SelectConfig, out: Path, report_dir: Path, runs_dir: Path = Path("runs"), jobs: int = 1,
                  on_done: Callable[[str], None] | None = None) -> dict:
    """Train, validate, choose, write (see the module's docstring); returns the selection."""
    report_dir.mkdir(parents=True, exist_ok=True)
    paths = [report_dir / f"seed{s}.npz" for s in sc.seeds]
    seeded = [(sc.timesteps, s, p, runs_dir, sc.env, sc.n_envs, sc.init, sc.checkpoint_every, sc.target_kl)
              for s, p in zip(sc.seeds, paths)]
    trained = run_all(_train, seeded, jobs, names=[f"training seed {s}" for s in sc.seeds],
                      on_done=on_done and (lambda i: on_done("train")))
    cfg = sc.validation_cluster()
    validated = [str(p) for p in paths] + ([str(default_policy_file())] if sc.incumbent else [])
    labels = [f"seed {s}" for s in sc.seeds] + (["the shipped policy"] if sc.incumbent else [])
    scored = validate(validated, sc, jobs, labels, on_done=on_done and (lambda: on_done("validate")))
    candidates = []
    for k, (seed, result) in enumerate(zip(sc.seeds, trained)):
        _, reward = curve(Path(result["log"]))
        candidates.append({"seed": seed, "policy": str(paths[k]), "run": result["run"], "log": result["log"],
                           "train_wall_s": result["wall_s"], "final_reward": reward[-1] if reward else None,
                           "checkpoints": result["checkpoints"]}
                          | scored[k])
    best = min(candidates, key=lambda c: (c["score_p99_ms"], c["seed"]))
    selection = {"config": asdict(replace(sc, cluster=cfg)), "candidates": candidates, "chosen_seed": best["seed"],
                 "chosen": str(out), "incumbent": None}
    if sc.incumbent:
        # named by the package and its hash, not by where this machine installed it
        selection["incumbent"] = {"policy": f"package:helmgr.controller/{default_policy_file().name}",
                                  "sha256_16": default_policy_digest()} | scored[len(paths)]
    _ship(Path(best["policy"]), out, {"seeds": list(sc.seeds), "validate_seeds": list(sc.validate_seeds),
                                      "validate_regimes": list(sc.validate_regimes),
                                      "score_p99_ms": best["score_p99_ms"]})
    plot_training(candidates, best["seed"], report_dir / "training.png")
    (report_dir / "selection.json").write_text(dumps(selection, indent=2) + "\n")
    return selection


def _ship(src: Path, out: Path, selected: dict) -> None:
    """`src` with `selected` in its meta, written to `out` whole (learn.train.save_whole)."""
    from helmgr.learn.train import save_whole
    policy = MLPPolicy.load(src)
    policy.meta = dict(policy.meta) | {"selected": selected}
    save_whole(policy, out)


def plot_training(candidates: list[dict], chosen: int, path: Path) -> None:
    """Mean episode reward against timesteps, one line per training seed (the chosen one bold)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for c in candidates:
        steps, reward = curve(Path(c["log"]))
        bold = c["seed"] == chosen
        ax.plot(steps, reward, lw=2.2 if bold else 1.0, label=f"seed {c['seed']}" + (" (chosen)" if bold else ""))
    ax.set_xlabel("timesteps")
    ax.set_ylabel("mean episode reward")
    ax.set_title("base policy training (PPO)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

