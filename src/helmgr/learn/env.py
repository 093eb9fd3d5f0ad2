"""A Gymnasium environment over the simulator, for training the base policy (SPEC 6).

One episode: a workload drawn from a mixture of regimes and seeds, served by a small cluster
(default: one node carrying one eighth of the default scenario — 300 req/s, 125,000 users, the
full 1 M-item table) for `episode_s` simulated seconds after a `warmup_s` warm-up at a random
starting ratio. One step = one control window (1 s): the action in [-1, 1] moves every node's
ratio by up to `max_step`, the cluster runs the window, and the agent sees node 0's observation
(controller.observe.FEATURES), built by the controller's own compiled code (`observe.Observer`),
and is paid `observe.reward` for it. Seeded: the same `reset(seed)` and actions give the same
observations and rewards.

With `relative=True` the pay is the reward minus that of a twin cluster forked at the end of the
warm-up and held at the starting ratio, fed the same requests: what the policy's moves gained
over not moving. A regime's own difficulty (a burst window costs every split alike) cancels, so
the signal left is the policy's (twice the simulation per step).
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np

from helmgr.controller.observe import N_FEATURES, Observer, reward
from helmgr.core.window import WindowStats
from helmgr.core.profiles import node_profile
from helmgr.sim.cluster import Cluster
from helmgr.sim.config import SimConfig
from helmgr.policy.policies import MemoryPolicy
from helmgr.routing.routers import make_router
from helmgr.workload import default_config, synthetic_workload


class _Recorder(MemoryPolicy):
    """Keeps each node's last window for the environment; sets no ratio itself."""

    name = "env"

    def __init__(self):
        self.windows: dict = {}

    def observe(self, index, window, node):
        self.windows[index] = window


class HelmEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, regimes=("steady", "trend", "burst"), nodes: int = 1, rps_per_node: float = 300.0,
                 users_per_node: int = 125_000, episode_s: float = 60.0, warmup_s: float = 10.0,
                 max_step: float = 0.05, router: str = "helm", hardware: str = "a100-80g", model: str = "large",
                 r_min: float = 0.05, r_max: float = 0.95, workload: dict | None = None, relative: bool = False):
        self.regimes, self.nodes = tuple(regimes), nodes
        self.rps, self.users = rps_per_node * nodes, users_per_node * nodes
        self.episode_s, self.warmup_s, self.max_step = episode_s, warmup_s, max_step
        self.router, self.hardware, self.model, self.r_min, self.r_max = router, hardware, model, r_min, r_max
        self.workload = dict(workload or {})       # more default_config overrides (tests: a small item table)
        self.relative = relative
        self.twin: Cluster | None = None
        self.slo_s = node_profile(hardware, model).model.slo_ms * 1e-3
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (N_FEATURES,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.cluster: Cluster | None = None
        self.regime = ""

    # -- episodes -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        rng = self.np_random
        self.regime = self.regimes[int(rng.integers(len(self.regimes)))]
        wseed = int(rng.integers(1 << 31))
        ratio = float(rng.uniform(0.2, 0.9))
        w = synthetic_workload(default_config(self.regime, **({"rps": self.rps, "n_users": self.users,
                                                               "duration_s": self.warmup_s + self.episode_s + 1.0}
                                                              | self.workload)), wseed)
        cfg = SimConfig(nodes=self.nodes, hardware=self.hardware, model=self.model, ratio=ratio, router=self.router,
                        seed=wseed, warmup_s=0.0, r_min=self.r_min, r_max=self.r_max)
        self.recorder = _Recorder()
        self.cluster = Cluster(cfg.validate(), w, node_profile(self.hardware, self.model), make_router(self.router),
                               self.recorder)
        self.cluster.begin()
        self.chunks = w.chunks(1.0)
        self.t = 0.0
        self.observer = Observer()
        self.twin = None
        while self.t < self.warmup_s:
            self._run_window()
        if self.relative:
            self.twin = self.cluster.fork()
        return self._observe(), {"regime": self.regime, "ratio": ratio}

    def step(self, action):
        a = float(np.clip(np.asarray(action, np.float64).reshape(-1)[0], -1.0, 1.0))
        before = self.cluster.nodes[0].ratio
        target = min(self.r_max, max(self.r_min, before + a * self.max_step))
        for i in range(self.nodes):
            if self.cluster.up[i]:
                self.cluster.set_ratio(i, target)
        self._run_window()
        obs = self._observe()
        moved = self.cluster.nodes[0].ratio - before
        r = reward(self.stats, moved)
        if self.twin is not None:
            w = self.twin.policy.windows.get(0)
            if w is not None:
                r -= reward(WindowStats.from_window(w, self.slo_s), 0.0)
        done = self.t >= self.warmup_s + self.episode_s
        return obs, r, done, False, {"regime": self.regime, "ratio": self.cluster.nodes[0].ratio}

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

    def _observe(self) -> np.ndarray:
        w = self.recorder.windows.get(0)
        if w is None:                          # no window closed yet (cannot happen after warm-up)
            self.stats = WindowStats(self.cluster.nodes[0].ratio, 0.0, None, self.slo_s)
        else:
            self.stats = WindowStats.from_window(w, self.slo_s)
        return self.observer(self.stats).astype(np.float32)
