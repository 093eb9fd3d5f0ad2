"""Class-aware KV eviction (memory/kv_table.py `_evict` over groups): hand-worked orders, and
random operations against a slow reference of the rule (the last group first, each down to its
floor, LRU within a group; then the same order without floors)."""
from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helmgr.memory.kv import KVCache
from helmgr.memory.kv_slots import GROUP, KEY, TOK, kv_order

BPT, PAGE = 10, 40                  # 4 tokens per page


def cache(capacity_tokens: int, floors: list[float], tail_first: bool = False, quotas: bool = False) -> KVCache:
    c = KVCache(BPT, PAGE, capacity_tokens * BPT, tail_first=tail_first)
    c.set_groups(floors, quotas)
    return c


def groups_of(c: KVCache) -> list[list[tuple[int, int]]]:
    """Each group's (user, tokens), least recently used first."""
    order = kv_order(c.meta, c.tab)
    return [[(int(c.tab[KEY, s]), int(c.tab[TOK, s])) for s in order if c.tab[GROUP, s] == g] for g in range(c.groups)]


def test_the_last_group_yields_down_to_its_floor_then_the_first():
    c = cache(100, [0.0, 0.3])      # group 1 keeps 30 tokens
    c.insert(1, 40, 0)
    c.insert(2, 30, 1)
    c.insert(3, 20, 1)
    c.insert(4, 30, 0)              # needs 20 tokens: group 1 holds 50 > 30, its LRU (user 2) goes
    assert groups_of(c) == [[(1, 40), (4, 30)], [(3, 20)]]
    c.insert(5, 40, 0)              # needs 30: group 1 (20) is under its floor, group 0's LRU goes
    assert groups_of(c) == [[(4, 30), (5, 40)], [(3, 20)]]
    c.check_integrity()


def test_floors_give_way_when_nothing_else_is_left():
    c = cache(100, [0.0, 0.5])
    c.insert(1, 50, 0)
    c.insert(2, 50, 1)
    c.insert(6, 90, 0)              # group 0 empties, then group 1 goes below its floor
    assert groups_of(c) == [[(6, 90)], []]
    assert c.group_bytes(1) == 0
    c.check_integrity()


def test_a_hit_moves_within_its_group_and_tail_first_trims_pages():
    c = cache(100, [0.0, 0.0, 0.1], tail_first=True)
    c.insert(1, 30, 2)
    c.insert(2, 30, 2)
    c.insert(3, 30, 1)
    assert c.lookup(1) == 30        # user 1 is now group 2's most recent
    c.insert(4, 20, 0)              # needs 10 tokens: 3 pages off group 2's LRU (user 2)
    assert groups_of(c) == [[(4, 20)], [(3, 30)], [(2, 18), (1, 30)]]
    c.check_integrity()


def test_quotas_partition_the_cache_and_each_group_evicts_its_own():
    c = cache(100, [0.5, 0.3, 0.2], quotas=True)     # quotas 50 / 30 / 20 tokens
    c.insert(1, 40, 0)
    c.insert(2, 30, 1)
    c.insert(3, 20, 2)
    c.insert(4, 10, 1)              # 10 tokens are free, but group 1 is at its quota: its own LRU goes
    assert groups_of(c) == [[(1, 40)], [(4, 10)], [(3, 20)]]
    c.insert(5, 20, 0)
    assert groups_of(c) == [[(5, 20)], [(4, 10)], [(3, 20)]]
    assert c.insert(6, 30, 2) == 0  # larger than its group's quota: not cached, nothing evicted
    assert groups_of(c) == [[(5, 20)], [(4, 10)], [(3, 20)]]
    c.resize(50 * BPT)              # quotas 25 / 15 / 10: group 2 goes down to 10, the others fit
    assert groups_of(c) == [[(5, 20)], [(4, 10)], []]
    c.check_integrity()


def test_bad_floors_and_a_full_cache_are_refused():
    with pytest.raises(ValueError, match="sum below 1"):
        cache(100, [0.0, 0.6, 0.5])
    c = KVCache(BPT, PAGE, 1000)
    c.insert(1, 10)
    with pytest.raises(ValueError, match="empty"):
        c.set_groups([0.0, 0.5])


class Reference:
    """The eviction rule, slowly: one OrderedDict per group."""

    def __init__(self, capacity_tokens: int, floors: list[float], tail_first: bool, quotas: bool = False):
        self.cap, self.floors, self.tail_first, self.quotas = capacity_tokens * BPT, floors, tail_first, quotas
        self.lists = [OrderedDict() for _ in floors]

    def share(self, g: int) -> int:
        """Group g's floor or quota in bytes (group 0's quota: the rest)."""
        if g:
            return self.cap * round(self.floors[g] * 1_000_000) // 1_000_000
        return self.cap - sum(self.share(h) for h in range(1, len(self.floors)))

    def used(self, g=None) -> int:
        lists = self.lists if g is None else [self.lists[g]]
        return sum(sum(d.values()) for d in lists) * BPT

    def lookup(self, user: int) -> int:
        for d in self.lists:
            if user in d:
                d.move_to_end(user)
                return d[user]
        return 0

    def evict_group(self, g: int, need: int, keep: int) -> int:
        d = self.lists[g]
        while need > 0 and d and (keep < 0 or self.used(g) > keep):
            user, tokens = next(iter(d.items()))
            drop = min(tokens, -(-need // (PAGE)) * (PAGE // BPT)) if self.tail_first else tokens
            if drop == tokens:
                del d[user]
            else:
                d[user] = tokens - drop
            need -= drop * BPT
        return need

    def evict(self, need: int) -> None:
        for floors in (True, False):
            for g in range(len(self.lists) - 1, -1, -1):
                need = self.evict_group(g, need, self.share(g) if g and floors else -1)

    def insert(self, user: int, tokens: int, group: int) -> int:
        for d in self.lists:
            d.pop(user, None)
        room = self.share(group) if self.quotas else self.cap
        tokens = min(tokens, room // BPT) if self.tail_first else tokens
        if tokens <= 0 or tokens * BPT > room:
            return 0
        if self.quotas:
            self.evict_group(group, self.used(group) + tokens * BPT - room, -1)
        self.evict(self.used() + tokens * BPT - self.cap)
        self.lists[group][user] = tokens
        return tokens

    def resize(self, capacity_tokens: int) -> None:
        self.cap = capacity_tokens * BPT
        if self.quotas:
            for g in range(len(self.lists)):
                self.evict_group(g, self.used(g) - self.share(g), -1)
        self.evict(self.used() - self.cap)


OPS = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 12), st.integers(0, 60), st.integers(0, 2)),
    st.tuples(st.just("lookup"), st.integers(0, 12)),
    st.tuples(st.just("resize"), st.integers(20, 160)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, max_size=60), floors=st.sampled_from([[0.0, 0.2, 0.3], [0.0, 0.0, 0.5], [0.0, 0.45, 0.45]]),
       tail_first=st.booleans(), quotas=st.booleans())
def test_random_operations_match_the_reference(ops, floors, tail_first, quotas):
    c, r = cache(100, floors, tail_first, quotas), Reference(100, floors, tail_first, quotas)
    for op in ops:
        name, *args = op
        if name == "resize":
            c.resize(args[0] * BPT)
            r.resize(args[0])
        else:
            assert getattr(c, name)(*args) == getattr(r, name)(*args), op
        c.check_integrity()
        assert [c.group_bytes(g) for g in range(3)] == [r.used(g) for g in range(3)], op
        assert list(c.entries.items()) == [kv for d in r.lists for kv in d.items()], op
