import math

import numpy as np
import pytest

from helmgr.controller import safety
from helmgr.controller.layout import layout
from helmgr.controller.mlp import MLPPolicy
from helmgr.core.errors import HelmInputError
from tests import controller_reference as ref


class CompiledSafety:
    """The package's compiled `limit` and `settle` on their own, with `Safety`'s counters."""

    def __init__(self, **kw):
        self.limits = safety.Safety(**kw)
        _, (self.st, self.cfg, *_) = layout(0, 0)
        self.limits.configure(self.cfg)

    def apply(self, proposed, last):
        return self._report(safety.limit(proposed, last, self.st, self.cfg))

    def settle(self, target, applied):
        return self._report(safety.settle(target, applied, self.st, self.cfg))

    def _report(self, ratio):
        self.limits.report(self.st)
        return ratio

    def __getattr__(self, name):
        return getattr(self.limits, name)


SAFETIES = {"compiled": CompiledSafety, "reference": ref.Safety}


@pytest.mark.parametrize("Safety", SAFETIES.values(), ids=SAFETIES)
def test_safety_clamps_slews_and_keeps_the_last_good_ratio(Safety):
    s = Safety(r_min=0.1, r_max=0.9, max_slew=0.05)
    assert s.apply(0.52, 0.50) == pytest.approx(0.52)
    assert s.apply(0.70, 0.50) == pytest.approx(0.55) and s.slewed == 1
    assert s.apply(0.05, 0.12) == pytest.approx(0.10) and s.clamped == 1          # slew to 0.07, then clamp
    for bad in (math.nan, math.inf, -math.inf):
        assert s.apply(bad, 0.42) == 0.42
    assert s.non_finite == 3
    with pytest.raises(ValueError):
        Safety(r_min=0.9, r_max=0.1)


@pytest.mark.parametrize("Safety", SAFETIES.values(), ids=SAFETIES)
def test_safety_moves_the_node_only_in_steps_of_min_move(Safety):
    s = Safety(r_min=0.1, r_max=0.9, max_slew=0.1, min_move=0.03)
    assert s.settle(0.52, 0.50) == 0.50 and s.settled == 1           # 0.02 away: stays
    assert s.settle(0.48, 0.50) == 0.50 and s.settled == 2
    assert s.settle(0.54, 0.50) == 0.54                             # 0.04 away: moves all the way
    assert s.settle(0.50, 0.50) == 0.50 and s.settled == 2          # nothing to move: not counted
    assert s.settle(0.10, 0.12) == 0.10 and s.settle(0.90, 0.89) == 0.90   # a bound is always reached
    assert Safety(min_move=0.0).settle(0.501, 0.5) == 0.501
    with pytest.raises(ValueError, match="min_move"):
        Safety(max_slew=0.05, min_move=0.2)


def random_mlp(seed=0, sizes=(10, 16, 16, 1), **kw):
    rng = np.random.default_rng(seed)
    ws = [rng.normal(0, 0.5, (o, i)) for i, o in zip(sizes[:-1], sizes[1:])]
    bs = [rng.normal(0, 0.1, o) for o in sizes[1:]]
    return MLPPolicy(ws, bs, rng.normal(0, 1, sizes[0]), rng.uniform(0.5, 2, sizes[0]), **kw), ws, bs


def test_mlp_forward_matches_a_plain_reference():
    p, ws, bs = random_mlp(max_step=0.03)
    rng = np.random.default_rng(1)
    for _ in range(20):
        obs = rng.normal(0, 3, 10)
        x = np.clip((obs - p.obs_mean) / np.sqrt(p.obs_var + 1e-8), -10, 10)
        for k, (w, b) in enumerate(zip(ws, bs)):
            x = w @ x + b
            x = np.tanh(x) if k < len(ws) - 1 else x
        want = float(np.clip(x[0], -1, 1))
        assert p.action(obs) == pytest.approx(want, abs=1e-12)
        assert ref.forward(p, obs) == pytest.approx(want, abs=1e-12)


def test_mlp_file_round_trip_and_bad_files(tmp_path):
    p, _, _ = random_mlp(meta={"seed": 7})
    p.save(tmp_path / "p.npz")
    q = MLPPolicy.load(tmp_path / "p.npz")
    obs = np.linspace(-1, 1, 10)
    assert q.action(obs) == p.action(obs) and q.meta == {"seed": 7} and q.max_step == p.max_step
    with pytest.raises(HelmInputError, match="does not exist"):
        MLPPolicy.load(tmp_path / "none.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(HelmInputError, match="is not a HELM policy"):
        MLPPolicy.load(tmp_path / "junk.npz")
    with pytest.raises(ValueError, match="do not fit"):
        MLPPolicy([np.zeros((4, 3))], [np.zeros(3)], np.zeros(3), np.ones(3))
