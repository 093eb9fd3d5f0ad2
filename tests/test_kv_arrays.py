"""The array KV cache (memory/kv.py) against the OrderedDict one it replaced (tests/kv_reference.py):
the same answers, LRU order, bytes, host tier, ghost queue and events after every operation; and
the compiled functions on their own arrays, as the simulator's engine calls them."""
from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import njit

from helmgr.memory import kv_slots as S
from helmgr.memory import kv_table as K
from helmgr.memory.kv import KVCache
from tests import kv_reference as ref

BPT, PAGE = 10, 40                  # 4 tokens per page


def state(c) -> tuple:
    host = (list(c.host.entries.items()), c.host.used_bytes) if c.host is not None else None
    ghost = (list(c.ghost.items()), c._ghost_used) if c.ghost is not None else None
    events = list(c.events) if c.events is not None else None
    return (list(c.entries.items()), c.used_bytes, c.capacity_bytes, c.evicted_tokens, c.size_info(),
            host, ghost, events)


def apply(c, op):
    name, *args = op
    if name == "events":
        c.events = [] if args[0] else None
        return None
    return getattr(c, name)(*args)


def run_both(ops, **kw):
    new, old = KVCache(BPT, PAGE, **kw), ref.KVCache(BPT, PAGE, **kw)
    for i, op in enumerate(ops):
        assert apply(new, op) == apply(old, op), (i, op)
        assert state(new) == state(old), (i, op)
        new.check_integrity()
    return new


def random_ops(rng, n, users, capacity, max_tokens=None):
    """Mostly lookups and inserts of a few users' growing prefixes, some of them bigger than the
    cache; now and then a peek, a host lookup, a resize (to 0 too) or events switched."""
    max_tokens = capacity // BPT * 3 // 2 if max_tokens is None else max_tokens
    ops = []
    for _ in range(n):
        user, r = int(rng.integers(users)), rng.random()
        if r < 0.35:
            ops.append(("lookup", user))
        elif r < 0.8:
            ops.append(("insert", user, int(rng.integers(-1, max_tokens + 2))))
        elif r < 0.88:
            ops.append(("peek", user))
        elif r < 0.93:
            ops.append(("host_lookup", user))
        elif r < 0.98:
            ops.append(("resize", int(rng.choice([0, rng.integers(capacity * 2)]))))
        else:
            ops.append(("events", bool(rng.integers(2))))
    return ops


@pytest.mark.parametrize("tail_first", [False, True])
@pytest.mark.parametrize("host", [0, 300])
@pytest.mark.parametrize("ghosts", [False, True])
def test_matches_the_reference_on_random_streams(tail_first, host, ghosts):
    rng = np.random.default_rng(7 + tail_first + 2 * host + 5 * ghosts)
    ops = ([("track_ghosts", 250)] if ghosts else []) + [("events", True)] + random_ops(rng, 1500, 40, 400)
    run_both(ops, capacity_bytes=400, tail_first=tail_first, host_capacity_bytes=host)


def test_matches_the_reference_with_many_users_and_big_ids():
    """Thousands of users (the table grows and rehashes, tombstones come and go); ids far apart."""
    rng = np.random.default_rng(3)
    ids = rng.choice(2 ** 40, 3000, replace=False)
    ops = [(op[0], int(ids[op[1]]), *op[2:]) if op[0] in ("lookup", "insert", "peek", "host_lookup") else op
           for op in random_ops(rng, 6000, 3000, 20_000, max_tokens=20)]
    new = run_both([("track_ghosts", 5000), ("events", True)] + ops, capacity_bytes=20_000, tail_first=True,
                   host_capacity_bytes=8000)
    assert new.tab.shape[1] >= 256                     # grown from 16


OPS = st.one_of(
    st.tuples(st.just("lookup"), st.integers(0, 12)),
    st.tuples(st.just("peek"), st.integers(0, 12)),
    st.tuples(st.just("insert"), st.integers(0, 12), st.integers(-2, 40)),
    st.tuples(st.just("resize"), st.integers(0, 400)),
    st.tuples(st.just("host_lookup"), st.integers(0, 12)),
    st.tuples(st.just("events"), st.booleans()),
    st.tuples(st.just("track_ghosts"), st.integers(0, 200)),
)


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, max_size=60), capacity=st.integers(0, 300), tail_first=st.booleans(),
       host=st.sampled_from([0, 50, 200]))
def test_matches_the_reference_on_generated_sequences(ops, capacity, tail_first, host):
    run_both(ops, capacity_bytes=capacity, tail_first=tail_first, host_capacity_bytes=host)


def test_events_is_an_attribute_that_switches_the_log():
    c = KVCache(BPT, PAGE, capacity_bytes=100)
    assert c.meta[K.LOGGING] == 0
    c.events = []
    c.insert(1, 3)
    events, c.events = c.events, []                  # how serve/report.py takes them
    assert events == [(1, 3)] and c.meta[K.LOGGING] == K.LOG_EVENTS
    c.events = None
    c.insert(2, 3)
    assert c.events is None and c.meta[K.LOGGING] == 0 and c.meta[K.LOG_N] == 0


def test_copies_are_independent_and_keep_working():
    c = KVCache(BPT, PAGE, capacity_bytes=60, host_capacity_bytes=100)
    c.events = []
    c.insert(1, 3); c.insert(2, 3)
    for d in (copy.deepcopy(c), pickle.loads(pickle.dumps(c))):
        d.insert(3, 3)                                # evicts 1 in the copy only
        assert list(d.entries) == [2, 3] and d.events[-2:] == [(1, 0), (3, 3)] and d.host_lookup(1) == 3
        assert list(c.entries) == [1, 2] and c.events == [(1, 3), (2, 3)] and c.host_lookup(1) == 0
        d.check_integrity()


# -- the arrays on their own -----------------------------------------------------------------
def order(meta, tab):
    slots = K.kv_order(meta, tab)
    return list(zip(tab[K.KEY, slots].tolist(), tab[K.TOK, slots].tolist()))


def test_reserve_grows_the_table_and_the_log_and_keeps_the_lru_order():
    meta, tab, log = K.kv_arrays(1, 4, capacity_bytes=10 ** 6)
    gm, gt = K.ghost_arrays(1)
    for user in range(200):
        if not K.kv_room(meta, tab, log, gm, gt):
            tab, log, gt = K.kv_reserve(meta, tab, log, gm, gt)
            assert K.kv_room(meta, tab, log, gm, gt)
        assert K.kv_insert(meta, tab, log, user * 7919, user + 1, gm, gt) == user + 1
        if user % 3 == 0:
            K.kv_lookup(meta, tab, (user // 2) * 7919)
    want = order(meta, tab)
    before = tab.shape[1]
    meta[K.LOGGING], meta[K.LOG_N] = K.LOG_EVENTS, 5
    log[:, :5] = np.arange(20).reshape(4, 5)
    grown, glog, _ = K.kv_reserve(meta, tab, np.zeros((4, 8), np.int64), gm, gt)
    assert grown is tab and glog.shape[1] >= meta[K.COUNT] + 9          # the table had room: kept
    tab2, log2, _ = K.kv_reserve(meta, K._rehash(meta, tab, before), log, gm, gt)
    meta[K.TOMBS] = before // 2                                          # a table all tombstones
    tab3, _, _ = K.kv_reserve(meta, tab2, log2, gm, gt)
    assert tab.shape[1] >= 4 * 200 and tab3.shape[1] == before and meta[K.TOMBS] == 0
    assert order(meta, tab3) == want and meta[K.COUNT] == 200
    assert np.array_equal(log2[:, :5], np.arange(20).reshape(4, 5))     # logged rows kept
    assert all(K.kv_peek(meta, tab3, u * 7919) == u + 1 for u in range(200))


def _same_home(slots: int, n: int) -> list[int]:
    """`n` users whose probes start at the same slot of a `slots` table."""
    homes: dict[int, list[int]] = {}
    tab = np.full((4, slots), -1, np.int64)
    for user in range(10 ** 5):
        group = homes.setdefault(int(S._home(tab, user)), [])
        group.append(user)
        if len(group) == n:
            return group
    raise AssertionError("no collisions")


def test_a_deleted_slot_is_a_tombstone_that_a_new_user_reuses():
    a, b, c = _same_home(K.MIN_SLOTS, 3)
    meta, tab, log = K.kv_arrays(1, 1, capacity_bytes=2)
    g = K.ghost_arrays(1)
    K.kv_insert(meta, tab, log, a, 1, *g); K.kv_insert(meta, tab, log, b, 1, *g)   # b probes past a
    home = K.kv_find(meta, tab, a)
    assert K.kv_find(meta, tab, b) == (home + 1) % K.MIN_SLOTS
    K.kv_resize(meta, tab, log, 1, *g)                                     # evicts a (LRU)
    assert tab[K.KEY, home] == S.TOMB and meta[K.TOMBS] == 1 and K.kv_peek(meta, tab, b) == 1
    K.kv_resize(meta, tab, log, 2, *g)
    K.kv_insert(meta, tab, log, c, 1, *g)
    assert K.kv_find(meta, tab, c) == home and meta[K.TOMBS] == 0
    K.kv_resize(meta, tab, log, 1, *g)                                     # evicts b: its next slot is empty
    K.kv_resize(meta, tab, log, 0, *g)                                     # and c: then both slots are
    assert meta[K.TOMBS] == 0 and np.all(tab[K.KEY] == S.EMPTY) and meta[K.HEAD] == meta[K.TAIL] == -1


@njit          # not cached: numba would not see a change to memory/kv.py, which it compiles in
def _engine(meta, tab, log, gm, gt, users, tokens):
    """An engine's loop: a lookup, then an insert, per request; the arrays grown in compiled code."""
    got = np.empty((2, users.shape[0]), np.int64)
    for i in range(users.shape[0]):
        got[0, i] = K.kv_lookup(meta, tab, users[i])
        if not K.kv_room(meta, tab, log, gm, gt):
            tab, log, gt = K.kv_reserve(meta, tab, log, gm, gt)
        got[1, i] = K.kv_insert(meta, tab, log, users[i], tokens[i], gm, gt)
    return got, tab, log, gt


@pytest.mark.parametrize("logging", [False, True])
def test_the_functions_run_in_compiled_code_and_the_cache_replays_their_log(logging):
    rng = np.random.default_rng(11)
    users, tokens = rng.integers(0, 500, 4000), rng.integers(1, 60, 4000)
    kw = dict(capacity_bytes=3000, tail_first=True, host_capacity_bytes=2000)
    new, old = KVCache(BPT, PAGE, **kw), ref.KVCache(BPT, PAGE, **kw)
    for c in (new, old):
        c.track_ghosts(1000)
        c.events = []
    if not logging:
        new.meta[K.LOGGING] = 0
    got, tab, log, gtab = _engine(new.meta, new.tab, new.log, new.gmeta, new.gtab, users, tokens)
    new.attach(tab, log, gtab)
    want = [(old.lookup(u), old.insert(u, t)) for u, t in zip(users.tolist(), tokens.tolist())]
    assert list(zip(*got.tolist())) == want
    assert list(new.entries.items()) == list(old.entries.items()) and new.evicted_tokens == old.evicted_tokens
    assert list(new.ghost.items()) == list(old.ghost.items()) and new._ghost_used == old._ghost_used
    if logging:
        assert state(new) == state(old) and new.meta[K.LOG_N] == 0
    new.check_integrity()
