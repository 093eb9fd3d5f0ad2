"""Training the base policy: PPO (Stable-Baselines3) on HelmEnv, then export to numpy (SPEC 6).

`train(...)` runs PPO with observation and reward normalization (VecNormalize), logs reward and
losses to `runs/<name>/progress.csv` (name `workload__policy__seed__time`), and writes the
exported policy: the actor's layers, the observation normalization and the action scaling, the
whole of what serving needs (controller.mlp). `export` is also what the parity test checks.
"""
from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from helmgr.controller.mlp import MLPPolicy
from helmgr.core.files import temp_beside
from helmgr.learn.env import HelmEnv


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


def make_model(env_kwargs: dict, seed: int, n_steps: int = 512, n_envs: int = 1):
    """PPO on a normalized HelmEnv, untrained; `n_envs` > 1 steps that many environments in
    worker processes (one per core)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    make = [lambda: Monitor(HelmEnv(**env_kwargs)) for _ in range(n_envs)]
    venv = SubprocVecEnv(make) if n_envs > 1 else DummyVecEnv(make)
    venv.seed(seed)
    venv = VecNormalize(venv, norm_obs=True, norm_reward=True, clip_obs=10.0, gamma=0.95)
    batch = n_steps * n_envs
    model = PPO("MlpPolicy", venv, seed=seed, n_steps=n_steps, batch_size=min(64, batch), n_epochs=10, gamma=0.95,
                gae_lambda=0.9, learning_rate=3e-4, ent_coef=0.0, verbose=0, device="cpu",
                # std 0.37 at start: an action of 1 is a full step, so unit noise saturates every step
                policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}, "log_std_init": -1.0})
    return model, venv


def command_flags(env_kwargs: dict) -> str:
    """The `helmgr train` options that give these environment settings (defaults left out)."""
    flags = []
    regimes = tuple(env_kwargs.get("regimes", ("steady", "trend", "burst")))
    if regimes != ("steady", "trend", "burst"):
        flags.append(f"--workloads {','.join(regimes)}")
    if env_kwargs.get("episode_s", 120.0) != 120.0:
        flags.append(f"--episode-s {env_kwargs['episode_s']:g}")
    if env_kwargs.get("scenario", "v2") != "v2":
        flags.append(f"--scenario {env_kwargs['scenario']}")
    for kind, default in (("hardware", "a100-80g"), ("model", "large")):
        value = env_kwargs.get(kind, default)
        listed = (value,) if isinstance(value, str) else tuple(value)
        if listed != (default,):
            flags.append(f"--{kind} {','.join(listed)}")
    if env_kwargs.get("relative"):
        flags.append("--relative")
    return "".join(" " + f for f in flags)


def run_name(workload: str, seed: int) -> str:
    return f"{workload}__ppo__{seed}__{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}"


def train(timesteps: int, seed: int, out: Path, runs_dir: Path = Path("runs"), env_kwargs: dict | None = None,
          on_progress=None, n_envs: int = 1) -> dict:
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import configure

    env_kwargs = env_kwargs or {}
    regimes = env_kwargs.get("regimes", ("steady", "trend", "burst"))
    name = run_name("+".join(regimes), seed)
    run_dir = runs_dir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    model, venv = make_model(env_kwargs, seed, n_steps=512 // n_envs, n_envs=n_envs)
    model.set_logger(configure(str(run_dir), ["csv"]))

    class Progress(BaseCallback):
        def _on_step(self) -> bool:
            if on_progress is not None:
                on_progress(self.num_timesteps)
            return True

    wall = time.perf_counter()
    model.learn(total_timesteps=timesteps, callback=Progress())
    max_step = HelmEnv(**env_kwargs).max_step
    flags = command_flags(env_kwargs)
    meta = {"command": f"helmgr train --timesteps {timesteps} --seed {seed} --envs {n_envs}{flags}",
            "timesteps": timesteps, "seed": seed,
            "regimes": list(regimes), "run": name, "env": {k: v for k, v in env_kwargs.items() if k != "regimes"}}
    save_whole(export(model, venv, max_step, meta), out)
    return {"run": name, "log": str(run_dir / "progress.csv"), "out": str(out), "timesteps": timesteps, "seed": seed,
            "wall_s": time.perf_counter() - wall}


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
