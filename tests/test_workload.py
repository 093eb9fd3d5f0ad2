import numpy as np
import pytest

from helmgr.core.errors import HelmInputError
from helmgr.workload import WorkloadSpec, default_config, describe, parse_regime, synthetic_workload
from helmgr.workload.chunk import ragged_positions
from helmgr.workload.popularity import ItemSpace, zipf_pmf, zipf_ranks
from helmgr.workload.users import PrefixTracker

SMALL = dict(n_items=64_000, n_clusters=16, n_users=20_000, rps=200.0, duration_s=30.0)


def stream(regime="steady", seed=0, **kw):
    w = synthetic_workload(default_config(regime, **(SMALL | kw)), seed)
    return w, list(w.chunks())


def test_zipf_draws_follow_their_pmf():
    rng = np.random.default_rng(0)
    draws = zipf_ranks(rng, 100, 0.9, 400_000)
    freq = np.bincount(draws, minlength=100) / len(draws)
    np.testing.assert_allclose(freq, zipf_pmf(100, 0.9), atol=0.003)
    assert zipf_pmf(1000, 1.0).sum() == pytest.approx(1.0)


def test_ragged_positions_match_a_loop():
    starts, counts = np.array([5, 0, 7]), np.array([2, 0, 3])
    rows, pos = ragged_positions(starts, counts)
    assert rows.tolist() == [0, 0, 2, 2, 2] and pos.tolist() == [5, 6, 7, 8, 9]


def test_prefix_tracker_matches_a_loop():
    rng = np.random.default_rng(1)
    tracker, grown = PrefixTracker(), {}
    for _ in range(4):
        users = rng.integers(0, 3000, 500)
        n_new = rng.integers(1, 6, 500).astype(np.int32)
        expected = []
        for u, k in zip(users.tolist(), n_new.tolist()):
            expected.append(grown.get(u, 0))
            grown[u] = grown.get(u, 0) + k
        assert tracker.advance(users, n_new).tolist() == expected


def test_item_space_shift_stays_in_the_segment():
    space = ItemSpace(100, 4)
    ids = np.array([0, 24, 25, 99])
    assert space.shift(ids, 3).tolist() == [3, 2, 28, 77]
    assert space.head_ids(np.array([0, 1])).tolist() == [0, 99]
    assert space.tail_ids(np.array([0, 1]), np.array([2, 2])).tolist() == [50, 74]
    assert space.prior(0.5, 0.9, 0.7).sum() == pytest.approx(1.0)


def test_same_seed_same_stream_other_seed_differs():
    _, a = stream(seed=3)
    _, b = stream(seed=3)
    _, c = stream(seed=4)
    for x, y in zip(a, b):
        for f in ("t", "user", "prefix_len", "item_ids", "cand_ids"):
            np.testing.assert_array_equal(getattr(x, f), getattr(y, f))
    assert not np.array_equal(np.concatenate([x.user for x in a])[:100], np.concatenate([x.user for x in c])[:100])


def test_chunks_are_in_time_order_with_consistent_offsets():
    w, chunks = stream()
    t = np.concatenate([c.t for c in chunks])
    assert np.all(np.diff(t) >= 0) and t[0] >= 0 and t[-1] < w.duration_s
    for c in chunks:
        assert c.item_offsets[-1] == len(c.item_ids) == c.new_tokens.sum()
        assert np.all(np.diff(c.cand_offsets) == 512)
        assert c.cand_ids.min() >= 0 and c.cand_ids.max() < w.n_items


def test_new_tokens_become_the_next_requests_prefix():
    w, chunks = stream()
    seen: dict[int, int] = {}
    checked = 0
    for c in chunks:
        for i in range(0, len(c), 7):
            u, p, k = int(c.user[i]), int(c.prefix_len[i]), int(c.new_tokens[i])
            np.testing.assert_array_equal(c.items(i), w.history(u, p, p + k))
        for u, p, k in zip(c.user.tolist(), c.prefix_len.tolist(), c.new_tokens.tolist()):
            if u in seen:
                assert p == seen[u]
                checked += 1
            seen[u] = p + k
    assert checked > 1000


@pytest.mark.parametrize("regime, duration, kw", [("burst", 60.0, dict(burst_len_s=(2.0, 6.0), burst_mult=(3.0, 5.0))),
                                                  ("burst", 120.0, {})])
def test_burst_sessions_are_new_users_on_a_trending_set(regime, duration, kw):
    w, chunks = stream(regime, seed=1, duration_s=duration, **kw)
    assert w.bursts
    users = np.concatenate([c.user[c.burst] for c in chunks])
    assert len(users) and np.mean(users >= SMALL["n_users"]) > 0.8
    b = w.bursts[0]
    for c in chunks:
        rows = np.flatnonzero(c.burst & (c.t >= b.start) & (c.t < b.end))
        for i in rows[:20]:
            lead = c.candidates(i)[:256]
            assert np.all((lead - b.trend_start) % w.n_items < w.trending.items)


def test_unknown_regime_is_a_named_error():
    with pytest.raises(HelmInputError, match="unknown workload 'bursty'"):
        parse_regime("bursty")
    assert parse_regime("trend+burst") == {"trend", "burst"}
    with pytest.raises(HelmInputError, match=r"unknown workload 'burst\+flash'"):
        parse_regime("burst+flash")
    with pytest.raises(HelmInputError, match="names a regime twice"):
        parse_regime("trend+trend")


@pytest.fixture(scope="module")
def default_regimes():
    """Steady and burst as `helmgr workload --workload R --duration 120 --seed 1` makes them (burst
    seed 1: one burst, x2.13 from 43.5 s to 93.6 s)."""
    out = {}
    for regime in ("steady", "burst"):
        w = synthetic_workload(default_config(regime, duration_s=120.0), seed=1)
        out[regime] = describe(w.chunks(), w.duration_s, w.n_items)[0]
    return out


def test_burst_peaks_at_twice_its_median(default_regimes):
    s = default_regimes["burst"]
    assert s["peak_rps_1s"] >= 2 * s["median_rps_1s"]


def test_a_burst_turns_the_hot_set_over_twice_as_fast(default_regimes):
    assert default_regimes["burst"]["hot_set_turnover_per_min"] >= 2 * default_regimes["steady"]["hot_set_turnover_per_min"]


def test_steady_is_steady(default_regimes):
    s = default_regimes["steady"]
    assert s["rps"] == pytest.approx(1300, rel=0.05)
    assert s["peak_rps_1s"] < 1.3 * s["median_rps_1s"]
    assert 0.5 < s["returning_share"] < 1.0


def test_scalar_and_vector_hashes_agree():
    from helmgr.core.hashing import hash_uniform, hash_uniform_one
    users = np.array([0, 1, 12345, 2**40 + 7])
    np.testing.assert_array_equal(hash_uniform(users, 36), [hash_uniform_one(int(u), 36) for u in users])


def test_history_one_user_equals_the_batch_path():
    w, _ = stream()
    users = np.array([3, 3, 99_999, 5])
    starts = np.array([0, 10, 500, w.history.per_cluster])   # the last one wraps around its pool
    counts = np.array([10, 5, 40, 30])
    flat = w.history.batch(users, starts, counts)
    expected = np.concatenate([w.history(int(u), int(a), int(a + k)) for u, a, k in zip(users, starts, counts)])
    np.testing.assert_array_equal(flat, expected)


def test_poisson_times_when_the_grid_rounds_onto_its_end():
    """arange(1.0, 1.3, 0.1)'s last step lands just past 1.3: a bin of negative width made the
    Poisson draw fail (found by the fuzz test: compare --duration 1.3 --rps 1)."""
    from helmgr.workload.arrivals import poisson_times
    assert np.arange(1.0, 1.3, 0.1)[-1] >= 1.3
    t = poisson_times(np.random.default_rng(0), lambda t: np.full(np.shape(t), 500.0), 1.0, 1.3)
    assert 100 < len(t) < 200 and t.min() >= 1.0 and t.max() < 1.3 and np.all(np.diff(t) >= 0)


def test_a_workload_pickles_its_candidate_pools_not_their_windows():
    """A cluster is sent to Ray workers whole (the oracle's replays): its candidate pools and
    trend's pool of trending ranks pickle as the pools (a view of every window would pickle as
    every window copied: 8.6 GB for the v2 default), and draw the same afterwards."""
    cloudpickle = pytest.importorskip("cloudpickle")        # (what Ray sends: a workload has closures)

    from helmgr.workload import WorkloadSpec
    w = WorkloadSpec("trend", 5.0, 1).build()
    blob = cloudpickle.dumps(w, protocol=5)
    assert len(blob) < 128e6      # 85 MB; 619 MB when trend's pool of trending ranks was a view of its windows
    back = cloudpickle.loads(blob)
    clusters = np.arange(64) % 8
    assert np.array_equal(back.candidates.draw(np.random.default_rng(3), clusters),
                          w.candidates.draw(np.random.default_rng(3), clusters))
    assert all(np.array_equal(a.cand_ids, b.cand_ids) for a, b in zip(back.chunks(1.0), w.chunks(1.0)))


@pytest.mark.parametrize("head_share", [0.0, 0.25, 1.0])
def test_candidate_draws_are_runs_of_the_pools(head_share):
    """Each request's candidates are `n_head` consecutive head-pool entries, then `n_tail`
    consecutive tail-pool entries shifted into its cluster's segment (found by a scan of every
    offset); the same rng state draws the same candidates."""
    from helmgr.workload.candidates import PoolCandidates, SyntheticCandidates

    def is_run(row, pool):
        w = len(row)
        return w == 0 or any(np.array_equal(pool[s:s + w], row) for s in range(len(pool) - w + 1))

    space = ItemSpace(12_000, 6)
    c = SyntheticCandidates(np.random.default_rng(1), space, 20, head_share, 0.9, 1.1, pool_size=500)
    clusters = np.array([0, 5, 2, 2, 3, 1, 4])
    got = c.draw(np.random.default_rng(9), clusters)
    assert got.dtype == np.int64 and got.shape == (7, 20) and c.n_head == round(20 * head_share)
    for row, cl in zip(got, clusters):
        tail = row[c.n_head:] - cl * space.segment
        assert is_run(row[:c.n_head], c.head_pool) and is_run(tail, c.tail_pool)
        assert np.all((tail >= 0) & (tail < space.segment))
    assert np.array_equal(got, c.draw(np.random.default_rng(9), clusters))
    p = PoolCandidates(np.random.default_rng(1), np.arange(1.0, 51.0), 8, pool_size=300, segment=50)
    got = p.draw(np.random.default_rng(4), clusters)
    assert got.shape == (7, 8) and all(is_run(row - cl * 50, p.ids) for row, cl in zip(got, clusters))


def test_cut_runs_block_by_block_equal_one_gather():
    """`cut_runs` copies its runs out a block of requests at a time, into a column slice of a wider
    array, with a value added per run: equal to one gather at the offsets the same rng draws
    (1,300 runs: two whole blocks and a part), the columns beside the slice untouched."""
    from helmgr.workload.candidates import _BLOCK, cut_runs
    pool = np.arange(1000, 1100) * 3
    n, w = 1300, 7
    assert 2 * _BLOCK < n < 3 * _BLOCK
    at = np.random.default_rng(2).integers(0, len(pool) - w + 1, n)
    ref = pool[at[:, None] + np.arange(w)]
    add = np.arange(n) * 10_000
    out = np.full((n, w + 2), -1)
    cut_runs(np.random.default_rng(2), pool, w, n, out[:, 1:1 + w], add)
    assert np.array_equal(out[:, 1:1 + w], ref + add[:, None]) and np.all(out[:, [0, -1]] == -1)
    assert np.array_equal(cut_runs(np.random.default_rng(2), pool, w, n), ref)
    assert cut_runs(np.random.default_rng(2), pool, 0, 5).shape == (5, 0)


@pytest.mark.parametrize("ramp_s, first_half", [(0.0, 20_000), (10.0, 10_000)])
def test_burst_ramp_rises_linearly_to_its_multiple(ramp_s, first_half):
    """A x3 burst on a base of 1,000 req/s, one request per session, from 10 s to 30 s: 2,000 extra
    req/s, so 20,000 in each 10 s; ramped over 10 s, the first 10 s hold half of that
    (the integral of 2,000 x (t - 10) / 10), the next 10 s all of it."""
    from helmgr.workload.arrivals import Burst, BurstSource, Population, SessionShape
    src = BurstSource([Burst(10.0, 30.0, 3.0, 0)], lambda t: np.full_like(np.asarray(t, float), 1000.0),
                      SessionShape(1.0, 1.0, 4.0), Population(1000, 0.3), 0.9, 1000, ramp_s=ramp_s)
    t = src.arrivals(np.random.default_rng(7), 0.0, 40.0).t
    assert t.min() >= 10.0 and t.max() < 30.0
    assert np.count_nonzero(t < 20.0) == pytest.approx(first_half, rel=0.03)     # Poisson sd: 100-141
    assert np.count_nonzero(t >= 20.0) == pytest.approx(20_000, rel=0.03)
    with pytest.raises(HelmInputError, match="burst_ramp_s"):
        default_config("burst", burst_ramp_s=-1.0).validate()


def test_a_built_workload_is_kept_and_a_run_leaves_it_as_it_was():
    """WorkloadSpec.build keeps the last synthetic workloads it built; that is sound only if a run
    reads a workload and never changes it: a second run on the same object is the first again."""
    from helmgr.sim import SimConfig, simulate
    from helmgr.workload import WorkloadSpec
    spec = WorkloadSpec("trend", 12.0, 3, 300.0)
    w = spec.build()
    assert WorkloadSpec("trend", 12.0, 3, 300.0).build() is w and WorkloadSpec("trend", 12.0, 4, 300.0).build() is not w
    cfg = SimConfig(nodes=2, policy="helm", router="helm", seed=3, warmup_s=2.0)
    runs = [simulate(cfg, w).summary for _ in range(2)]
    keys = ("requests", "p50_ms", "p99_ms", "emb_hit_rate", "kv_hit_rate", "mean_ratio")
    assert [runs[0][k] for k in keys] == [runs[1][k] for k in keys] and runs[0]["requests"] > 0


def test_a_spec_knows_its_seconds_before_it_is_built():
    spec = WorkloadSpec("burst", None, 1, time_compression=36.0)
    assert spec.seconds == spec.build().duration_s == 10.0                # 360 s / 36
    assert WorkloadSpec().seconds == 360.0 and WorkloadSpec("trend", 7.0).seconds == 7.0
    assert WorkloadSpec(trace="x.inter").seconds == 120.0                 # a log's replay, by default
