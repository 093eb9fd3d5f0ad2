"""The EMB cache's incremental refresh against slow, obvious references: the exact top-c of its own
scores after every refresh and resize; today's (first version's) eagerly aged refresh, which it
differs from only at near-ties; warm starts copied from a warmed cache; the access API a compiled
engine uses."""
import numpy as np
import pytest

from helmgr.memory.emb import ABSENT, RESIDENT, UNFILLED, EmbCache, _check
from helmgr.memory.eviction import keep_top

ROW = 64


class EagerReference:
    """The first version's refresh: every score times `decay` at each refresh with accesses, then
    + the interval's counts (`np.bincount`), float32; wanted = the top c, ties to the lower id."""

    def __init__(self, scores, c, decay):
        self.scores, self.c, self.decay = np.asarray(scores, np.float32).copy(), c, decay

    def refresh(self, accesses):
        counts = np.bincount(accesses, minlength=len(self.scores))
        self.scores *= self.decay
        ids = np.flatnonzero(counts)
        self.scores[ids] = self.scores[ids] + counts[ids].astype(np.float32) * 1.0

    @property
    def wanted(self):
        return keep_top(self.scores, self.c)


def zipf_stream(n, per_refresh, refreshes, seed, alpha=0.9):
    """`refreshes` batches of `per_refresh` accesses over n items, popularity ~ rank^-alpha over a
    shuffled catalogue (so hot rows are not the low ids)."""
    rng = np.random.default_rng(seed)
    p = np.arange(1, n + 1, dtype=np.float64) ** -alpha
    p = rng.permutation(p / p.sum())
    for _ in range(refreshes):
        yield rng.choice(n, per_refresh, p=p), p


def wanted(c):
    return c.state != ABSENT


@pytest.mark.parametrize("ties", [False, True])
def test_every_refresh_and_resize_selects_the_exact_top_of_its_scores(ties):
    """Many small refreshes, resizes small and large, and a narrow band (the window is re-centred
    every few refreshes and rebuilt after large resizes): the wanted set is keep_top of the
    cache's scores each time, and rows keep their state across a refresh exactly as the first
    version's rebuild of the state did. With ties, the prior is 50 distinct values."""
    n, rng = 3000, np.random.default_rng(1)
    c = EmbCache(n, ROW, band_rows=16)
    c.resize(600 * ROW)
    c.warm(rng.integers(0, 50, n).astype(np.float32) if ties else rng.random(n) * 50)
    for step, (acc, _) in enumerate(zipf_stream(n, 400, 300, seed=2)):
        c.lookup(acc[:200])
        c.lookup(acc[200:])
        if step % 7 == 3:
            c.fill(c.next_unfilled(50))
        before = c.state.copy()
        c.refresh()
        want = keep_top(c.scores, c.n_wanted)
        assert np.array_equal(wanted(c), want), step
        stayed = want & (before != ABSENT)
        assert np.array_equal(c.state[stayed], before[stayed])
        assert np.all(c.state[want & (before == ABSENT)] == UNFILLED)
        if step % 11 == 5:
            rows = c.n_wanted + int(rng.integers(-30, 30)) if step % 2 else int(rng.integers(0, n + 50))
            c.resize(rows * ROW)
            assert np.array_equal(wanted(c), keep_top(c.scores, c.n_wanted))
        c.check_integrity()


@pytest.mark.parametrize("ties", [False, True])
def test_the_shadow_a_refresh_keeps_is_the_rows_just_below_the_cut(ties):
    """The shadow a refresh takes from its last re-selection (`_settle`) is `_rows_below`'s, row
    for row: found anew from the scores, and by brute force the absent rows that score at least
    the (c + shadow)-th best. Resizes between refreshes move the cut; small shadows stay inside
    the window; a large one reaches past it after a resize, and the refresh rebuilds the window
    (`_select`) so that the next ones need no rank of the whole table."""
    n, rng = 3000, np.random.default_rng(4)
    for shadow in (40, 700):
        c = EmbCache(n, ROW, band_rows=16)
        c.resize(600 * ROW)
        c.warm(rng.integers(0, 50, n).astype(np.float32) if ties else rng.random(n) * 50)
        c.track_shadow(shadow)
        from_settle = 0
        for step, (acc, _) in enumerate(zipf_stream(n, 400, 120, seed=3)):
            c.lookup(acc)
            c.refresh()
            from_settle += c._settled is not None
            slow = c._rows_below(c.n_wanted)
            assert np.array_equal(c._shadow, slow), step
            if c.n_wanted < n:
                floor = np.sort(c.scores)[::-1][min(c.n_wanted + shadow, n) - 1]
                brute = np.flatnonzero((c.state == ABSENT) & (c.scores >= floor))
                assert np.array_equal(np.sort(c._shadow), brute), step
            if step % 9 == 4:
                c.resize(int(rng.integers(300, 900)) * ROW)
        assert from_settle > 100


@pytest.mark.parametrize("policy,decay", [("lfu", 0.5), ("lru", 0.99), ("lfu", 1.0)])
def test_other_policies_and_rescales_select_exactly(policy, decay):
    """LRU (a full selection every refresh), plain frequency, and decay 0.5: the lazy weight
    passes 1e18 after 60 refreshes and every score is rescaled (a full selection then)."""
    n = 800
    c = EmbCache(n, ROW, policy, band_rows=8, decay=decay)
    c.resize(200 * ROW)
    c.warm(np.linspace(1, 0, n, dtype=np.float32))
    for step, (acc, _) in enumerate(zipf_stream(n, 150, 90, seed=4)):
        c.lookup(acc)
        c.refresh()
        assert np.array_equal(wanted(c), keep_top(c.scores, 200)), step
        c.check_integrity()
    if (policy, decay) == ("lfu", 0.5):
        assert c.policy.rescales == 1


def test_lazy_scores_are_the_eager_decayed_counts_up_to_scale():
    n = 2000
    c = EmbCache(n, ROW, band_rows=32)
    c.resize(400 * ROW)
    prior = np.random.default_rng(0).random(n).astype(np.float32) * 20
    c.warm(prior)
    ref = EagerReference(prior, 400, 0.99)
    for acc, _ in zipf_stream(n, 1000, 100, seed=5):
        c.lookup(acc)
        c.refresh()
        ref.refresh(acc)
    np.testing.assert_allclose(c.scores / c.policy.weight, ref.scores, rtol=2e-5)


def test_admission_matches_the_eager_refresh_but_for_near_ties():
    """The measured bound (docs/node.md): a Zipf stream at the simulator's density (0.28
    accesses per item and refresh, capacity 29 % of the catalogue, as a v2 node at 32 nodes)
    for 3,000 refreshes. Eager aging rounds every score at every refresh, lazy aging rounds only
    the accesses, so the two rankings may swap rows whose scores are within rounding of each
    other: measured on three seeds, a pair of rows swapped on 1 to 5 refreshes of 3,000, both
    scored within 5e-7 (a few float32 steps) of the capacity edge."""
    n, cap, per = 20_000, 5_734, 5_600
    stream = zipf_stream(n, per, 3000, seed=7)
    first, p = next(stream)
    c = EmbCache(n, ROW, band_rows=max(1024, cap // 32))
    c.resize(cap * ROW)
    c.warm(p, per_refresh=per)
    ref = EagerReference(c.scores, cap, 0.99)
    differing, worst_gap = [], 0.0
    for acc in [first] + [a for a, _ in stream]:
        c.record(acc)
        c.refresh()
        ref.refresh(acc)
        assert np.array_equal(wanted(c), keep_top(c.scores, cap))      # exact on its own scores
        rw = ref.wanted
        diff = np.flatnonzero(wanted(c) != rw)
        differing.append(len(diff))
        if len(diff):
            edge = ref.scores[rw].min()
            worst_gap = max(worst_gap, float(np.max(np.abs(ref.scores[diff] - edge) / edge)))
    differing = np.array(differing)
    assert differing.max() <= 4 and np.count_nonzero(differing) <= 0.01 * len(differing)
    assert worst_gap < 2e-6


def test_warm_from_gives_the_cache_warm_gives():
    prior = np.random.default_rng(3).random(5000)
    made = []
    for _ in range(3):
        c = EmbCache(5000, ROW, band_rows=64)
        c.resize(1200 * ROW)
        made.append(c)
    a, b, src = made
    a.warm(prior, per_refresh=900.0)
    src.warm(prior, per_refresh=900.0)
    assert b.can_warm_from(src)
    b.warm_from(src)
    va, vb = vars(a), vars(b)
    assert va.keys() == vb.keys()
    for k in va:
        if isinstance(va[k], np.ndarray):
            assert va[k].dtype == vb[k].dtype and np.array_equal(va[k], vb[k]), k
            assert va[k] is not vb[k] or va[k].size == 0, k
        elif k == "policy":
            assert type(va[k]) is type(vb[k]) and vars(va[k]) == vars(vb[k])
        else:
            assert va[k] == vb[k], k
    assert b.scores is not src.scores and b.state is not src.state
    for acc, _ in zipf_stream(5000, 800, 5, seed=8):         # and they go on the same way
        a.lookup(acc), b.lookup(acc)
        a.refresh(), b.refresh()
        assert np.array_equal(a.state, b.state) and np.array_equal(a.scores, b.scores)
    assert not src.can_warm_from(a)                     # a has taken traffic; src has not
    other = EmbCache(5000, ROW, band_rows=64)
    other.resize(1200 * ROW)
    assert other.can_warm_from(src)
    other.resize(1000 * ROW)
    assert not other.can_warm_from(src)
    with pytest.raises(ValueError, match="warm_from"):
        other.warm_from(src)


def test_a_cluster_warms_one_node_and_copies_the_rest(monkeypatch):
    from helmgr.core.profiles import node_profile
    from helmgr.policy.policies import make_policy
    from helmgr.routing.routers import make_router
    from helmgr.sim import SimConfig
    from helmgr.sim.cluster import Cluster
    from helmgr.workload import default_config, synthetic_workload
    w = synthetic_workload(default_config("steady", n_items=50_000, n_clusters=8, n_users=5_000, rps=200.0,
                                          duration_s=2.0), 0)
    cfg = SimConfig(nodes=3, warmup_s=0.0)
    warms = []
    real_warm = EmbCache.warm
    monkeypatch.setattr(EmbCache, "warm", lambda self, *a, **k: warms.append(self) or real_warm(self, *a, **k))
    cl = Cluster(cfg, w, node_profile(cfg.hardware, cfg.model), make_router(cfg.router), make_policy(cfg.policy))
    nodes = cl.nodes
    assert warms == [nodes[0].emb]
    assert all(n.emb.scores is not nodes[0].emb.scores for n in nodes[1:])
    alone = EmbCache(w.n_items, nodes[0].emb.row_bytes, band_rows=nodes[0].emb.band_rows)
    alone.resize(nodes[0].emb.capacity_rows * alone.row_bytes)
    alone.warm(w.prior, per_refresh=cl.ids_per_refresh)
    for n in nodes:
        assert np.array_equal(n.emb.state, alone.state) and np.array_equal(n.emb.scores, alone.scores)
        assert n.emb.n_resident == alone.n_resident == alone.n_wanted
    ids = np.arange(0, w.n_items, 7)
    for n in nodes:                                   # each goes on on its own
        n.emb.lookup(ids)
        n.emb.refresh()
        n.check_integrity()


def test_record_and_add_counts_are_lookup_split_in_two():
    """An engine that checks residency on `state` itself (here: `_check`, in place) and reports
    through `record` and `add_counts` leaves the cache exactly as `lookup` does."""
    n = 4000
    caches = []
    for _ in range(2):
        c = EmbCache(n, ROW, band_rows=32)
        c.resize(900 * ROW)
        c.warm(np.linspace(2, 1, n))
        c.resize(1100 * ROW)                                  # 200 rows wanted, unfilled
        caches.append(c)
    a, b = caches
    for acc, _ in zipf_stream(n, 700, 6, seed=9):
        for part in np.array_split(acc, 5):
            got = a.lookup(part)
            b.record(part)
            hits, unfilled = _check(b.state, part)
            b.add_counts(len(part), hits, unfilled)
            assert got == (hits, unfilled)
        a.refresh(), b.refresh()
    for f in ("lookups", "hits", "unfilled_misses", "n_resident", "n_wanted"):
        assert getattr(a, f) == getattr(b, f), f
    assert np.array_equal(a.state, b.state)
    b.check_integrity()


def test_a_callers_state_array_is_used_in_place():
    table = np.full((3, 500), 7, np.uint8)
    c = EmbCache(500, ROW, band_rows=8, state=table[1])
    row = c.state
    assert row.base is table and not table[1].any()               # set to absent
    c.resize(100 * ROW)
    c.warm(np.linspace(1, 0, 500))
    c.lookup(np.arange(300))
    c.refresh()
    c.resize(150 * ROW)
    c.fill(c.next_unfilled(10))
    assert c.state is row
    assert np.array_equal(table[1] == RESIDENT, c.resident) and (table[[0, 2]] == 7).all()
    c.check_integrity()
    with pytest.raises(ValueError, match="uint8"):
        EmbCache(500, ROW, state=np.zeros(500, np.int32))
    with pytest.raises(ValueError, match="shape"):
        EmbCache(500, ROW, state=np.zeros(499, np.uint8))


def test_bad_ids_and_scores_are_named_errors():
    c = EmbCache(50, ROW, band_rows=4)
    c.resize(10 * ROW)
    with pytest.raises(ValueError, match=">= 0"):
        c.warm(np.r_[np.ones(49), -1.0])
    c.warm(np.ones(50))
    c.record(np.array([3, 50]))
    before = c.scores.copy()
    with pytest.raises(IndexError, match=r"\[0, 50\)"):
        c.refresh()
    assert np.array_equal(c.scores, before)


def test_a_cache_never_warmed_wants_the_lowest_ids_until_it_has_scores():
    """Before any score every row ties at 0: the top c is rows 0 .. c-1, found without ranking
    (a pool sizes its cache before the warm start); the first refresh ranks by what it saw."""
    c = EmbCache(1000, ROW, band_rows=8)
    c.resize(100 * ROW)
    assert np.flatnonzero(wanted(c)).tolist() == list(range(100)) and c.unfilled_rows == 100
    assert c.lookup(np.array([5, 5, 500])) == (0, 2)
    c.resize(50 * ROW)
    assert np.flatnonzero(wanted(c)).tolist() == list(range(50)) and c.n_resident == 1
    c.record(np.arange(900, 1000))
    c.refresh()
    assert np.array_equal(wanted(c), keep_top(c.scores, 50))
    assert np.flatnonzero(wanted(c)).tolist() == [5, 500] + list(range(900, 948))   # 2, then ties
    c.check_integrity()
