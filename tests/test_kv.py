from helmgr.memory.kv import KVCache

BPT = 10          # bytes per token
PAGE = 40         # 4 tokens per page


def kv(capacity, **kw):
    return KVCache(BPT, PAGE, capacity_bytes=capacity, **kw)


def test_lru_eviction_order():
    c = kv(100)
    c.insert(1, 3); c.insert(2, 3); c.insert(3, 3)   # 90 bytes
    assert c.lookup(1) == 3                            # 1 becomes most recent
    c.insert(4, 2)                                     # needs 20: evict LRU = user 2
    assert list(c.entries) == [3, 1, 4]
    assert c.lookup(2) == 0
    assert c.used_bytes == 80
    c.check_integrity()


def test_reinsert_updates_length_and_recency():
    c = kv(100)
    c.insert(1, 3); c.insert(2, 3)
    c.insert(1, 5)
    assert list(c.entries.items()) == [(2, 3), (1, 5)]
    assert c.used_bytes == 80


def test_prefix_larger_than_the_cache_is_not_cached():
    c = kv(50)
    c.insert(1, 2)
    assert c.insert(2, 6) == 0
    assert c.lookup(2) == 0 and c.lookup(1) == 2


def test_tail_first_trims_whole_pages_of_the_lru_user():
    c = kv(100, tail_first=True)
    c.insert(1, 9); c.insert(2, 1)                     # 100 bytes
    c.insert(3, 2)                                     # needs 20 -> one page (4 tokens) off user 1
    assert c.peek(1) == 5 and c.peek(3) == 2
    assert c.used_bytes == 80
    c.check_integrity()


def test_tail_first_caches_what_fits():
    c = kv(60, tail_first=True)
    assert c.insert(1, 10) == 6


def test_shrink_evicts_and_host_tier_keeps_the_evicted():
    c = kv(100, host_capacity_bytes=1000)
    c.insert(1, 4); c.insert(2, 4)
    c.resize(50)
    assert c.lookup(1) == 0 and c.peek(2) == 4
    assert c.host_lookup(1) == 4
    assert c.evicted_tokens == 4
    c.check_integrity()


def test_host_tier_is_lru_with_its_own_budget():
    c = kv(10, host_capacity_bytes=50)
    for user in range(4):
        c.insert(user, 1)                               # each evicts the previous one to host
    c.insert(9, 1)
    assert [u for u in range(4) if c.host_lookup(u)] == [0, 1, 2, 3]
    c.host.put(7, 3)                                    # 30 more bytes: evicts users 0 and 1
    assert c.host_lookup(0) == 0 and c.host_lookup(1) == 0 and c.host_lookup(7) == 3


def test_ghosts_remember_evicted_users_up_to_their_budget():
    c = kv(30)
    c.track_ghosts(40)
    c.insert(1, 3); c.insert(2, 3); c.insert(3, 3)   # evicts 1 (30 B in ghosts), then 2 (60 B > 40)
    assert list(c.ghost.items()) == [(2, 3)]
    c.insert(2, 3)                                    # back in the cache: no longer a ghost
    assert 2 not in c.ghost and 3 in c.ghost
