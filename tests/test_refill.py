import numpy as np
import pytest

from helmgr.memory.link import REFILL, H2DLink
from helmgr.core.records import NodeConfig
from helmgr.sim.node import Node
from tests.conftest import tiny_node_profile

N_ITEMS = 100_000


def node(refill, ratio=0.1, **kw):
    n = Node(tiny_node_profile(), N_ITEMS, NodeConfig(ratio=ratio, refill=refill, **kw))
    n.emb.warm(np.linspace(1, 0, N_ITEMS, dtype=np.float32))
    return n


def test_link_is_fifo_and_counts_bytes_by_cause():
    link = H2DLink(bandwidth=1e9, latency_s=1e-6)
    assert link.transfer(0.0, 1000, "emb_miss") == pytest.approx(2e-6)
    assert link.transfer(1e-6, 1000, "refill") == pytest.approx(4e-6)     # waits for the first
    assert link.transfer(10e-6, 0, "refill") == 10e-6
    assert link.backlog_s(3e-6) == pytest.approx(1e-6)
    assert link.bytes_by_cause == {"emb_miss": 1000, "kv_onload": 0, "refill": 1000}


def test_sync_refill_blocks_the_node_for_bytes_over_bandwidth():
    n = node("sync", ratio=0.05)              # 13 of 256 pages, 1,024 rows of 64 B each
    rows_before = n.emb.capacity_rows
    plan, wake = n.resize(0.1, now=1.0)
    grown = n.emb.capacity_rows - rows_before
    assert (plan.moved_pages, grown, wake) == (13, 13 * 1024, None)
    nbytes = grown * 64
    expected = 10e-6 + nbytes / 10e9
    assert n.blocked_until == pytest.approx(1.0 + expected)
    assert n.stats.refill_blocked_s == pytest.approx(expected)
    assert n.link.bytes_by_cause[REFILL] == nbytes
    assert n.emb.unfilled_rows == 0
    # a request arriving during the refill starts when it ends
    s = n.serve(1.0, 7, 0, np.array([1]), np.array([2]), lambda u, a, b: np.zeros(0, np.int64))
    assert s.start == pytest.approx(1.0 + expected)


def test_lazy_refill_copies_nothing_and_admits_on_miss():
    n = node("lazy", ratio=0.05)
    before = n.emb.capacity_rows
    n.resize(0.1, now=1.0)
    assert n.link.bytes_by_cause[REFILL] == 0 and n.blocked_until == 0.0
    assert n.emb.unfilled_rows == n.emb.capacity_rows - before
    row = int(n.emb.next_unfilled(1)[0])
    s = n.serve(2.0, 1, 0, np.array([row]), np.zeros(0, np.int64), None)
    assert (s.misses, s.unfilled_misses) == (1, 1)
    assert n.emb.resident[row]


def test_background_refill_stays_within_its_share():
    n = node("background", ratio=0.05, refill_share=0.25)
    _, wake = n.resize(0.9, now=0.0)          # EMB grows to the whole table: 100,000 - 13 x 1,024 rows
    total = n.emb.unfilled_rows * 64
    assert total == (100_000 - 13 * 1024) * 64
    chunk, share_bw = 4 * 2**20, 0.25 * 10e9
    steps, last = 0, 0.0
    while wake is not None:
        # by each step the stream has sent at most its share of the time since it began (+ one chunk)
        assert n.link.bytes_by_cause[REFILL] <= share_bw * wake + chunk
        last, wake = wake, n.refill_step(wake)
        steps += 1
    assert n.emb.unfilled_rows == 0
    assert n.link.bytes_by_cause[REFILL] == total
    assert steps == 2                          # resize sent chunk 1; step 1 fills it, sends chunk 2; step 2 fills
    assert last >= (total - chunk) / share_bw


def test_recovery_refill_is_lazy_until_active_then_streams_like_background():
    n = node("recovery", ratio=0.05, refill_share=0.25)
    _, wake = n.resize(0.1, now=0.0)           # inactive: lazy, nothing copied
    assert wake is None and n.link.bytes_by_cause[REFILL] == 0
    grown = n.emb.unfilled_rows
    assert grown == 13 * 1024
    n.refill.active = True                    # the recovery tier holds the node
    _, wake = n.resize(0.9, now=1.0)          # the grow starts the stream: the hottest 4 MiB first
    chunk = 4 * 2**20
    assert n.link.bytes_by_cause[REFILL] == chunk
    assert wake == pytest.approx(1.0 + chunk / (0.25 * 10e9))
    n.refill.active = False                   # recovery over: the chunk on the link is filled, then lazy
    unfilled = n.emb.unfilled_rows
    assert n.refill_step(wake) is None
    assert n.emb.unfilled_rows == unfilled - chunk // 64
    assert n.link.bytes_by_cause[REFILL] == chunk
    assert n.refresh(wake) is None            # a refresh while inactive starts nothing
