import numpy as np
import pytest

from helmgr.core.errors import HelmInputError
from helmgr.memory.emb import EmbCache

ROW = 64


def cache(n=8, rows=3, policy="lfu", band=2, scores=None, decay=0.5):
    c = EmbCache(n, ROW, policy, band_rows=band, decay=decay)
    c.resize(rows * ROW)
    c.warm(np.asarray(scores if scores is not None else np.arange(n)[::-1], np.float32))
    return c


def resident(c):
    return set(np.flatnonzero(c.resident).tolist())


def test_warm_start_holds_the_hottest_rows():
    c = cache(scores=[5, 1, 7, 3, 9, 0, 2, 4])
    assert resident(c) == {4, 2, 0}       # scores 9, 7, 5
    assert c.unfilled_rows == 0
    c.check_integrity()


def test_lfu_eviction_order_with_decay():
    # scores 4,3,2,1 for rows 0..3 (others 0); decay 0.5 then counts
    c = cache(n=6, rows=2, scores=[4, 3, 2, 1, 0, 0])
    c.lookup(np.array([3, 3, 3, 2, 5, 5, 5, 5]))
    c.refresh()
    # new scores: row0 2, row1 1.5, row2 1+1=2, row3 0.5+3=3.5, row5 4 -> top 2 = rows 5, 3
    # (held lazily aged: times the weight of an access now, 1 / decay per refresh)
    np.testing.assert_allclose(c.scores / c.policy.weight, [2, 1.5, 2, 3.5, 0, 4])
    assert set(np.flatnonzero(c.wanted)) == {5, 3}
    assert resident(c) == set()          # both were cold: wanted, not yet filled
    assert c.unfilled_rows == 2
    # shrinking to one row evicts the colder of the two (row 3)
    c.resize(1 * ROW)
    assert set(np.flatnonzero(c.wanted)) == {5}
    c.check_integrity()


def test_lfu_ties_break_by_row_id():
    c = cache(n=5, rows=2, scores=[1, 1, 1, 1, 1])
    assert resident(c) == {0, 1}
    c.resize(3 * ROW)
    assert set(np.flatnonzero(c.wanted)) == {0, 1, 2}
    c.check_integrity()


def test_lru_keeps_the_most_recent_epoch():
    c = cache(n=6, rows=2, policy="lru", scores=[0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    c.lookup(np.array([4]))
    c.refresh()                           # epoch 1: row 4 -> 1.5
    c.lookup(np.array([5, 5, 2]))
    c.refresh()                           # epoch 2: row 5 -> 2 + 2/3, row 2 -> 2 + 1/3
    assert set(np.flatnonzero(c.wanted)) == {5, 2}
    c.resize(1 * ROW)
    assert set(np.flatnonzero(c.wanted)) == {5}
    c.check_integrity()


def test_lookup_counts_hits_and_records_accesses():
    c = cache(n=8, rows=3)                # rows 0, 1, 2 resident
    hits, unfilled = c.lookup(np.array([0, 1, 5, 7, 0]))
    assert (hits, unfilled) == (3, 0)
    assert c.hit_rate == pytest.approx(3 / 5)
    c.check_integrity()


def test_growth_leaves_unfilled_rows_that_a_miss_admits():
    c = cache(n=8, rows=2)                # rows 0, 1 resident
    c.resize(4 * ROW)                     # rows 2, 3 wanted, unfilled
    assert c.unfilled_rows == 2 and resident(c) == {0, 1}
    hits, unfilled = c.lookup(np.array([2, 2, 6]))
    assert (hits, unfilled) == (0, 2)     # both accesses to row 2 missed it; row 6 is not wanted
    assert resident(c) == {0, 1, 2}
    assert c.lookup(np.array([2]))[0] == 1
    c.check_integrity()


def test_fill_queue_is_hottest_first():
    c = cache(n=10, rows=2)
    c.resize(6 * ROW)
    assert c.next_unfilled(2).tolist() == [2, 3]
    assert c.next_unfilled(10).tolist() == [4, 5]
    assert c.fill(np.array([2, 3, 9])) == 2
    assert c.unfilled_rows == 2
    c.check_integrity()


def reference_top(scores, c):
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return set(order[:c])


def test_resizes_match_a_full_sort():
    rng = np.random.default_rng(0)
    n = 500
    scores = rng.integers(0, 40, n).astype(np.float32)   # many ties
    c = EmbCache(n, ROW, band_rows=16)
    c.resize(100 * ROW)
    c.warm(scores)
    for rows in rng.integers(0, n + 20, 60):
        c.resize(int(rows) * ROW)
        assert set(np.flatnonzero(c.wanted)) == reference_top(scores, min(int(rows), n))
        c.check_integrity()


def test_capacity_beyond_the_table_holds_everything():
    c = cache(n=5, rows=50)
    assert c.n_wanted == 5 and resident(c) == {0, 1, 2, 3, 4}
    c.check_integrity()


def test_lookup_counts_survive_the_state_encoding_on_huge_requests():
    c = cache(n=200_000, rows=100_000, scores=np.arange(200_000)[::-1])
    c.resize(150_000 * ROW)                          # rows 100,000 .. 149,999 unfilled
    ids = np.r_[np.arange(70_000), np.arange(100_000, 100_010)]
    assert c.lookup(ids) == (70_000, 10)
    c.check_integrity()


def test_shadow_rows_count_the_hits_a_bigger_cache_would_have():
    c = cache(n=10, rows=3)                          # rows 0-2 wanted; shadow: rows 3, 4
    c.track_shadow(2)
    c.lookup(np.array([0, 3, 3, 4, 9]))
    c.refresh()
    assert c.shadow_hits == 3                        # 3, 3, 4; row 9 is beyond the shadow
    c.check_integrity()


def test_unknown_policies_and_decays_are_input_errors():
    with pytest.raises(HelmInputError, match=r"unknown EMB policy 'fifo' \(known: lfu, lru\)"):
        EmbCache(8, ROW, "fifo")
    with pytest.raises(HelmInputError, match=r"LFU decay must be in \(0, 1\], got 1.5"):
        EmbCache(8, ROW, "lfu", decay=1.5)


@pytest.mark.parametrize("values", [
    np.array([3.0, 1.0, 2.0, 2.0]),                       # ties
    np.zeros(50),                                         # all equal
    np.array([1e-45, 0.0, 1e38, 7.5]),                    # denormal, zero, huge
    np.random.default_rng(0).integers(0, 5, 5000),        # few distinct values
    np.random.default_rng(1).random(20_000) * 1e6,
])
def test_compiled_rank_selection_matches_a_partition(values):
    """The cache's radix selection gives the partition's value at every rank checked (the slow,
    obvious reference), and falls back to it for a negative score."""
    from helmgr.memory.emb import value_at_rank
    from helmgr.memory.eviction import value_at_rank as reference
    a = np.asarray(values, np.float32)
    for r in sorted({0, 1, len(a) // 3, len(a) // 2, len(a) - 2, len(a) - 1}):
        assert value_at_rank(a, r) == reference(a, r)
    b = a.copy()
    b[0] = -1.0
    assert value_at_rank(b, len(b) - 1) == -1.0


@pytest.mark.parametrize("values", [
    np.array([3.0, 1.0, 2.0, 2.0, 2.0, 0.5]),             # ties at a rank
    np.random.default_rng(2).integers(0, 7, 3000),        # few distinct values, one high bin
    np.random.default_rng(3).random(20_000) * 1e6,        # ranks in different high bins
])
def test_two_ranks_share_their_passes_and_cut_as_a_sort_does(values):
    """`values_at_ranks` gives the partition's value at both ranks (the same high bin or not),
    and `_cut` (its counts read from the histograms) the k-th key of a full sort by (score desc,
    row id asc): its score and the last row kept among the rows of that score."""
    from helmgr.memory.emb_kernels import _cut, values_at_ranks
    from helmgr.memory.eviction import value_at_rank as reference
    a = np.asarray(values, np.float32)
    rows = np.random.default_rng(4).permutation(len(a)).astype(np.int64) * 3
    ranks = sorted({0, 1, 2, len(a) // 3, len(a) // 2, len(a) - 2, len(a) - 1})
    for ra in ranks:
        for rb in ranks:
            assert tuple(values_at_ranks(a, ra, rb)) == (reference(a, ra), reference(a, rb))
    order = np.lexsort((rows, -a))
    for k in ranks[1:] + [len(a)]:
        p, last = _cut(a, rows, k)
        kept = order[:k]
        assert p == a[order[k - 1]]
        tied = np.flatnonzero(a == p)
        if np.isin(tied, kept).all():
            assert last == 1 << 62                  # every row of that score is kept
        else:
            assert last == rows[order[k - 1]]
    assert _cut(a, rows, 0) == (np.inf, -1)


# -- sampling (sample_shift: one item id in 2**shift tracked) ------------------------------------------
def test_a_sampled_lookup_scales_its_sampled_misses_up():
    """k = 4: ids 0..15 and 0 again; the sampled ones are 0, 4, 8, 12, 0 (rows 0, 1, 2, 3, 0). Row 0
    resident, 1 unfilled, 2 absent, 3 resident: 5 sampled, 3 hits (0, 12, 0), 1 unfilled (4) ->
    2 sampled misses stand for 8 of the 17 ids, hits 17 - 8 = 9, unfilled 1 x 4 = 4; row 1 is
    admitted and the 5 sampled rows recorded."""
    from helmgr.memory.emb import ABSENT, RESIDENT, UNFILLED
    c = EmbCache(4, 4 * ROW, band_rows=2, sample_shift=2)
    c.state[:] = [RESIDENT, UNFILLED, ABSENT, RESIDENT]
    assert c.lookup(np.r_[np.arange(16), 0]) == (9, 4)
    assert c.lookups == 17 and c.hits == 9
    assert c.state[1] == RESIDENT
    np.testing.assert_array_equal(np.concatenate(c._pending), [0, 1, 2, 3, 0])
    # each sampled miss stands for 4, even in a lookup of fewer ids (an unbiased estimate): 1 id,
    # its sampled row absent -> 4 misses, hits 1 - 4
    assert c.lookup(np.array([8])) == (-3, 0)
    # ids that are not sampled are neither checked nor recorded: all hits, nothing recorded
    c._pending.clear()
    assert c.lookup(np.array([9, 10, 11])) == (3, 0) and not c._pending


def test_a_sampled_cache_warms_each_row_as_its_item_unsampled():
    """A sampled row's warm score is its item's in an unsampled cache: items 0 and 4 of shares
    4, 3, 2, 1, 4, 3, 2, 1 hold 8 of 20, so they see 8 / 20 of the accesses per refresh."""
    shares = np.array([4, 3, 2, 1, 4, 3, 2, 1], float)
    full, sampled = EmbCache(8, ROW, band_rows=2), EmbCache(2, 4 * ROW, band_rows=2, sample_shift=2)
    for c in (full, sampled):
        c.resize(2 * ROW * (1 if c is full else 4))
        c.warm_items(shares, 10.0)
    np.testing.assert_allclose(sampled.scores, full.scores[[0, 4]], rtol=1e-6)


def test_a_sampled_cache_has_the_hit_rate_of_the_whole_cache():
    """One node's share of the default workload, 1 in 8 requests recomputing its whole history:
    sampling 1 id in 4 or 16 keeps the hit rate within 0.5 points (0.716, 0.715, 0.714; a sampled
    cache warmed as if its rows saw every access is 0.9 points off: the bug this catches)."""
    from helmgr.workload.synthetic import default_config, synthetic_workload
    w = synthetic_workload(default_config("steady", duration_s=8.0, rps=1300.0), seed=1)
    rng = np.random.default_rng(0)
    epochs = []
    for ch in w.chunks(1.0):
        co, io = ch.cand_offsets, ch.item_offsets
        reqs = []
        for i in range(0, len(co) - 1, 8):
            items = ch.item_ids[io[i]:io[i + 1]]
            if rng.random() < 0.125:
                items = w.history(int(ch.user[i]), 0, int(ch.prefix_len[i]) + len(items))
            reqs.append(np.concatenate([ch.cand_ids[co[i]:co[i + 1]], items]))
        epochs.append(reqs)
    per_refresh = sum(len(r) for r in epochs[0])
    rates = {}
    for k in (1, 4, 16):
        shift = k.bit_length() - 1
        c = EmbCache(-(-w.n_items >> shift), 65536 << shift, band_rows=1024, sample_shift=shift)
        c.resize(600_000 * 65536)
        c.warm_items(w.prior, per_refresh)
        for t, reqs in enumerate(epochs):
            if t == 2:
                c.lookups = c.hits = 0
            for r in reqs:
                c.lookup(r)
            c.refresh()
        rates[k] = c.hit_rate
    assert 0.6 < rates[1] < 0.95
    assert abs(rates[4] - rates[1]) < 0.005 and abs(rates[16] - rates[1]) < 0.005, rates
