import numpy as np
import pytest

from helmgr.memory.mrc import miss_ratio_curve, shards_mrc, shards_sample, stack_distances
from helmgr.workload.popularity import zipf_ranks


def slow_distances(keys, sizes=None):
    """The obvious LRU stack: move each key to the top; its distance is what was above it."""
    sizes = sizes if sizes is not None else [1.0] * len(keys)
    stack, out = [], []        # most recent last
    for k, s in zip(keys, sizes):
        depth = 0.0
        found = False
        for key, size in reversed(stack):
            if key == k:
                found = True
                break
            depth += size
        out.append(depth if found else np.inf)
        stack = [(key, size) for key, size in stack if key != k] + [(k, s)]
    return np.array(out)


def test_stack_distances_by_hand():
    # a b c a b b d a: a sees {b, c} -> 2; b sees {c, a} -> 2; b sees {} -> 0; a sees {b, d} -> 2
    d = stack_distances(np.array(list("abcabbda")))
    assert d.tolist() == [np.inf, np.inf, np.inf, 2, 2, 0, np.inf, 2]


def test_byte_weighted_distances_by_hand():
    # sizes a=1, b=10, c=100: the second a sees b and c -> 110
    d = stack_distances(np.array(list("abca")), np.array([1.0, 10.0, 100.0, 1.0]))
    assert d.tolist() == [np.inf, np.inf, np.inf, 110.0]


@pytest.mark.parametrize("weighted", [False, True])
def test_fenwick_matches_the_slow_stack(weighted):
    rng = np.random.default_rng(0)
    keys = zipf_ranks(rng, 200, 0.8, 3000)
    sizes = rng.integers(1, 50, len(keys)).astype(float) if weighted else None
    if weighted:                                  # a key keeps one size, as a cached prefix does
        sizes = (keys % 49 + 1).astype(float)
    np.testing.assert_allclose(stack_distances(keys, sizes), slow_distances(keys.tolist(), None if sizes is None else sizes.tolist()))


def test_mrc_from_distances():
    d = np.array([0, 1, 1, 3, np.inf])
    np.testing.assert_allclose(miss_ratio_curve(d, np.array([0, 1, 2, 4])), [1.0, 0.8, 0.4, 0.2])


def test_shards_matches_exact_mattson():
    """SHARDS at rate 0.1 against the exact curve: mean absolute error <= 0.02."""
    rng = np.random.default_rng(1)
    for exponent in (0.7, 1.0):
        keys = zipf_ranks(rng, 20_000, exponent, 60_000)
        capacities = np.linspace(0, 20_000, 41)
        exact = miss_ratio_curve(stack_distances(keys), capacities)
        approx = shards_mrc(keys, capacities, rate=0.1)
        assert np.mean(np.abs(exact - approx)) <= 0.02
        assert exact[0] == 1.0 and np.all(np.diff(exact) <= 0)


def test_shards_sample_keeps_whole_keys_at_the_rate():
    keys = np.repeat(np.arange(10_000), 3)
    kept = shards_sample(keys, 0.25)
    assert len(np.unique(keys[kept])) == pytest.approx(2_500, rel=0.08)
    assert len(kept) == 3 * len(np.unique(keys[kept]))          # all accesses of a kept key
