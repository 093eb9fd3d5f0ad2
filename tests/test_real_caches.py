import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helmgr.core.errors import HelmInputError
from helmgr.real import DeviceEmbCache, DevicePool, KVLayout, PagedKVCache

torch.set_num_threads(1)

WIDTH = 4                                    # float32 rows of 16 bytes
LAYOUT = KVLayout(layers=2, heads=1, d_qk=2, d_v=2)   # 32 bytes per token


def host_table(n_items=40, seed=0):
    return torch.randn(n_items, WIDTH, generator=torch.Generator().manual_seed(seed))


def emb_cache(slots=3, policy="lru", decay=0.99, table=None):
    """An EMB cache of exactly `slots` rows: one EMB page of `slots` rows, three KV pages."""
    pool = DevicePool(4 * slots * 16, slots * 16, 16, ratio=0.25)
    return DeviceEmbCache(pool, host_table() if table is None else table, policy, decay)


def resident(cache, n=40):
    return set(torch.nonzero(cache.is_resident(torch.arange(n))).flatten().tolist())


def prefix(tokens, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = [torch.randn(tokens, 1, 2, generator=g) for _ in range(2)]
    v = [torch.randn(tokens, 1, 2, generator=g) for _ in range(2)]
    return k, v


def kv_cache(kv_pages=6, tail_first=False):
    """2 tokens per 64-byte page; the EMB keeps 2 pages."""
    pool = DevicePool((kv_pages + 2) * 64, 64, 16, ratio=2 / (kv_pages + 2))
    assert pool.kv_pages == kv_pages
    return PagedKVCache(pool, LAYOUT, tail_first=tail_first)


def assert_prefix(got, k, v, tokens):
    assert got.tokens == tokens
    for layer in range(2):
        assert torch.equal(got.k[layer], k[layer][:tokens]) and torch.equal(got.v[layer], v[layer][:tokens])


# -- EMB cache ---------------------------------------------------------------------------
def test_a_miss_returns_the_host_row_and_a_later_hit_the_same_bytes():
    cache = emb_cache(slots=4)
    ids = torch.tensor([5, 9, 5, 31])
    rows, misses = cache.lookup(ids)
    assert misses == 3                                   # distinct ids fetched
    assert torch.equal(rows, cache.host[ids])
    rows2, misses2 = cache.lookup(torch.tensor([31, 5, 9]))
    assert misses2 == 0 and cache.hits == 3
    assert torch.equal(rows2.view(torch.uint8), cache.host[[31, 5, 9]].view(torch.uint8))
    cache.check_integrity()


def test_lru_evicts_the_least_recent_row_that_the_batch_does_not_need():
    cache = emb_cache(policy="lru")
    for i in (1, 2, 3):
        cache.lookup(torch.tensor([i]))
    cache.lookup(torch.tensor([1]))                      # 1 is now the most recent
    cache.lookup(torch.tensor([4]))                      # evicts 2
    assert resident(cache) == {1, 3, 4}
    rows, misses = cache.lookup(torch.tensor([2, 3]))    # 3 is needed: evict 1, not 3
    assert misses == 1 and resident(cache) == {2, 3, 4}
    assert torch.equal(rows, cache.host[[2, 3]])
    cache.check_integrity()


def test_lfu_with_aging_evicts_the_lowest_decayed_count():
    cache = emb_cache(policy="lfu", decay=0.5)           # an access weighs 1, 2, 4, 8, ... by epoch
    cache.lookup(torch.tensor([1, 1, 1]))                # score 3
    cache.lookup(torch.tensor([2]))                      # 2
    cache.lookup(torch.tensor([3]))                      # 4
    cache.lookup(torch.tensor([4]))                      # 8: evicts 2
    assert resident(cache) == {1, 3, 4}
    cache.lookup(torch.tensor([2]))                      # 2 + 16: evicts 1, frequent but old
    assert resident(cache) == {2, 3, 4}
    cache.check_integrity()


def test_lfu_admits_a_miss_only_when_it_outscores_the_coldest_row():
    cache = emb_cache(policy="lfu", decay=1.0)           # plain frequency
    for i, n in ((1, 3), (2, 4), (3, 5)):
        cache.lookup(torch.full((n,), i))
    for _ in range(3):                                   # 4's count: 1, 2, 3, never above 3
        rows, misses = cache.lookup(torch.tensor([4]))
        assert misses == 1 and torch.equal(rows, cache.host[[4]])
        assert resident(cache) == {1, 2, 3}
    cache.lookup(torch.tensor([4]))                      # count 4 > 3: replaces 1
    assert resident(cache) == {2, 3, 4}
    cache.check_integrity()


def test_warm_loads_the_most_popular_rows_scored_as_settled_counts():
    cache = emb_cache(policy="lfu", decay=0.5)
    shares = torch.zeros(40, dtype=torch.float64)
    shares[[7, 9, 30, 2]] = torch.tensor([0.1, 0.4, 0.3, 0.2], dtype=torch.float64)
    assert cache.warm(shares, per_lookup=5.0) == 3
    assert resident(cache) == {9, 30, 2}
    assert cache.scores[9].item() == pytest.approx(0.4 * 5.0 / (1 - 0.5))   # 4 a lookup, decayed: 4 / (1 - 0.5)
    rows, misses = cache.lookup(torch.tensor([9, 30, 2]))
    assert misses == 0 and torch.equal(rows, cache.host[[9, 30, 2]])
    cache.lookup(torch.tensor([7]))                      # 1.0 settled + 1: not above 2's 2.0, not admitted
    assert resident(cache) == {9, 30, 2}
    cache.check_integrity()
    with pytest.raises(ValueError, match="40 finite shares"):
        cache.warm(torch.ones(39))


def test_a_batch_larger_than_the_cache_gets_every_row_and_keeps_its_own():
    cache = emb_cache(policy="lru")
    cache.lookup(torch.tensor([1, 2, 3]))
    ids = torch.tensor([1, 2, 3, 4, 5])
    rows, misses = cache.lookup(ids)
    assert misses == 2 and torch.equal(rows, cache.host[ids])
    assert resident(cache) == {1, 2, 3}                  # nothing of the batch was evicted
    ids = torch.arange(10, 15)
    rows, misses = cache.lookup(ids)
    assert misses == 5 and torch.equal(rows, cache.host[ids])
    assert resident(cache) == {10, 11, 12}               # equal scores: lowest ids first
    cache.check_integrity()


def test_resize_drops_taken_rows_and_adds_empty_slots():
    pool = DevicePool(8 * 32, 32, 16, ratio=0.5)         # 4 pages of 2 rows: 8 slots
    cache = DeviceEmbCache(pool, host_table(), "lru")
    cache.lookup(torch.arange(8))
    assert resident(cache) == set(range(8))
    move = pool.resize(0.25)                              # 4 slots left
    with pytest.raises(ValueError, match="do not match"):
        cache.on_resize(range(0, 4))
    cache.on_resize(move.emb_slots)
    assert len(resident(cache)) == 4 and cache.size_info().entries == 4
    cache.check_integrity()
    cache.on_resize(pool.resize(0.75).emb_slots)         # 12 slots, 8 empty
    ids = torch.arange(20, 28)
    rows, misses = cache.lookup(ids)
    assert misses == 8 and torch.equal(rows, cache.host[ids]) and len(resident(cache)) == 12
    cache.check_integrity()


def test_the_shadow_is_the_best_scored_rows_not_resident_and_counts_their_misses():
    """Plain frequency, 3 slots: 1, 2, 3 resident (counts 5, 6, 7); 4, 5, 6 seen 4, 3, 1 times and
    not admitted (4 <= 5). A shadow of 2 rows is {4, 5}; 9 was never seen, so it is in no shadow.
    Misses on shadow rows count (a repeat in one lookup counts once: one fetch), hits do not, and
    each refresh re-ranks."""
    cache = emb_cache(policy="lfu", decay=1.0)
    for i, n in ((1, 5), (2, 6), (3, 7), (4, 4), (5, 3), (6, 1)):
        cache.lookup(torch.full((n,), i))
    assert resident(cache) == {1, 2, 3}
    cache.track_shadow(2)
    assert set(torch.nonzero(cache._shadow).flatten().tolist()) == {4, 5}
    cache.lookup(torch.tensor([4, 4, 4, 6, 9]))          # 4: count 7 > 5, admitted in place of 1
    assert cache.shadow_hits == 1 and resident(cache) == {2, 3, 4}
    cache.lookup(torch.tensor([5, 1, 4]))                # misses on 5 (shadow) and 1 (not), a hit on 4
    assert cache.shadow_hits == 2 and resident(cache) == {2, 3, 4}
    cache.refresh()                                      # not resident now: 1 (6), 5 (4), 6 (2), 9 (1)
    assert cache.refreshes == 1 and set(torch.nonzero(cache._shadow).flatten().tolist()) == {1, 5}
    cache.track_shadow(0)
    cache.lookup(torch.tensor([1, 5]))
    assert cache.shadow_hits == 2 and cache._shadow is None
    cache.check_integrity()


def test_emb_bad_inputs_are_named_value_errors():
    cache = emb_cache()
    with pytest.raises(ValueError, match=r"\[0, 40\).*\[-1, 3\]"):
        cache.lookup(torch.tensor([3, -1]))
    with pytest.raises(ValueError, match="unknown EMB policy 'fifo'"):
        emb_cache(policy="fifo")
    with pytest.raises(ValueError, match="decay must be in"):
        emb_cache(policy="lfu", decay=0.0)
    with pytest.raises(ValueError, match="host rows are 8 bytes"):
        emb_cache(table=torch.zeros(10, 2))
    with pytest.raises(HelmInputError, match=r"unknown EMB policy 'fifo' \(known: lfu, lru\)"):
        emb_cache(policy="fifo")
    cache.check_integrity()


# -- KV cache ----------------------------------------------------------------------------
def test_put_then_get_returns_the_same_tensors_in_lowest_pages_first():
    cache = kv_cache()
    k, v = prefix(3)
    assert cache.put(1, k, v) == 3
    assert cache.put(2, *prefix(4, seed=1)) == 4
    assert cache.entries[1].pages == (0, 1) and cache.entries[2].pages == (2, 3)
    assert_prefix(cache.get(1), k, v, 3)
    assert cache.get(3) is None
    cache.check_integrity()


def test_kv_lru_evicts_whole_users_least_recent_first():
    cache = kv_cache(kv_pages=6)
    for user in (1, 2, 3):
        cache.put(user, *prefix(4, seed=user))           # 2 pages each: full
    cache.get(1)                                          # 1 becomes most recent
    k, v = prefix(3, seed=9)
    assert cache.put(4, k, v) == 3                        # evicts user 2, takes its pages
    assert list(cache.entries) == [3, 1, 4]
    assert cache.entries[4].pages == (2, 3)
    assert_prefix(cache.get(4), k, v, 3)
    assert_prefix(cache.get(1), *prefix(4, seed=1), 4)
    assert cache.evicted_tokens == 4
    cache.check_integrity()


def test_tail_first_trims_pages_off_the_lru_user_and_keeps_its_prefix():
    cache = kv_cache(kv_pages=6, tail_first=True)
    k1, v1 = prefix(7, seed=1)
    cache.put(1, k1, v1)                                  # 4 pages
    cache.put(2, *prefix(4, seed=2))                      # 2 pages: full
    cache.put(3, *prefix(3, seed=3))                      # needs 2: user 1's two last pages
    assert cache.peek(1) == 4 and cache.entries[1].pages == (0, 1)
    assert_prefix(cache.get(1), k1, v1, 4)
    cache.check_integrity()


def test_a_prefix_larger_than_the_cache():
    k, v = prefix(13)
    assert kv_cache(kv_pages=6).put(1, k, v) == 0
    cache = kv_cache(kv_pages=6, tail_first=True)
    assert cache.put(1, k, v) == 12
    assert_prefix(cache.get(1), k, v, 12)
    cache.check_integrity()


@pytest.mark.parametrize("tail_first,kept", [(False, {1: 2}), (True, {1: 2, 2: 4})])
def test_kv_resize_evicts_owners_of_taken_pages(tail_first, kept):
    cache = kv_cache(kv_pages=6, tail_first=tail_first)
    pool = cache.pool
    cache.put(1, *prefix(2, seed=1))                      # page 0
    cache.put(2, *prefix(5, seed=2))                      # pages 1, 2, 3
    cache.put(3, *prefix(2, seed=3))                      # page 4
    move = pool.resize(0.5)                               # EMB 2 -> 4 pages: KV pages 4, 5 taken
    assert move.kv_pages == range(4, 6)
    cache.on_resize(move.kv_pages)
    move = pool.resize(0.625)                             # and page 3, user 2's last
    assert move.kv_pages == range(3, 4)
    cache.on_resize(move.kv_pages)
    assert {u: cache.peek(u) for u in cache.entries} == kept
    cache.check_integrity()
    cache.on_resize(pool.resize(0.25).kv_pages)           # KV grows back to 6 pages
    assert cache.put(9, *prefix(6, seed=9)) == 6
    cache.check_integrity()


def test_the_ghost_queue_keeps_the_users_evicted_last_within_its_bytes():
    """A ghost queue of 3 tokens (96 bytes): users evicted go in with the tokens they had, the
    least recently evicted leave to fit, one larger than the queue empties it, and caching a user
    takes it out."""
    cache = kv_cache(kv_pages=4)                          # 8 tokens
    cache.track_ghosts(3 * LAYOUT.bytes_per_token)
    cache.put(1, *prefix(2, seed=1))
    cache.put(2, *prefix(2, seed=2))
    cache.put(3, *prefix(4, seed=3))                      # full
    cache.put(4, *prefix(1, seed=4))                      # evicts 1 (2 tokens)
    assert cache.ghost == {1: 2} and cache.ghost_tokens(1) == 2 and cache.ghost_tokens(2) == 0
    cache.put(5, *prefix(2, seed=5))                      # evicts 2: 1 leaves to fit 3 tokens
    assert cache.ghost == {2: 2}
    cache.put(2, *prefix(3, seed=2))                      # 2 is cached again: out; evicts 3 (4 tokens > 3)
    assert cache.ghost == {}
    cache.put(6, *prefix(2, seed=6))                      # evicts 4 (1 token)
    assert cache.ghost == {4: 1}
    cache.check_integrity()


def test_kv_bad_inputs_are_named_value_errors():
    cache = kv_cache()
    k, v = prefix(3)
    with pytest.raises(ValueError, match=r"K must be torch.float32 of shape \(3, 1, 2\)"):
        cache.put(1, [k[0].double(), k[1]], v)
    with pytest.raises(ValueError, match="for 2 layers"):
        cache.put(1, k[:1], v)
    with pytest.raises(ValueError, match="cannot hold one token"):
        PagedKVCache(DevicePool(640, 64, 16), KVLayout(layers=3, heads=2, d_qk=2, d_v=2))


@pytest.mark.parametrize("policy, decay", [("lfu", 0.5), ("lfu", 0.99), ("lru", 0.99)])
def test_admission_from_the_candidate_pool_equals_a_scan_of_every_slot(policy, decay):
    """A 120-slot cache with a pool of 8 candidates (and rescales every ~60 lookups at decay 0.5)
    against the same cache sorting all its slots every time: the same slots, lookup after
    lookup, through resizes; popular ids, so scores tie and grow unevenly."""
    table = host_table(n_items=400)
    caches = []
    for pool_size in (8, 10 ** 9):
        cache = DeviceEmbCache(DevicePool(4 * 120 * 16, 120 * 16, 16, ratio=0.25), table, policy, decay)
        cache.POOL = pool_size
        caches.append(cache)
    gen = torch.Generator().manual_seed(7)
    popular = torch.randint(0, 400, (60,), generator=gen)
    for step in range(1000):
        if step % 97 == 96:
            ratio = [0.25, 0.2, 0.3][(step // 97) % 3]
            for c in caches:
                move = c.pool.resize(ratio)
                c.on_resize(move.emb_slots)
        n = int(torch.randint(1, 7, (1,), generator=gen))
        ids = torch.cat([popular[torch.randint(0, 60, (n,), generator=gen)], torch.randint(0, 400, (n,), generator=gen)])
        for c in caches:
            rows, _ = c.lookup(ids)
            assert torch.equal(rows, c.host[ids])
        assert torch.equal(caches[0].item_of, caches[1].item_of), step
    assert caches[0]._pool is not None and caches[0].policy.rescales == caches[1].policy.rescales
    assert (caches[0].policy.rescales > 0) == (decay == 0.5)
    for c in caches:
        c.check_integrity()


@pytest.mark.parametrize("policy", ["lfu", "lru"])
def test_a_device_copy_of_the_scores_follows_the_policy_and_admits_the_same_rows(policy):
    """On a GPU the policy's host scores are mirrored on the device; a CPU cache made to mirror
    (a separate copy) checks that the copy follows lookups, rescales (decay 0.5: every ~60
    lookups) and warm, and that admissions match the cache whose torch view shares memory."""
    table = host_table(n_items=200)
    caches = [DeviceEmbCache(DevicePool(4 * 40 * 16, 40 * 16, 16, ratio=0.25), table, policy, 0.5) for _ in range(2)]
    caches[1]._mirrored, caches[1]._scores = True, caches[1]._scores.clone()
    shares = torch.rand(200, generator=torch.Generator().manual_seed(1))
    for c in caches:
        c.warm(shares, per_lookup=3.0)
    gen = torch.Generator().manual_seed(5)
    for step in range(150):
        ids = torch.randint(0, 200, (int(torch.randint(1, 9, (1,), generator=gen)),), generator=gen)
        for c in caches:
            c.lookup(ids)
        assert torch.equal(caches[0].item_of, caches[1].item_of), step
        assert torch.equal(caches[1]._scores, torch.from_numpy(caches[1].scores)), step
    assert caches[1].policy.rescales == (2 if policy == "lfu" else 0)     # at lookups 60 and 120
    for c in caches:
        c.check_integrity()


# -- both caches on one pool, random operations --------------------------------------------
ops = st.lists(st.one_of(
    st.tuples(st.just("resize"), st.floats(0.0, 1.0)),
    st.tuples(st.just("lookup"), st.lists(st.integers(0, 29), min_size=1, max_size=12)),
    st.tuples(st.just("put"), st.integers(0, 5), st.integers(1, 14)),
    st.tuples(st.just("get"), st.integers(0, 5)),
), max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, policy=st.sampled_from(["lfu", "lru"]), tail_first=st.booleans())
def test_random_resizes_and_traffic_keep_both_caches_whole(ops, policy, tail_first):
    pool = DevicePool(12 * 64, 64, 16, ratio=0.5)         # 4 rows or 2 tokens per page
    emb = DeviceEmbCache(pool, host_table(30), policy, decay=0.9)
    kv = PagedKVCache(pool, LAYOUT, tail_first)
    stored = {}
    for op in ops:
        if op[0] == "resize":
            move = pool.resize(op[1])
            kv.on_resize(move.kv_pages)
            emb.on_resize(move.emb_slots)
        elif op[0] == "lookup":
            ids = torch.tensor(op[1])
            assert torch.equal(emb.lookup(ids).rows, emb.host[ids])
        elif op[0] == "put":
            stored[op[1]] = prefix(op[2], seed=op[1] * 100 + op[2])
            assert kv.put(op[1], *stored[op[1]]) <= op[2]
        else:
            got = kv.get(op[1])
            if got is not None:
                assert_prefix(got, *stored[op[1]], got.tokens)
        pool.check_integrity()
        emb.check_integrity()
        kv.check_integrity()
        emb_end = pool.n_rows * pool.row_bytes             # no owned KV page reaches into EMB rows
        owned = [p for e in kv.entries.values() for p in e.pages]
        assert all((pool.total_pages - 1 - p) * pool.page_bytes >= emb_end for p in owned)
    for user in list(kv.entries):                         # nothing clobbered anything
        assert_prefix(kv.get(user), *stored[user], kv.peek(user))
    ids = torch.arange(30)
    assert torch.equal(emb.lookup(ids).rows, emb.host[ids])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_misses_come_from_pinned_memory_and_hits_match():
    pool = DevicePool(12 * 64, 64, 16, device="cuda")
    emb = DeviceEmbCache(pool, host_table(30), "lfu")
    kv = PagedKVCache(pool, LAYOUT)
    assert emb.host.is_pinned() and pool.buffer.is_cuda
    for ids in ([1, 2, 3, 2], list(range(30)), [3, 1, 29]):        # misses, overflow, hits
        rows, _ = emb.lookup(torch.tensor(ids))
        assert rows.is_cuda and torch.equal(rows.cpu(), emb.host[ids])
    k, v = prefix(5)
    assert kv.put(1, [t.cuda() for t in k], [t.cuda() for t in v]) == 5
    assert_prefix(to_cpu(kv.get(1)), k, v, 5)
    pool.check_integrity()
    emb.check_integrity()
    kv.check_integrity()


def to_cpu(kv):
    return type(kv)(tuple(t.cpu() for t in kv.k), tuple(t.cpu() for t in kv.v))


def test_kv_groups_evict_the_lowest_band_to_its_floor_then_by_band_then_without_floors():
    cache = kv_cache(kv_pages=10)                               # 2 tokens a page
    cache.set_groups([0.0, 0.3, 0.0])                           # band 1 keeps 3 pages from band 0

    def put(user, band, tokens):
        cache.set_group(user, band)
        got = cache.put(user, *prefix(tokens, seed=user))
        cache.check_integrity()
        return got
    for user, band in ((1, 2), (2, 1), (3, 1), (4, 0)):
        put(user, band, 4)                                      # 2 pages each: 8 of 10
    put(5, 0, 6)                                                # needs 1 more: band 2 goes first (user 1)
    assert set(cache.entries) == {2, 3, 4, 5} and [cache.group_pages(g) for g in range(3)] == [5, 4, 0]
    put(6, 0, 6)                                                # needs 2: band 1 down to its floor (user 2)
    assert set(cache.entries) == {3, 4, 5, 6} and [cache.group_pages(g) for g in range(3)] == [8, 2, 0]
    put(7, 0, 4)                                                # band 1 at its floor: band 0's least recent (4)
    assert set(cache.entries) == {3, 5, 6, 7}
    assert put(8, 0, 20) == 20                                  # the whole cache: the floor gives way last
    assert set(cache.entries) == {8} and [cache.group_pages(g) for g in range(3)] == [10, 0, 0]
    cache.set_group(8, 1)                                       # a cached user's pages move with it
    assert [cache.group_pages(g) for g in range(3)] == [0, 10, 0]
    cache.check_integrity()
    with pytest.raises(ValueError, match="empty cache"):
        cache.set_groups([0.5])
    with pytest.raises(ValueError, match="group 3 of a cache with 3 groups"):
        cache.set_group(9, 3)
