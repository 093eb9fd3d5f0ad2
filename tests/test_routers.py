import numpy as np
import pytest

from helmgr.core.errors import HelmInputError
from helmgr.routing.routers import ROUTERS, make_router


def bound(name, n=4, **kw):
    r = make_router(name) if not kw else ROUTERS[name](**kw)
    up = [True] * n
    r.bind(n, up, np.random.default_rng(0))
    return r, up


def test_round_robin_skips_down_nodes():
    r, up = bound("round-robin", 3)
    up[1] = False
    assert [r.route(u, 0, 0) for u in range(4)] == [0, 2, 0, 2]


def test_least_loaded_takes_turns_among_equals():
    r, _ = bound("least-loaded", 3)
    r.load[:] = [2, 0, 0]
    assert [r.route(0, 0, 0) for _ in range(4)] == [1, 1, 2, 1]    # starts rotate 0, 1, 2, 0


def test_power_of_two_picks_the_less_loaded_of_its_pair():
    r, _ = bound("p2c", 2)
    r.load[:] = [5, 1]
    assert all(r.route(0, 0, 0) == 1 for _ in range(50))


def test_affinity_is_stable_and_moves_only_the_failed_nodes_users():
    r, up = bound("affinity", 4)
    before = [r.route(u, 0, 0) for u in range(2000)]
    assert set(before) == {0, 1, 2, 3}
    assert [r.route(u, 0, 0) for u in range(2000)] == before
    up[2] = False
    after = [r.route(u, 0, 0) for u in range(2000)]
    moved = [u for u in range(2000) if after[u] != before[u]]
    assert moved and all(before[u] == 2 for u in moved) and 2 not in after


def test_prefix_aware_follows_the_prefix_unless_imbalanced():
    r, _ = bound("prefix-aware", 3)
    r.dispatched(2, user=7, tokens=1000)                 # user 7's prefix went to node 2
    r.load[:] = [0, 0, 1]
    assert r.route(7, 1000, 1004) == 2                   # balanced enough: follow the prefix
    assert r.route(8, 1000, 1004) in (0, 1)              # unknown user: least loaded
    r.load[:] = [0, 1, 6]
    assert r.route(7, 1000, 1004) == 0                   # 6 - 0 > 4 and 6 > 1.5 x 0: rebalance
    r.load[:] = [1, 0, 1]
    assert r.route(7, 3000, 3004) == 1                   # match 1000 / 3000 < 0.5: least loaded
    assert r.route(7, 1500, 1504) == 2                   # match 1000 / 1500 >= 0.5: the prefix


def test_unknown_router():
    with pytest.raises(HelmInputError, match="unknown router 'random'"):
        make_router("random")
