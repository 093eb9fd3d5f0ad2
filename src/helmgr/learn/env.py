"""A Gymnasium environment over the simulator, for training the base policy.

One episode: a regime, a hardware and a model preset and a seed drawn from the mixture given,
served by a small cluster — by default one node carrying its share of the default cluster
(one eighth of the regime's rate and users, the full 2 M-item table, pipelined batches of up
to 8, the 20-ms SLO). The episode is a stretch of the regime's whole run (360 s,
so trend's phases and day and burst's events keep their real lengths), starting at a random
time: `warmup_s` at a random starting ratio, then `episode_s` of control. One step = one control
window (1 s): the action in [-1, 1] moves every node's ratio by up to `max_step`, the cluster runs
the window, and the agent sees node 0's observation (controller.observe.FEATURES), built by the
controller's own compiled code (`observe.Observer`; its "marginal_ms" from the counterfactual
samples of the shadows HELM tracks, `policy.marginal.MarginalSampler`), and is paid
`observe.reward` for it. `step_nodes` takes one action per node and gives every node's
observation and pay: `learn.vec.NodesVecEnv` trains on a whole cluster that way. Seeded: the
same `reset(seed)` and actions give the same observations and rewards.

With `relative=True` the pay is the reward minus that of a twin cluster forked at the end of the
warm-up and held at the starting ratio, fed the same requests: what the policy's moves gained
over not moving. A regime's own difficulty (a burst window costs every split alike) cancels, so
the signal left is the policy's (twice the simulation per step).

With `trace` (a `WorkloadSpec`'s fields naming a log: its replay, overlays, clones) every episode
is a stretch of that replay instead, served whole by the `nodes` nodes, starting at a random time
in its first 1 - `holdout` share: the last `holdout` of the replay is never trained on, so a
policy can be validated on it (`experiments.training.validate_trace`).
"""
from __future__ import annotations

import gc
from dataclasses import replace
from itertools import islice

import gymnasium as gym
import numpy as np

from helmgr.controller.observe import N_FEATURES, Observer, reward
from helmgr.core.window import WindowStats
from helmgr.core.profiles import node_profile
from helmgr.sim.cluster import Cluster
from helmgr.sim.config import SimConfig
from helmgr.policy.base import MemoryPolicy
from helmgr.policy.helm import HelmPolicy
from helmgr.policy.marginal import MarginalSampler
from helmgr.routing.routers import make_router
from helmgr.workload import WorkloadSpec, default_config, synthetic_workload

WARMUP_S = 15.0           # an episode's warm-up before its control, by default


def shifted(chunks, start: int):
    """The 1-s chunks from second `start` on, their times moved back by `start` (the cluster's
    clock starts at 0)."""
    for chunk in islice(chunks, start, None):
        yield replace(chunk, t=chunk.t - start)


class _Recorder(MemoryPolicy):
    """Keeps each node's last window and the counterfactual sample that closed with it (None:
    none) for the environment, from the same shadows HELM tracks (`MarginalSampler`, HELM's
    settings); sets no ratio itself."""

    name = "env"

    def __init__(self):
        self.windows: dict = {}
        self.samples: dict = {}
        self.sampler = MarginalSampler(HelmPolicy.shadow_share, HelmPolicy.value)
        self.peers: list = []

    def attach(self, index, node):
        self.sampler.attach(index, node, self.peers)

    def observe(self, index, window, node):
        self.windows[index] = window
        self.samples[index] = self.sampler.sample(index, window, node)


class HelmEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, regimes=("steady", "trend", "burst"), nodes: int = 1, rps_per_node: float | None = None,
                 users_per_node: int | None = None, episode_s: float = 120.0, warmup_s: float | None = None,
                 max_step: float = 0.05, router: str = "helm", hardware: str | tuple[str, ...] = "a100-80g",
                 model: str | tuple[str, ...] = "large", r_min: float = 0.05, r_max: float = 0.95,
                 workload: dict | None = None, relative: bool = False, sim_path: str = "auto",
                 trace: dict | None = None, holdout: float = 0.2):
        self.regimes, self.nodes = tuple(regimes), nodes
        self.trace, self.holdout = (dict(trace) if trace else None), float(holdout)
        self._replay = None                        # the trace's workload, built at the first episode
        if self.trace is not None:
            self.regimes = ("trace",)
            if not 0.0 < self.holdout < 1.0:
                raise ValueError(f"holdout must be a share of the replay in (0, 1), got {holdout}")
        self.sim_path = sim_path                   # the simulator's path (SimConfig.path): the same episodes
        self.rps_per_node, self.users_per_node = rps_per_node, users_per_node
        if warmup_s is None:
            warmup_s = WARMUP_S
        self.episode_s, self.warmup_s, self.max_step = episode_s, warmup_s, max_step
        self.hardwares = (hardware,) if isinstance(hardware, str) else tuple(hardware)
        self.models = (model,) if isinstance(model, str) else tuple(model)
        self.router, self.r_min, self.r_max = router, r_min, r_max
        self.workload = dict(workload or {})       # more default_config overrides (tests: a small item table)
        self.relative = relative
        self.base_cfg = SimConfig()                # the default cluster: engine, batch, SLO
        self.share = 1.0 / self.base_cfg.nodes      # of the default cluster, per node
        self.twin: Cluster | None = None
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (N_FEATURES,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.cluster: Cluster | None = None
        self.regime = ""

    def _synthetic(self, regime: str, wseed: int, rng) -> tuple:
        """The episode's workload and the time its warm-up starts at."""
        base = default_config(regime, **self.workload)
        rps = self.rps_per_node or base.rps * self.share
        users = self.users_per_node or int(base.n_users * self.share)
        duration = max(base.duration_s, self.warmup_s + self.episode_s + 1.0)
        cfg = self.workload_config = replace(base, rps=rps * self.nodes, n_users=users * self.nodes, duration_s=duration)
        latest = int(duration - self.warmup_s - self.episode_s - 1.0)
        return synthetic_workload(cfg, wseed), int(rng.integers(latest + 1)) if latest > 0 else 0

    def _traced(self, rng) -> tuple:
        """The replay (built once) and an episode's start: its warm-up and episode end before
        the held-out tail."""
        if self._replay is None:
            self._replay = WorkloadSpec(**self.trace).build()
        end = self.train_end_s(self._replay.duration_s)
        latest = int(end - self.warmup_s - self.episode_s)
        if latest < 0:
            raise ValueError(f"the replay's first {end:g} s (its last {self.holdout:g} held out) are shorter than "
                             f"an episode's warm-up and control ({self.warmup_s:g} + {self.episode_s:g} s)")
        return self._replay, int(rng.integers(latest + 1))

    def train_end_s(self, duration_s: float) -> float:
        """Where the held-out tail of a replay of `duration_s` begins."""
        return duration_s * (1.0 - self.holdout)

    # -- episodes -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if self.cluster is not None:       # a cluster is a web of cycles (router, nodes, ghost peers): free the
            self.cluster = self.twin = None  # last episode's now; left to the collector, a PPO worker grew by
            gc.collect()                     # ~130 MB an episode and was killed at 15 GB
        rng = self.np_random
        self.regime = self.regimes[int(rng.integers(len(self.regimes)))]
        wseed = int(rng.integers(1 << 31))
        ratio = float(rng.uniform(0.2, 0.9))
        # drawn only where there is a choice (episodes of one preset keep their earlier draws)
        hardware, model = (x[int(rng.integers(len(x)))] if len(x) > 1 else x[0] for x in (self.hardwares, self.models))
        w, start = self._traced(rng) if self.trace is not None else self._synthetic(self.regime, wseed, rng)
        profile = node_profile(hardware, model)
        slo_ms = self.base_cfg.slo_ms or profile.model.slo_ms
        self.slo_s = slo_ms * 1e-3
        cfg = replace(self.base_cfg, nodes=self.nodes, hardware=hardware, model=model, ratio=ratio, router=self.router,
                      seed=w.seed, warmup_s=0.0, r_min=self.r_min, r_max=self.r_max, slo_ms=slo_ms, path=self.sim_path)
        self.recorder = _Recorder()
        self.cluster = Cluster(cfg.validate(), w, profile, make_router(self.router), self.recorder)
        self.cluster.begin()
        self.chunks = shifted(w.chunks(1.0), start)
        self.t = 0.0
        self.observers = [Observer() for _ in range(self.nodes)]
        self.twin = None
        while self.t < self.warmup_s:
            self._run_window()
        if self.relative:
            self.twin = self.cluster.fork()
        info = {"regime": self.regime, "ratio": ratio, "hardware": hardware, "model": model, "start_s": start}
        self.first_obs = self._observe_all()          # every node's (NodesVecEnv)
        return self.first_obs[0], info

    def step(self, action):
        """One action for every node; node 0's observation and pay."""
        a = float(np.clip(np.asarray(action, np.float64).reshape(-1)[0], -1.0, 1.0))
        obs, pay, done, info = self.step_nodes(np.full(self.nodes, a))
        return obs[0], float(pay[0]), done, False, info

    def step_nodes(self, actions) -> tuple[np.ndarray, np.ndarray, bool, dict]:
        """One action per node (`NodesVecEnv`): each node's observation and pay, and whether the
        episode ended."""
        a = np.clip(np.asarray(actions, np.float64).reshape(-1), -1.0, 1.0)
        nodes = self.cluster.nodes
        before = [n.ratio for n in nodes]
        for i in range(self.nodes):
            if self.cluster.up[i]:
                self.cluster.set_ratio(i, min(self.r_max, max(self.r_min, before[i] + float(a[i]) * self.max_step)))
        self._run_window()
        obs = self._observe_all()
        pay = np.empty(self.nodes)
        for i in range(self.nodes):
            pay[i] = reward(self.node_stats[i], nodes[i].ratio - before[i])
            if self.twin is not None:
                w = self.twin.policy.windows.get(i)
                if w is not None:
                    pay[i] -= reward(WindowStats.from_window(w, self.slo_s), 0.0)
        done = self.t >= self.warmup_s + self.episode_s
        return obs, pay, done, {"regime": self.regime, "ratio": nodes[0].ratio}

    # -- plumbing -------------------------------------------------------------------------
    def _run_window(self) -> None:
        chunk = next(self.chunks, None)
        self.t += 1.0
        for cluster in (self.cluster, self.twin):
            if cluster is None:
                continue
            if chunk is not None:
                cluster.feed(chunk)
            cluster.advance(self.t)

    def _observe_all(self) -> np.ndarray:
        """Every node's observation (`node_stats` its window's stats; `stats` node 0's)."""
        self.node_stats = []
        for i, observer in enumerate(self.observers):
            w = self.recorder.windows.get(i)
            if w is None:                      # no window closed yet (cannot happen after warm-up)
                self.node_stats.append(WindowStats(self.cluster.nodes[i].ratio, 0.0, None, self.slo_s))
            else:
                self.node_stats.append(WindowStats.from_window(w, self.slo_s))
        self.stats = self.node_stats[0]
        return np.stack([observer(st, self.recorder.samples.get(i))
                         for i, (observer, st) in enumerate(zip(self.observers, self.node_stats))]).astype(np.float32)
