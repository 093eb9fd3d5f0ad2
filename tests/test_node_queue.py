"""A node's class-aware queue: bands, minimum shares, deficit round robin; orders worked by hand."""
from types import SimpleNamespace

import numpy as np
import pytest

from helmgr.core.classes import parse_table
from helmgr.core.records import Request
from helmgr.sim import SimConfig
from helmgr.sim.node_queue import QUANTUM_TOKENS, ClassQueue
from helmgr.sim.tenancy import node_queue

TABLE = parse_table({
    "classes": {"top": {"slo_ms": 10.0}, "mid": {"slo_ms": 30.0, "band": 1, "min_share": 0.2},
                "low": {"slo_ms": 300.0, "band": 2}},
    "tenants": {"a": {"class": "mid", "share": 0.3}, "b": {"class": "mid", "share": 0.3},
                "f": {"class": "top", "share": 0.3}, "z": {"class": "low", "share": 0.1}}}, "t")
A, B, F, Z = 0, 1, 2, 3


def req(rid: int, tenant: int, t: float | None = None) -> Request:
    return Request(rid, float(rid) if t is None else t, rid, 0, np.zeros(0), np.zeros(0), 0, tenant=tenant)


def drain(q: ClassQueue) -> list[int]:
    out = []
    while q:
        head = q[0]
        assert q.popleft() is head                  # the head shown is the one served
        out.append(head.rid)
    return out


def test_strict_serves_bands_in_order_and_fcfs_within_one():
    q = ClassQueue(TABLE, SimpleNamespace(now=0.0), fair=False)
    for rid, tenant in enumerate([Z, A, B, F, A, F]):
        q.append(req(rid, tenant), 1000.0)
    assert len(q) == 6
    assert drain(q) == [3, 5, 1, 2, 4, 0]          # band 0 (f), band 1 FCFS over a and b, band 2
    with pytest.raises(IndexError):
        q[0]


def test_the_queue_counts_each_bands_service_while_it_waits():
    # f (band 0, 500) is served while every band waits, a (band 1, 2000) while bands 1 and 2 do,
    # z (band 2, 1000) alone: band 2 got 1000 of the 3500 served while it waited
    q = ClassQueue(TABLE, SimpleNamespace(now=0.0), fair=False)
    for rid, (tenant, work) in enumerate([(Z, 1000.0), (A, 2000.0), (F, 500.0)]):
        q.append(req(rid, tenant), work)
    assert drain(q) == [2, 1, 0]
    assert q.own == {0: 500.0, 1: 2000.0, 2: 1000.0} and q.during == {0: 500.0, 1: 2500.0, 2: 3500.0}


def test_the_counts_start_at_count_from_and_carry_to_a_failed_nodes_new_queue():
    cfg = SimConfig(nodes=2, classes=TABLE, tenancy="strict", warmup_s=5.0)
    clock = SimpleNamespace(now=0.0, workload=SimpleNamespace(duration_s=8.0))
    q = node_queue(cfg, clock)
    assert q.count_from == 4.0                      # the warm-up the metrics skip: 5 s, at most half the run
    for rid, (tenant, work) in enumerate([(Z, 1000.0), (A, 2000.0), (F, 500.0)]):
        q.append(req(rid, tenant), work)
    assert q.popleft().rid == 2                     # f at t=0: before the warm-up ends, not counted
    clock.now = 4.0
    assert drain(q) == [1, 0]
    assert q.own == {0: 0.0, 1: 2000.0, 2: 1000.0} and q.during == {0: 0.0, 1: 2000.0, 2: 3000.0}
    after = node_queue(cfg, clock, replaces=q)
    assert after is not q and not after
    assert after.own == {0: 0.0, 1: 2000.0, 2: 1000.0} and after.during == {0: 0.0, 1: 2000.0, 2: 3000.0}


def test_drr_charges_uncached_work():
    # a's requests cost 3000 tokens, b's 1000; quantum 4096 each round:
    # a: +4096 -> one (1096 left, 3000 next) -> b: +4096 -> four (b empties) -> a: 1096 + 4096 -> one
    # (2192), 3000 > 2192 -> a again (alone): + 4096 = 6288 -> two
    assert QUANTUM_TOKENS == 4096.0
    q = ClassQueue(TABLE, SimpleNamespace(now=0.0))
    for i in range(4):
        q.append(req(i, A), 3000.0)
    for i in range(4, 8):
        q.append(req(i, B), 1000.0)
    assert drain(q) == [0, 4, 5, 6, 7, 1, 2, 3]


def test_weight_scales_the_quantum():
    heavy = parse_table({"classes": {"x": {"slo_ms": 10.0, "weight": 2.0}, "y": {"slo_ms": 10.0}},
                         "tenants": {"p": {"class": "x", "share": 0.5}, "q": {"class": "y", "share": 0.5}}}, "t")
    q = ClassQueue(heavy, SimpleNamespace(now=0.0))
    for i in range(12):
        q.append(req(i, i % 2), 2000.0)             # p: even ids, q: odd
    order = drain(q)
    # p gets 8192 a round (4 requests), q 4096 (2): p p p p q q p p ...
    assert order[:8] == [0, 2, 4, 6, 1, 3, 8, 10]


def test_a_lower_band_keeps_its_minimum_share():
    clock = SimpleNamespace(now=0.0)                 # no time passes: shares are of all service so far
    q = ClassQueue(TABLE, clock)
    for i in range(30):
        q.append(req(i, F), 1000.0)
        q.append(req(100 + i, A), 1000.0)
    order = [q.popleft().tenant for _ in range(25)]
    # f first; then a whenever its share of the service is under 0.2: after 1 of f, after 5, 10, 15, ...
    assert order[:7] == [F, A, F, F, F, F, A]
    assert order.count(A) == 5 and order.count(A) / len(order) == pytest.approx(0.2)


def test_without_a_minimum_share_a_lower_band_waits():
    q = ClassQueue(TABLE, SimpleNamespace(now=0.0))
    for i in range(5):
        q.append(req(i, F), 1000.0)
        q.append(req(100 + i, Z), 1000.0)
    assert [r.tenant for r in (q.popleft() for _ in range(10))] == [F] * 5 + [Z] * 5


def test_recent_service_decays():
    clock = SimpleNamespace(now=0.0)
    q = ClassQueue(TABLE, clock)
    for i in range(20):
        q.append(req(i, F), 1000.0)
    for _ in range(10):
        q.popleft()                                  # band 0 alone: 10,000 tokens served
    clock.now = 10.0                                 # ten time constants later that service is forgotten
    q.append(req(50, A), 1000.0)
    q.append(req(51, A), 1000.0)
    assert q.popleft().tenant == A                   # its share is 0 < 0.2 of the little remembered ...
    assert q.popleft().tenant == F                   # ... and then 1000 of ~1000: above it


def test_a_new_arrival_of_a_higher_band_changes_the_head():
    q = ClassQueue(TABLE, SimpleNamespace(now=0.0))
    q.append(req(0, Z), 1000.0)
    assert q[0].rid == 0
    q.append(req(1, F), 1000.0)
    assert q[0].rid == 1 and drain(q) == [1, 0]
