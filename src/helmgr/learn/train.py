"""Training the base policy: PPO (Stable-Baselines3) on HelmEnv, then export to numpy.

`train(...)` runs PPO with observation and reward normalization (VecNormalize), logs reward and
losses to `runs/<name>/progress.csv` (name `workload__policy__seed__time`), and writes the
exported policy: the actor's layers, the observation normalization and the action scaling, the
whole of what serving needs (controller.mlp). `export` is also what the parity test checks.

`init` warm-starts the actor from an exported policy (`warm_start`): PPO then fine-tunes a policy
that already works, where a run from scratch must rediscover it. `checkpoint_every` exports the
policy as it stands every so many transitions (`runs/<name>/checkpoint-<transitions>.npz`): how a
validation score moves with the training budget, and what a run stopped early has learnt.
"""
from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from helmgr.controller.layout import N_FEATURES
from helmgr.controller.mlp import MLPPolicy
from helmgr.core.files import temp_beside
from helmgr.learn.env import HelmEnv
from helmgr.workload.trace import WIDEN


def export(model, venv, max_step: float, meta: dict | None = None) -> MLPPolicy:
    """The trained actor as an MLPPolicy: SB3's policy_net (Linear + Tanh) and action_net."""
    import torch.nn as nn
    policy = model.policy
    layers = [m for m in policy.mlp_extractor.policy_net if isinstance(m, nn.Linear)] + [policy.action_net]
    acts = [type(m) for m in policy.mlp_extractor.policy_net if not isinstance(m, nn.Linear)]
    if any(a is not nn.Tanh for a in acts):
        raise ValueError(f"export supports tanh hidden layers only, the policy has {acts}")
    ws = [layer.weight.detach().cpu().numpy().astype(np.float64) for layer in layers]
    bs = [layer.bias.detach().cpu().numpy().astype(np.float64) for layer in layers]
    rms = venv.obs_rms
    return MLPPolicy(ws, bs, rms.mean.astype(np.float64), rms.var.astype(np.float64), float(venv.clip_obs),
                     float(venv.epsilon), max_step, meta)


HIDDEN = (64, 64)          # the actor's and the critic's hidden layers (tanh)
INIT_COUNT = 10_000        # warm start: the file's normalization weighs as this many observations
INIT_CRITIC_STEPS = 4096   # warm start: steps the actor is held while the fresh critic learns


def warm_start(model, venv, policy: MLPPolicy, env_kwargs: dict, seed: int) -> int:
    """Start `model`'s actor as `policy`: its layers, its log std left at the model's; the
    observation normalization as the file's, weighing `INIT_COUNT` observations. A file with fewer
    inputs than the environment's (a base trained before a feature was added) is widened: the new
    inputs get zero weight, so the actor decides as the file does, and their normalization comes
    from one episode held at its starting ratio. Returns the number of inputs widened.
    ValueError names a file whose layers do not fit the model's (`check_fits`)."""
    import torch
    import torch.nn as nn
    pol = model.policy
    layers = [m for m in pol.mlp_extractor.policy_net if isinstance(m, nn.Linear)] + [pol.action_net]
    n_obs = layers[0].weight.shape[1]
    check_fits(policy, n_obs)
    extra = n_obs - policy.n_obs
    with torch.no_grad():
        for k, (m, w, b) in enumerate(zip(layers, policy.w, policy.b)):
            if k == 0 and extra:
                w = np.concatenate([w, np.zeros((w.shape[0], extra))], axis=1)
            m.weight.copy_(torch.as_tensor(w, dtype=m.weight.dtype))
            m.bias.copy_(torch.as_tensor(b, dtype=m.bias.dtype))
    mean, var = np.zeros(n_obs), np.ones(n_obs)
    mean[:policy.n_obs], var[:policy.n_obs] = policy.obs_mean, policy.obs_var
    if extra:
        env = HelmEnv(**env_kwargs)
        obs, _ = env.reset(seed=seed)
        seen, done = [obs], False
        while not done:
            obs, _, term, trunc, _ = env.step(np.zeros(1, np.float32))
            seen.append(obs)
            done = term or trunc
        new = np.asarray(seen, np.float64)[:, policy.n_obs:]
        mean[policy.n_obs:], var[policy.n_obs:] = new.mean(0), np.maximum(new.var(0), 1e-8)
    venv.obs_rms.mean, venv.obs_rms.var, venv.obs_rms.count = mean, var, float(INIT_COUNT)
    return extra


def check_fits(policy: MLPPolicy, n_obs: int = N_FEATURES) -> None:
    """ValueError unless `policy` can start training's actor: hidden layers `HIDDEN`, one output,
    at most `n_obs` inputs (fewer are widened, `warm_start`)."""
    widths = [w.shape[0] for w in policy.w]
    if widths != [*HIDDEN, 1] or policy.n_obs > n_obs:
        raise ValueError(f"hidden layers {widths[:-1]} over {policy.n_obs} inputs; training's are {list(HIDDEN)} "
                         f"over at most {n_obs}: they do not fit")


def make_model(env_kwargs: dict, seed: int, n_steps: int = 512, n_envs: int = 1, target_kl: float | None = None):
    """PPO on a normalized HelmEnv, untrained; `n_steps` transitions a rollout from each
    environment; `n_envs` > 1 steps that many environments in worker processes (one per core);
    `target_kl`: stop an update's epochs once its approximate KL passes 1.5 × this (SB3's rule;
    None: every epoch runs, as the shipped base was trained).
    With `nodes` > 1 in `env_kwargs` the environment is one cluster whose every node decides for
    itself (`learn.vec.NodesVecEnv`, one transition a node)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecMonitor, VecNormalize

    nodes = env_kwargs.get("nodes", 1)
    if nodes > 1:
        if n_envs > 1:
            raise ValueError(f"a cluster of {nodes} nodes is one environment of {nodes}; got n_envs={n_envs}")
        from helmgr.learn.vec import NodesVecEnv
        venv = VecMonitor(NodesVecEnv(**env_kwargs))
    else:
        make = [lambda: Monitor(HelmEnv(**env_kwargs)) for _ in range(n_envs)]
        venv = SubprocVecEnv(make) if n_envs > 1 else DummyVecEnv(make)
    venv.seed(seed)
    venv = VecNormalize(venv, norm_obs=True, norm_reward=True, clip_obs=10.0, gamma=0.95)
    batch = n_steps * venv.num_envs
    model = PPO("MlpPolicy", venv, seed=seed, n_steps=n_steps, batch_size=min(64, batch), n_epochs=10, gamma=0.95,
                gae_lambda=0.9, learning_rate=3e-4, ent_coef=0.0, verbose=0, device="cpu", target_kl=target_kl,
                # std 0.37 at start: an action of 1 is a full step, so unit noise saturates every step
                policy_kwargs={"net_arch": {"pi": list(HIDDEN), "vf": list(HIDDEN)}, "log_std_init": -1.0})
    return model, venv


def command_flags(env_kwargs: dict) -> str:
    """The `helmgr train` options that give these environment settings (defaults left out)."""
    flags = []
    regimes = tuple(env_kwargs.get("regimes", ("steady", "trend", "burst")))
    if regimes != ("steady", "trend", "burst") and not env_kwargs.get("trace"):
        flags.append(f"--workloads {','.join(regimes)}")
    if env_kwargs.get("nodes", 1) != 1:
        flags.append(f"--nodes {env_kwargs['nodes']}")
    if env_kwargs.get("episode_s", 120.0) != 120.0:
        flags.append(f"--episode-s {env_kwargs['episode_s']:g}")
    for kind, default in (("hardware", "a100-80g"), ("model", "large")):
        value = env_kwargs.get(kind, default)
        listed = (value,) if isinstance(value, str) else tuple(value)
        if listed != (default,):
            flags.append(f"--{kind} {','.join(listed)}")
    if env_kwargs.get("relative"):
        flags.append("--relative")
    trace = env_kwargs.get("trace")
    if trace:
        flags.append(trace_flags(trace, env_kwargs.get("holdout", 0.2)))
    return "".join(" " + f for f in flags)


def trace_flags(trace: dict, holdout: float) -> str:
    """The `helmgr train` options naming a log's replay (`HelmEnv`'s `trace`, `holdout`)."""
    flags = [f"--trace {Path(trace['trace']).name}"]
    if trace.get("trace_format", "inter") != "inter":
        flags.append(f"--trace-format {trace['trace_format']}")
    if trace.get("duration_s") is not None:
        flags.append(f"--duration {trace['duration_s']:g}")
    if trace.get("time_compression") is not None:
        flags.append(f"--time-compression {trace['time_compression']:g}")
    if trace.get("clone_users", 1) != 1:
        flags.append(f"--clone-users {trace['clone_users']}")
    overlays = tuple(trace.get("overlays", ()))
    flags += [f"--overlay {o}" for o in overlays if o != WIDEN]
    if WIDEN in overlays:
        flags.append("--widen-catalogue")
    if holdout != 0.2:
        flags.append(f"--holdout {holdout:g}")
    return " ".join(flags)


def run_name(workload: str, seed: int) -> str:
    return f"{workload}__ppo__{seed}__{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}"


def train(timesteps: int, seed: int, out: Path, runs_dir: Path = Path("runs"), env_kwargs: dict | None = None,
          on_progress=None, n_envs: int = 1, init: Path | None = None, n_steps: int = 512,
          checkpoint_every: int | None = None, target_kl: float | None = None) -> dict:
    """PPO for `timesteps` steps of HelmEnv(**env_kwargs), `n_steps` a rollout, exported to `out`;
    `init`: a policy file to start the actor from (`warm_start`), held for its first
    `INIT_CRITIC_STEPS` steps while the critic, which starts fresh, learns; `checkpoint_every`:
    also export at every multiple of that many transitions, into the run's folder; `target_kl`:
    `make_model`'s."""
    import gc

    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import configure

    gc.collect()
    gc.freeze()       # what the imports made (torch, SB3, numba: ~10^6 objects) is left out of every later
                      # collection: the environment's reset collects each episode's cluster in 0.3 ms, not 0.15-0.3 s
    env_kwargs = env_kwargs or {}
    regimes = env_kwargs.get("regimes", ("steady", "trend", "burst"))
    name = run_name("+".join(regimes), seed)
    run_dir = runs_dir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    width = n_envs * env_kwargs.get("nodes", 1)          # transitions a step of the vector environment
    n_steps = min(n_steps, timesteps)                    # a run shorter than a rollout collects only its own steps
    model, venv = make_model(env_kwargs, seed, n_steps=max(1, n_steps // width), n_envs=n_envs, target_kl=target_kl)
    model.set_logger(configure(str(run_dir), ["csv"]))
    actor = [p for m in (model.policy.mlp_extractor.policy_net, model.policy.action_net) for p in m.parameters()]
    actor.append(model.policy.log_std)
    if init is not None:
        warm_start(model, venv, MLPPolicy.load(init), env_kwargs, seed)
    hold = INIT_CRITIC_STEPS if init is not None else 0
    max_step = HelmEnv(**env_kwargs).max_step
    flags = command_flags(env_kwargs)
    if init is not None:
        flags += f" --init {Path(init).name}"
    if target_kl is not None:
        flags += f" --target-kl {target_kl:g}"
    meta = {"command": f"helmgr train --timesteps {timesteps} --seed {seed} --envs {n_envs}{flags}",
            "timesteps": timesteps, "seed": seed, **({"init": _init_meta(init)} if init is not None else {}),
            "regimes": list(regimes), "run": name, "env": {k: v for k, v in env_kwargs.items() if k != "regimes"}}
    checkpoints: list[str] = []

    class Progress(BaseCallback):
        def _on_rollout_end(self) -> None:
            for p in actor:                      # held: no gradient, so Adam leaves it as it is
                p.requires_grad_(self.num_timesteps >= hold)

        def _on_step(self) -> bool:
            n = self.num_timesteps
            if checkpoint_every and n // checkpoint_every > (n - width) // checkpoint_every and n < timesteps:
                path = run_dir / f"checkpoint-{n}.npz"
                save_whole(export(model, venv, max_step, meta | {"checkpoint": n}), path)
                checkpoints.append(str(path))
            if on_progress is not None:
                on_progress(n)
            return True

    wall = time.perf_counter()
    model.learn(total_timesteps=timesteps, callback=Progress())
    save_whole(export(model, venv, max_step, meta), out)
    return {"run": name, "log": str(run_dir / "progress.csv"), "out": str(out), "timesteps": timesteps, "seed": seed,
            "wall_s": time.perf_counter() - wall, "checkpoints": checkpoints}


def _init_meta(init: Path) -> dict:
    """What a warm start began from: the file's name, its hash and its own command."""
    from helmgr.controller.controller import policy_digest
    return {"file": Path(init).name, "sha256_16": policy_digest(init),
            "command": MLPPolicy.load(init).meta.get("command")}


def save_whole(policy: MLPPolicy, out: Path) -> None:
    """Write the policy to a temporary file beside `out`, then rename it into place: `out` is the
    new policy or, on any error, what it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(out, ".npz")                        # .npz: savez adds no suffix
    try:
        policy.save(Path(tmp))
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
