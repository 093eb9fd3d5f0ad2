import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helmgr.core.errors import HelmInputError
from helmgr.memory.emb import EmbCache
from helmgr.memory.kv import KVCache
from helmgr.memory.pool import HBMPool

PAGE = 1000


def make_pool(pages=100, ratio=0.5, n_items=400, row=100, bpt=10, **kw):
    emb = EmbCache(n_items, row, band_rows=8)
    kv = KVCache(bpt, PAGE, tail_first=kw.pop("tail_first", False))
    pool = HBMPool(pages * PAGE, PAGE, emb, kv, ratio, **kw)
    emb.warm(np.linspace(1, 0, n_items, dtype=np.float32))
    return pool


def test_pages_follow_the_ratio():
    pool = make_pool(ratio=0.3)
    assert (pool.emb_pages, pool.kv_pages) == (30, 70)
    assert pool.emb.capacity_rows == 300 and pool.kv.capacity_bytes == 70 * PAGE
    plan = pool.resize(0.42)
    assert (plan.emb_pages_before, plan.emb_pages_after, plan.moved_pages) == (30, 42, 12)
    assert plan.ratio_after == pytest.approx(0.42)
    assert pool.resize(0.1).moved_pages == -32
    pool.check_integrity()


def test_ratio_is_clamped_to_the_minimum_of_each_cache():
    pool = make_pool(ratio=0.5, r_min=0.05, r_max=0.95)
    assert pool.resize(0.0).emb_pages_after == 5
    assert pool.resize(1.0).emb_pages_after == 95
    pool.check_integrity()


def test_shrinking_kv_evicts_at_once():
    pool = make_pool(ratio=0.5)
    for user in range(5):
        pool.kv.insert(user, 1000)                     # 10 KB each, 50 KB total = KV's 50 pages
    pool.resize(0.8)                                  # KV down to 20 pages
    assert pool.kv.used_bytes <= 20 * PAGE
    assert list(pool.kv.entries) == [3, 4]
    pool.check_integrity()


@pytest.mark.parametrize("budget,page", [(0, 10), (-5, 10), (100, 80), (100, 0)])
def test_impossible_pools(budget, page):
    with pytest.raises(HelmInputError):
        HBMPool(budget, page, EmbCache(10, 1), KVCache(1, 10))


def test_bad_ratio_is_a_named_error():
    with pytest.raises(HelmInputError, match="ratio must be in"):
        make_pool(ratio=1.5)


ops = st.lists(st.one_of(
    st.tuples(st.just("resize"), st.floats(0.0, 1.0)),
    st.tuples(st.just("insert"), st.integers(0, 30), st.integers(1, 3000)),
    st.tuples(st.just("lookup_kv"), st.integers(0, 30)),
    st.tuples(st.just("lookup_emb"), st.lists(st.integers(0, 399), min_size=1, max_size=40)),
    st.tuples(st.just("refresh")),
), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=ops, tail_first=st.booleans())
def test_random_operations_keep_the_pool_whole(ops, tail_first):
    pool = make_pool(ratio=0.5, tail_first=tail_first)
    for op in ops:
        if op[0] == "resize":
            pool.resize(op[1])
        elif op[0] == "insert":
            pool.kv.insert(op[1], op[2])
        elif op[0] == "lookup_kv":
            pool.kv.lookup(op[1])
        elif op[0] == "lookup_emb":
            pool.emb.lookup(np.array(op[1]))
        else:
            pool.emb.refresh()
        pool.check_integrity()
        assert pool.emb.size_info().used_bytes <= pool.emb_pages * PAGE
        assert pool.kv.size_info().used_bytes <= pool.kv_pages * PAGE
