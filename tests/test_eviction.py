"""The eviction policies (helmgr.memory.eviction), alone and as both EMB caches use them."""
import numpy as np
import pytest
import torch

from helmgr.core.errors import HelmInputError
from helmgr.memory.emb import EmbCache
from helmgr.memory.eviction import LFU, LRU, keep_top, make_eviction, top
from helmgr.real import DeviceEmbCache, DevicePool

ROW = 16                                     # 4 float32 columns

# One stream, one id batch per epoch (a refresh interval of the simulated cache, a lookup of the
# device cache), into a cache of 3 rows; decay 0.5. Scores after each epoch, as the simulated
# cache holds them (the device cache holds the same times 2^epoch):
#  epoch  batch           LFU (aged, then + count)                 LRU (epoch + count/(max+1))
#  1      1 1 1           1: 3                                      1: 1.75
#  2      2 2             1: 1.5   2: 2                             2: 2.67
#  3      3 3 3 3         1: .75   2: 1     3: 4                    3: 3.8          -> {1, 2, 3}
#  4      4               1: .375  2: .5    3: 2    4: 1            4: 4.5          in 4, out 1
#  5      1               1: 1.19  2: .25   3: 1    4: .5           1: 5.5          in 1, out 2
#  6      5 4 5           1: .59   3: .5    4: 1.25 5: 2            4: 6.33 5: 6.67 in 5, out 3
#  7      3               1: .30   3: 1.25  4: .63  5: 1            3: 7.5          in 3, out 1
#  8      0               0: 1     3: .63   4: .31  5: .5           0: 8.5          in 0, out 4
#  9      2 2 2 2         0: .5    2: 4.02  3: .31  5: .25          2: 9.8          in 2, out 5
#  10     0 0 2 2 2 3x4   0: 2.25  2: 5.01  3: 4.16 (all hits)      0: 10.4 2: 10.6 3: 10.8
#  11     4               0: 1.13  2: 2.50  3: 2.08 4: 1.04         4: 11.5
# At epoch 11 LFU keeps its frequent rows (4's one access scores below 0's 1.13); LRU lets the
# new row in and evicts the least recent, 0.
STREAM = [[1, 1, 1], [2, 2], [3, 3, 3, 3], [4], [1], [5, 4, 5], [3], [0], [2, 2, 2, 2],
          [0, 0, 2, 2, 2, 3, 3, 3, 3], [4]]
FULL_AT = 3                                  # epochs before this one fill the cache
COMMON = [({4}, {1}), ({1}, {2}), ({5}, {3}), ({3}, {1}), ({0}, {4}), ({2}, {5}), (set(), set())]
CHANGES = {"lfu": COMMON + [(set(), set())], "lru": COMMON + [({4}, {0})]}   # (admitted, evicted), epochs 4..11


class SimCache:
    def __init__(self, policy):
        self.c = EmbCache(6, ROW, policy, band_rows=2, decay=0.5)
        self.c.resize(3 * ROW)

    def step(self, ids):
        self.c.lookup(np.array(ids))
        self.c.refresh()
        return set(np.flatnonzero(self.c.wanted).tolist())


class DevCache:
    def __init__(self, policy):
        pool = DevicePool(4 * 3 * ROW, 3 * ROW, ROW, ratio=0.25)
        self.c = DeviceEmbCache(pool, torch.randn(6, 4, generator=torch.Generator().manual_seed(0)), policy, 0.5)

    def step(self, ids):
        self.c.lookup(torch.tensor(ids))
        return set(torch.nonzero(self.c.is_resident(torch.arange(6))).flatten().tolist())


@pytest.mark.parametrize("policy", ["lfu", "lru"])
@pytest.mark.parametrize("make", [SimCache, DevCache], ids=["sim", "device"])
def test_both_caches_admit_and_evict_the_same_rows(make, policy):
    cache = make(policy)
    kept = set()
    for epoch, ids in enumerate(STREAM[:FULL_AT], 1):
        kept = cache.step(ids)
        assert set().union(*STREAM[:epoch]) <= kept            # (the simulated cache also wants
    assert kept == {1, 2, 3}                                   # zero-score rows while not full)
    for epoch, (ids, (admitted, evicted)) in enumerate(zip(STREAM[FULL_AT:], CHANGES[policy]), FULL_AT + 1):
        now = cache.step(ids)
        assert (now - kept, kept - now) == (admitted, evicted), epoch
        kept = now
    assert kept == ({0, 2, 3} if policy == "lfu" else {2, 3, 4})
    cache.c.check_integrity()


def test_eager_and_lazy_lfu_are_the_same_scores_up_to_scale():
    rng = np.random.default_rng(3)
    eager, lazy = LFU(0.5), LFU(0.5, lazy=True)
    se, sl = np.zeros(50, np.float32), np.zeros(50, np.float32)
    for _ in range(80):                                        # weight 2^80 > 1e18: rescaled once
        ids, counts = np.unique(rng.integers(0, 50, 6), return_counts=True)
        eager.age(se)
        for policy, s in ((eager, se), (lazy, sl)):
            policy.touch(s, ids, counts.astype(np.float32), 0)
        lazy.age(sl)
        np.testing.assert_allclose(sl / lazy.weight * 2, se, rtol=1e-5)   # eager ages before, lazy after
    assert (eager.rescales, lazy.rescales) == (0, 1)
    assert eager.weight == 1.0


def test_lru_scores_the_epoch_and_the_busier_row():
    s = np.full(4, 0.5, np.float32)
    LRU().touch(s, np.array([1, 3]), np.array([1, 3], np.float32), 7)
    np.testing.assert_allclose(s, [0.5, 7.25, 0.5, 7.75])
    LRU().touch(s, np.zeros(0, np.int64), np.zeros(0, np.float32), 8)          # nothing touched
    np.testing.assert_allclose(s, [0.5, 7.25, 0.5, 7.75])


def test_settled_scores_and_strict_admission():
    shares = np.array([1.0, 3.0, 0.0])
    np.testing.assert_allclose(LFU(0.75).settled(shares, 8.0), [8.0, 24.0, 0.0])   # 2, 6, 0 per epoch / (1 - .75)
    np.testing.assert_allclose(LFU(1.0).settled(shares, 8.0), [2.0, 6.0, 0.0])     # no aging: one epoch's
    np.testing.assert_allclose(LRU().settled(shares, 8.0), [2.0, 6.0, 0.0])
    assert LFU().admits(np.float32(2), np.float32(1)) and not LRU().admits(np.float32(1), np.float32(1))


def test_keep_top_takes_the_highest_ties_to_the_lower_index():
    s = np.array([1, 3, 2, 3, 2, 0], np.float32)
    assert np.flatnonzero(keep_top(s, 3)).tolist() == [1, 2, 3]
    assert top(s, 4).tolist() == [1, 3, 2, 4]
    assert not keep_top(s, 0).any() and keep_top(s, 9).all()
    ref = sorted(range(6), key=lambda i: (-s[i], i))
    for c in range(7):
        assert set(np.flatnonzero(keep_top(s, c))) == set(ref[:c])


def test_unknown_names_and_bad_decays_are_input_errors():
    with pytest.raises(HelmInputError, match=r"unknown EMB policy 'fifo' \(known: lfu, lru\)"):
        make_eviction("fifo")
    with pytest.raises(HelmInputError, match=r"decay must be in \(0, 1\], got 0.0"):
        make_eviction("lfu", 0.0)
    with pytest.raises(HelmInputError, match="unknown EMB policy 'LFU'"):
        EmbCache(4, ROW, "LFU")
    assert isinstance(make_eviction("lru"), LRU) and make_eviction("lfu", lazy=True).lazy
