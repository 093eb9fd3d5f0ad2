"""The frozen base policy (the controller's tier 1): the exported actor's weights and its compiled
forward pass.

PPO trains an actor (Stable-Baselines3's MlpPolicy: tanh hidden layers, a linear mean head);
serving needs only its deterministic action. `MLPPolicy` holds the exported weights, the
observation normalization (running mean and variance, clip) and the action scaling, flattened
for `forward`, which runs the pass into a preallocated buffer: no allocation on the decision
path, and compiled because the pass is a few dozen short vector operations.

File format (`.npz`): `w0, b0, w1, b1, ...` (layer k maps `w_k.shape[1]` inputs to
`w_k.shape[0]` outputs, as torch stores them), `obs_mean`, `obs_var`, `obs_clip`, `obs_eps`,
`max_step` (ratio change for an action of 1), and `meta` (a JSON string: how it was trained).
"""
from __future__ import annotations

import json
from pathlib import Path

import math

import numpy as np
from numba import njit

from helmgr.core.errors import HelmInputError
from helmgr.core.jsonsafe import dumps


@njit(cache=True, nogil=True, inline="always")
def _tanh(v):
    """tanh through one exp: within 4e-16 of math.tanh (tested), at half libm's cost, which
    dominates the pass. Clamped where tanh is 1.0 in float64 anyway, so exp never overflows
    (fastmath assumes no infinities)."""
    v = -20.0 if v < -20.0 else (20.0 if v > 20.0 else v)
    return 1.0 - 2.0 / (1.0 + math.exp(2.0 * v))


@njit(cache=True, nogil=True, fastmath=True)     # fastmath: the dot products vectorize
def forward(obs, flat, dims, h):
    """The deterministic action in [-1, 1]. `flat` = [clip, obs_mean, obs_std, (W, b) per layer],
    W row-major (out x in); `dims` = [n_obs, out_1, ..., out_L]; `h` has room for two layers."""
    n = dims[0]
    clip = flat[0]
    width = h.shape[0] // 2
    x, y = h[:width], h[width:]
    mean, std = flat[1:1 + n], flat[1 + n:1 + 2 * n]
    for i in range(n):
        v = (obs[i] - mean[i]) / std[i]
        x[i] = -clip if v < -clip else (clip if v > clip else v)
    p = 1 + 2 * n
    n_in = n
    layers = dims.shape[0] - 1
    for k in range(layers):
        n_out = dims[k + 1]
        w = flat[p:p + n_out * n_in].reshape((n_out, n_in))      # views: the inner loop vectorizes
        bias = flat[p + n_out * n_in:p + n_out * n_in + n_out]
        for o in range(n_out):
            acc = bias[o]
            for i in range(n_in):
                acc += w[o, i] * x[i]
            y[o] = acc
        if k < layers - 1:                  # apart from the dot products, which then stay tight
            for o in range(n_out):
                y[o] = _tanh(y[o])
        p += n_out * n_in + n_out
        n_in = n_out
        x, y = y, x
    a = x[0]
    return -1.0 if a < -1.0 else (1.0 if a > 1.0 else a)


class MLPPolicy:
    def __init__(self, weights: list[np.ndarray], biases: list[np.ndarray], obs_mean: np.ndarray,
                 obs_var: np.ndarray, obs_clip: float = 10.0, obs_eps: float = 1e-8, max_step: float = 0.02,
                 meta: dict | None = None):
        if len(weights) != len(biases) or not weights:
            raise ValueError("an MLP needs as many bias vectors as weight matrices, at least one")
        for k, (w, b) in enumerate(zip(weights, biases)):
            if w.ndim != 2 or b.shape != (w.shape[0],):
                raise ValueError(f"layer {k}: weight {w.shape} and bias {b.shape} do not fit")
            if k and w.shape[1] != weights[k - 1].shape[0]:
                raise ValueError(f"layer {k} takes {w.shape[1]} inputs, layer {k - 1} gives {weights[k - 1].shape[0]}")
        if weights[-1].shape[0] != 1:
            raise ValueError(f"the policy must output one action, its last layer gives {weights[-1].shape[0]}")
        n_obs = weights[0].shape[1]
        if obs_mean.shape != (n_obs,) or obs_var.shape != (n_obs,):
            raise ValueError(f"normalization is for {obs_mean.shape} observations, the network takes {n_obs}")
        self.w = [np.ascontiguousarray(w, np.float64) for w in weights]
        self.b = [np.asarray(b, np.float64) for b in biases]
        self.obs_mean = np.asarray(obs_mean, np.float64)
        self.obs_std = np.sqrt(np.asarray(obs_var, np.float64) + obs_eps)
        self.obs_var, self.obs_eps, self.obs_clip, self.max_step = np.asarray(obs_var, np.float64), obs_eps, obs_clip, max_step
        self.meta = meta or {}
        self.n_obs = n_obs
        # the compiled forward pass (`forward`) reads one flat array:
        # [clip, obs_mean, obs_std, (W row-major, b) per layer], the widths, and a scratch buffer
        self.flat = np.concatenate([[float(obs_clip)], self.obs_mean, self.obs_std]
                                   + [part for w, b in zip(self.w, self.b) for part in (w.ravel(), b)])
        self.dims = np.array([n_obs] + [w.shape[0] for w in self.w], np.int64)
        self.scratch = np.zeros(2 * max(self.dims))

    def action(self, obs: np.ndarray) -> float:
        """Deterministic action in [-1, 1] (the actor's mean, clipped) for one raw observation,
        by `forward`, as the controller runs it."""
        return forward(obs, self.flat, self.dims, self.scratch)

    # -- files ----------------------------------------------------------------------------
    def save(self, path: Path) -> None:
        arrays = {f"w{k}": w for k, w in enumerate(self.w)} | {f"b{k}": b for k, b in enumerate(self.b)}
        np.savez(path, **arrays, obs_mean=self.obs_mean, obs_var=self.obs_var, obs_clip=self.obs_clip,
                 obs_eps=self.obs_eps, max_step=self.max_step, meta=dumps(self.meta))   # strict: a non-finite value is null

    @classmethod
    def load(cls, path) -> "MLPPolicy":
        try:
            with np.load(path, allow_pickle=False) as f:
                n = sum(1 for k in f.files if k.startswith("w") and k[1:].isdigit())
                return cls([f[f"w{k}"] for k in range(n)], [f[f"b{k}"] for k in range(n)], f["obs_mean"], f["obs_var"],
                           float(f["obs_clip"]), float(f["obs_eps"]), float(f["max_step"]), json.loads(str(f["meta"])))
        except FileNotFoundError:
            raise HelmInputError(f"policy file {str(path)!r} does not exist") from None
        except (KeyError, ValueError, OSError) as e:
            raise HelmInputError(f"policy file {str(path)!r} is not a HELM policy: {e}") from None
