"""Every node of one simulated cluster as one of Stable-Baselines3's environments.

HELM serves with one controller a node, all of them the same base policy. `NodesVecEnv` trains
it that way: a `HelmEnv` of `nodes` nodes under the scenario's router, each node deciding its
own ratio from its own observation and paid its own reward, so one simulated second gives
`nodes` transitions of one shared policy. A node alone is not the node the base will serve:
with the same share of the rate, node 0 of eight under the HELM router has about half the
window P99 of the node alone, because the router spreads each moment's load
(docs/results/2026-12-05-train-fidelity.md).

An episode ends for every node at once; the next one starts at once (SB3's convention: the last
observation goes in each node's `info["terminal_observation"]`). `seed(s)` seeds the next reset.
"""
from __future__ import annotations

import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnv

from helmgr.learn.env import HelmEnv


class NodesVecEnv(VecEnv):
    def __init__(self, **env_kwargs):
        self.env = HelmEnv(**env_kwargs)
        super().__init__(self.env.nodes, self.env.observation_space, self.env.action_space)
        self.actions: np.ndarray | None = None

    def reset(self) -> np.ndarray:
        seed = self._seeds[0]
        self.env.reset(seed=seed)
        self._reset_seeds()
        self.reset_infos = [{"regime": self.env.regime} for _ in range(self.num_envs)]
        return self.env.first_obs

    def step_async(self, actions: np.ndarray) -> None:
        self.actions = np.asarray(actions, np.float64).reshape(self.num_envs, -1)[:, 0]

    def step_wait(self):
        obs, pay, done, info = self.env.step_nodes(self.actions)
        infos = [dict(info) for _ in range(self.num_envs)]
        if done:
            for i, inf in enumerate(infos):
                inf["terminal_observation"] = obs[i]
                inf["TimeLimit.truncated"] = False
            obs = self.reset()
        return obs, pay.astype(np.float32), np.full(self.num_envs, done), infos

    def close(self) -> None:
        self.env.cluster = self.env.twin = None

    def get_attr(self, attr_name, indices=None):
        return [getattr(self.env, attr_name) for _ in self._get_indices(indices)]

    def set_attr(self, attr_name, value, indices=None) -> None:
        setattr(self.env, attr_name, value)

    def env_method(self, method_name, *method_args, indices=None, **method_kwargs):
        out = getattr(self.env, method_name)(*method_args, **method_kwargs)
        return [out for _ in self._get_indices(indices)]

    def env_is_wrapped(self, wrapper_class, indices=None):
        return [False for _ in self._get_indices(indices)]
