"""The simulated node and the real runtime are one role: both satisfy core.backend's protocols,
member for member and parameter for parameter, and serve the same request to the same record."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

from helmgr.core.backend import NodeBackend, Served
from helmgr.core.profiles import node_profile
from helmgr.core.records import NodeConfig
from helmgr.core.window import NodeCounters
from helmgr.sim.node import Node

MEMBERS = [m for m in ("ratio", "resize", "refresh", "serve", "counters", "check_integrity")]
N_ITEMS = 2_000


def _history(user, start, stop):
    return (np.arange(start, stop) * 7 + user) % N_ITEMS


def simulated():
    return Node(node_profile("a100-80g", "small"), N_ITEMS, NodeConfig(ratio=0.5))


def real():
    pytest.importorskip("torch")
    from helmgr.real.runtime import NodeRuntime, runtime_model
    from helmgr.core.profiles import NodeProfile, load_hardware
    profile = NodeProfile(load_hardware("cpu-ref"), runtime_model("small", candidates=16))
    return NodeRuntime(profile, 8 << 20, "cpu", seed=0, n_items=N_ITEMS, config=NodeConfig(ratio=0.5))


@pytest.mark.parametrize("make", [simulated, real], ids=["sim", "real"])
def test_backend_satisfies_the_protocol(make):
    node = make()
    assert isinstance(node, NodeBackend)
    for name in MEMBERS:
        ours = getattr(NodeBackend, name)
        theirs = getattr(type(node), name)
        if isinstance(ours, property):
            assert isinstance(theirs, property), name
            continue
        want = list(inspect.signature(ours).parameters)
        got = list(inspect.signature(theirs).parameters)
        assert got[:len(want)] == want, f"{type(node).__name__}.{name}{got} vs {want}"
    s = node.serve(0.0, 3, 20, _history(3, 20, 24), np.arange(16), _history)
    assert isinstance(s, Served)
    assert s.ids == 24 + 16 and s.kv_tokens == 0     # a cold user: the whole history is computed
    assert 0 <= s.misses <= s.ids and s.end >= s.start
    c = node.counters()
    assert isinstance(c, NodeCounters)
    assert c.emb_ids == 40 and c.kv_prefix_tokens == 20 and c.cold_requests == 1
    node.resize(0.3, 1.0)
    assert node.ratio == pytest.approx(0.3, abs=0.05)
    node.check_integrity()


def test_a_node_missing_a_verb_is_not_a_backend():
    class Half:
        config = stats = None
        ratio = 0.5

        def serve(self, now, user, prefix_len, new_ids, cand_ids, history):
            return None

    assert not isinstance(Half(), NodeBackend)
