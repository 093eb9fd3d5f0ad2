"""The compiled controller (helmgr.controller.kernel) against its slow reference
(tests/controller_reference.py), decision for decision."""
import math
from dataclasses import replace

import numpy as np
import pytest

from helmgr.controller import Controller, WindowStats
from helmgr.controller import layout as L
from helmgr.controller.adapter import MarginalAdapter
from helmgr.controller.detect import BurstDetector
from helmgr.controller.mlp import MLPPolicy, _tanh
from helmgr.controller.observe import N_FEATURES, Observer, reward
from tests import controller_reference as ref


def stats_stream(seed: int, n: int):
    """Plausible windows with two 4x bursts (in the second the EMB cache misses little, so
    recovery does not grow it), a few empty windows and a few non-finite fields."""
    rng = np.random.default_rng(seed)
    for k in range(n):
        burst = 4.0 if 150 <= k < 160 or 400 <= k < 405 else 1.0
        p99 = None if k % 97 == 5 else (0.004 + 0.04 * rng.random()) * (30.0 if burst > 1 else 1.0)
        yield WindowStats(ratio=0.5, arrival_rps=300.0 * burst * (0.95 + 0.1 * rng.random()), p99_s=p99, slo_s=0.03,
                          emb_hit_rate=0.995 if 400 <= k < 405 else 0.8 + 0.1 * rng.random(), kv_hit_rate=(0.2 if burst > 1 else 0.7) + 0.1 * rng.random(),
                          queue_len=math.inf if k == 77 else 20.0 * rng.random(), h2d_utilization=0.5 * rng.random(),
                          new_user_share=0.1, emb_time_share=math.nan if k == 300 else 0.4)


def random_policy(seed: int) -> MLPPolicy:
    """Two tanh layers of random weights, so actions move with every feature, plus one path that
    pulls the ratio back toward 0.5, so the run stays mostly inside (r_min, r_max), and one that
    follows the queue, so the plan moves."""
    rng = np.random.default_rng(seed)
    sizes = (N_FEATURES, 16, 8, 1)
    ws = [rng.normal(0, 0.4, (o, i)) for i, o in zip(sizes, sizes[1:])]
    ws[0][0] = 0.0
    ws[0][0, 0], ws[1][0] = -3.0, 0.0       # hidden unit 0 of layer 1 = tanh(-3 z(ratio)) ...
    ws[1][0, 0], ws[2][0] = 2.0, 0.0        # ... carried by unit 0 of layer 2 ...
    ws[2][0, 0] = 1.5                       # ... to the action; and unit 1 of both layers carries the
    ws[0][1], ws[1][1] = 0.0, 0.0           # queue (random from window to window), so the plan moves
    ws[0][1, 5], ws[1][1, 1], ws[2][0, 1] = 0.5, 1.0, 1.5
    mean, var = rng.normal(0, 0.3, N_FEATURES), rng.uniform(0.5, 2.0, N_FEATURES)
    mean[0], var[0] = 0.5, 0.25
    return MLPPolicy(ws, [rng.normal(0, 0.1, o) for o in sizes[1:]], mean, var, max_step=0.03)


def controller(adapter: bool, recovery: bool) -> Controller:
    return Controller(random_policy(3), MarginalAdapter(block=4, z=1.0) if adapter else None,
                      BurstDetector(3) if recovery else None)


def samples(seed: int, n: int):
    """Adapter v2's counterfactual samples, one every other window: a slope that turns sign every
    150 windows, in noise (so blocks step both ways, and some do not step)."""
    rng = np.random.default_rng(seed)
    for k in range(n):
        yield None if k % 2 else (1e-3 if (k // 150) % 2 == 0 else -1e-3) + rng.normal(0, 1.5e-3)


@pytest.mark.parametrize("adapter,recovery", [(True, True), (False, True), (True, False), (False, False)])
def test_compiled_step_decides_as_the_reference(adapter, recovery):
    fast = controller(adapter, recovery)
    slow = ref.ReferenceController(fast)
    ratios = []
    offsets = []
    for s, m in zip(stats_stream(1, 600), samples(4, 600)):
        s = replace(s, ratio=ratios[-1] if ratios else 0.5)          # the node reports the ratio it was given
        ratios.append(fast.step(s, m))
        assert ratios[-1] == pytest.approx(slow.step(s, m), abs=1e-12)
        offsets.append(fast.adapter.offset if adapter else 0.0)
        st, _, _, det, *_ = fast._k[-1]        # views of the kernel's running state, against the objects'
        assert st[L.OB_MEAN] == pytest.approx(slow.observer.mean_rps, rel=1e-12)
        if recovery:
            assert det[:, L.D_MEAN] == pytest.approx([b.mean for b in slow.detector.base], rel=1e-12)
            assert det[:, L.D_VAR] == pytest.approx([b.var for b in slow.detector.base], rel=1e-12)
            assert det[:, L.D_CUSUM] == pytest.approx([c.s for c in slow.detector.cusum], abs=1e-12)
    assert np.ptp(ratios) > 0.02 and np.mean((np.array(ratios) > 0.06) & (np.array(ratios) < 0.94)) > 0.8
    assert fast.events == slow.events
    assert (len(fast.events) >= 4) == recovery            # two bursts: start and end each
    assert fast.safety.slewed == slow.safety.slewed and fast.safety.clamped == slow.safety.clamped
    assert fast.safety.settled == slow.safety.settled > 0 and fast.target == pytest.approx(slow.target, abs=1e-12)
    if adapter:
        assert fast.adapter.updates == slow.adapter.updates > 0
        assert fast.adapter.applied == slow.adapter.applied > 0 and fast.adapter.offset == slow.adapter.offset
        assert max(offsets) > 0.02 and min(offsets) < -0.02            # the offset moved both ways


def test_kernel_tanh_matches_libm():
    from numba import njit

    @njit
    def apply(v, out):
        for i in range(v.shape[0]):
            out[i] = _tanh(v[i])

    v = np.concatenate([np.linspace(-30.0, 30.0, 200_001), [0.0, 1e-300, -1e-12, 19.99, 20.01, 400.0, -400.0]])
    out = np.empty_like(v)
    apply(v, out)
    assert np.abs(out - np.tanh(v)).max() <= 4e-16
    assert out[-2] == 1.0 and out[-1] == -1.0


def test_integer_and_bool_stats_decide_as_floats():
    """A stack may report counts as ints: the compiled step takes them as the same floats."""
    a, b = controller(True, True), controller(True, True)
    for k, m in zip(range(30), samples(5, 30)):
        ints = WindowStats(ratio=1 if k < 15 else 0, arrival_rps=300 + k, p99_s=None if k == 3 else 0.01, slo_s=1,
                           queue_len=k, h2d_utilization=True)
        floats = WindowStats(ratio=float(ints.ratio), arrival_rps=float(ints.arrival_rps), p99_s=ints.p99_s, slo_s=1.0,
                             queue_len=float(k), h2d_utilization=1.0)
        assert a.step(ints, m) == b.step(floats, m)
    assert a.adapter.offset == b.adapter.offset and a.adapter.updates == b.adapter.updates > 0


def test_observation_and_reward_are_the_references_bit_for_bit():
    """The compiled observation (what the training environment sees) and reward, against the
    reference's, exactly, over the stream above (empty windows and non-finite fields included)."""
    fast, slow = Observer(), ref.Observer()
    for k, s in enumerate(stats_stream(2, 600)):
        assert fast(s).tolist() == slow(s).tolist()
        assert reward(s, 0.01 * (k % 7 - 3)) == ref.reward(s, 0.01 * (k % 7 - 3))
