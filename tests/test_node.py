import numpy as np
import pytest

from helmgr.memory.link import EMB_MISS, KV_ONLOAD
from helmgr.core.records import NodeConfig
from helmgr.sim.node import Node
from helmgr.core.profiles import NodeProfile
from tests.conftest import tiny_hardware, tiny_model, tiny_node_profile

N_ITEMS = 200_000


def warm_node(profile=None, **config):
    n = Node(profile or tiny_node_profile(), N_ITEMS, NodeConfig(**({"ratio": 0.05} | config)))
    n.emb.warm(np.linspace(1, 0, N_ITEMS, dtype=np.float32))   # rows 0 .. 13,311 resident
    return n


def history(user, start, stop):
    """Position p holds item p, except position 101, which holds the cold item 150,000."""
    ids = np.arange(start, stop, dtype=np.int64)
    ids[ids == 101] = 150_000
    return ids


def test_kv_miss_then_hit_by_hand():
    n = warm_node()
    assert n.emb.capacity_rows == 13 * 1024
    s = n.serve(0.0, 5, 100, history(5, 100, 102), np.array([2, 3, 160_000, 170_000]), history)
    # KV miss: 100 prefix ids (resident) + 2 new (100 hit, 150,000 miss) + 4 candidates (2 miss)
    assert (s.kv_tokens, s.ids, s.misses) == (0, 106, 3)
    ready = 3e-6 + 10e-6 + 3 * 64 / 10e9                        # host gather, then the copy
    flops = 2 * (640 * 102 + 32 * 102 * 103 // 2) + 2 * (640 * 4 + 32 * 4 * 103)
    assert s.end == pytest.approx(ready + 106 * 64 / 1e12 + flops / 5e13 + 50e-6)
    assert n.link.bytes_by_cause[EMB_MISS] == 192
    assert n.kv.peek(5) == 102
    s2 = n.serve(1.0, 5, 102, history(5, 102, 103), np.array([2]), history)
    assert (s2.kv_tokens, s2.ids, s2.misses) == (102, 2, 0)
    flops2 = 2 * (640 * 1 + 32 * 103) + 2 * (640 + 32 * 104)
    assert s2.end == pytest.approx(1.0 + 2 * 64 / 1e12 + flops2 / 5e13 + 50e-6)
    assert n.stats.kv_hit_rate == pytest.approx(102 / 202)
    assert n.stats.emb_hit_rate == pytest.approx(105 / 108)
    n.check_integrity()


def test_misses_queue_on_the_link():
    n = warm_node()
    far = np.arange(150_000, 150_100, dtype=np.int64)           # 100 misses, 6,400 B
    a = n.serve(0.0, 1, 0, far, far[:0], history)
    b = n.serve(0.0, 2, 0, far, far[:0], history)               # same instant: its copy waits
    copy = 10e-6 + 6400 / 10e9
    compute = 2 * (640 * 100 + 32 * 5050) / 5e13 + 50e-6            # 100 new tokens, nothing cached
    assert a.end == pytest.approx(100e-6 + copy + 100 * 64 / 1e12 + compute)
    assert n.link.busy_until == pytest.approx(100e-6 + 2 * copy)
    assert b.end - a.end == pytest.approx(copy)


def test_partial_prefix_from_another_node_is_reused():
    n = warm_node()
    n.kv.insert(9, 60)                                           # an older, shorter prefix
    s = n.serve(0.0, 9, 100, np.zeros(0, np.int64), np.zeros(0, np.int64), history)
    assert s.kv_tokens == 60 and s.ids == 40


def test_host_tier_onload_when_cheaper_than_recompute():
    slow = NodeProfile(tiny_hardware(hbm_gib=0.515625, peak_tflops=0.001), tiny_model(), page_mib=1 / 16)
    n = warm_node(slow, host_kv_gib=0.001, ratio=0.95)           # KV: 13 pages = 13,312 tokens
    n.kv.insert(1, 10_000)
    n.kv.insert(2, 10_000)                                       # evicts user 1 to the host tier
    assert n.kv.peek(1) == 0 and n.kv.host_lookup(1) == 10_000
    s = n.serve(0.0, 1, 10_000, np.zeros(0, np.int64), np.zeros(0, np.int64), history)
    assert s.kv_tokens == 10_000 and s.ids == 0
    assert n.link.bytes_by_cause[KV_ONLOAD] == 10_000 * 64
    assert n.stats.onload_tokens == 10_000
