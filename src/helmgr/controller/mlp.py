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
Every value of a file is checked as it loads: finite numbers, variances >= 0 with a std above 0 (the pass
divides by it), positive clip and step, one number where one is expected, meta a JSON object.
"""
from __future__ import annotations

import json
import math
import zipfile
import zlib
from pathlib import Path

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
        """The policy exported to `path`; a HelmInputError naming the file and what is wrong with
        it: missing, unreadable, no zip archive, cut short, a layout or a value `_check_numbers`
        refuses, a scalar that is an array, meta that is not a JSON object."""
        try:
            with _open_npz(path) as f:
                n = sum(1 for k in f.files if k.startswith("w") and k[1:].isdigit())
                arrays = {name: f[name] for k in range(n) for name in (f"w{k}", f"b{k}")} | {
                    name: f[name] for name in ("obs_mean", "obs_var")}
                scalars = [_scalar(f, name) for name in ("obs_clip", "obs_eps", "max_step")]
                _check_numbers(arrays, *scalars)       # (a policy built in memory may hold NaN: Safety's test)
                return cls([arrays[f"w{k}"] for k in range(n)], [arrays[f"b{k}"] for k in range(n)],
                           arrays["obs_mean"], arrays["obs_var"], *scalars, _meta(f["meta"]))
        except FileNotFoundError:
            raise HelmInputError(f"policy file {str(path)!r} does not exist") from None
        except (KeyError, ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
            raise HelmInputError(f"policy file {str(path)!r} is not a HELM policy: {e or type(e).__name__}") from None


def _check_numbers(arrays: dict[str, np.ndarray], obs_clip: float, obs_eps: float, max_step: float) -> None:
    """ValueError naming the first value the pass cannot run on: an array of other than finite
    numbers, a negative variance, a std of 0 (`forward` divides by sqrt(obs_var + obs_eps)), a
    clip or a step that is not a positive number, a negative or non-finite eps."""
    for name, a in arrays.items():
        if a.dtype.kind not in "iuf":
            raise ValueError(f"{name} holds {a.dtype} values, not numbers")
        bad = a.size - np.count_nonzero(np.isfinite(a))
        if bad:
            raise ValueError(f"{name} has {bad} value(s) that are not finite (NaN or inf)")
    for name, v in (("obs_clip", obs_clip), ("max_step", max_step)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive number, got {v}")
    if not (math.isfinite(obs_eps) and obs_eps >= 0):
        raise ValueError(f"obs_eps must be a finite number >= 0, got {obs_eps}")
    var = arrays["obs_var"]
    if (var < 0).any():
        raise ValueError(f"obs_var must be >= 0, it has {np.count_nonzero(var < 0)} negative (min {var.min():g})")
    if (var + obs_eps <= 0).any():
        raise ValueError(f"obs_var + obs_eps must be > 0 (observations are divided by its root), "
                         f"{np.count_nonzero(var + obs_eps <= 0)} input(s) have 0")


def _open_npz(path):
    """np.load of the archive at `path`; ValueError where the file is empty or no zip archive
    (np.load would read other bytes as a single array or a pickle)."""
    if Path(path).exists() and not Path(path).is_file():          # a folder; a pipe would block the read
        raise ValueError("it is not a regular file")
    with open(path, "rb") as fh:
        head = fh.read(4)
    if not head:
        raise ValueError("the file is empty")
    if not head.startswith(b"PK"):
        raise ValueError("it is not an .npz (zip) archive")
    return np.load(path, allow_pickle=False)


def _scalar(f, name: str) -> float:
    """The number `name` of archive `f`; ValueError unless it holds exactly one number."""
    a = f[name]
    if a.shape != () or a.dtype.kind not in "iuf":
        raise ValueError(f"{name} must be one number, it is {a.dtype} of shape {a.shape}")
    return float(a)


def _meta(a: np.ndarray) -> dict:
    """The `meta` entry (a JSON string) as a dict; ValueError unless it is a JSON object."""
    if a.shape != () or a.dtype.kind != "U":
        raise ValueError(f"meta must be a JSON string, it is {a.dtype} of shape {a.shape}")
    try:
        meta = json.loads(str(a))
    except ValueError as e:
        raise ValueError(f"meta is not JSON ({e})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"meta must be a JSON object, it is a JSON {type(meta).__name__}")
    return meta
