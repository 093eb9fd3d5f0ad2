import dataclasses

import numpy as np
import pytest

from helmgr.sim import SimConfig, simulate
from helmgr.core.window import NodeWindow
from helmgr.policy.base import Static
from helmgr.workload import default_config, synthetic_workload
from helmgr.workload.arrivals import SessionShape


def ratios(result, node=0):
    return [r for t, n, r in result.cluster.rec.timeline if n == node]


@pytest.mark.parametrize("policy,least_move", [("adaptive", 0.08), ("latency-driven", 0.12)])
def test_moves_memory_to_the_embedding_cache_when_only_it_gains(policy, least_move):
    """No KV reuse (every request a new user), flat popularity over 1 M items: only the EMB
    shadow sees hits, so memory should flow to EMB, a step per 2-s interval."""
    w = synthetic_workload(default_config("steady", rps=250, duration_s=12, n_users=1_000_000, activity_exponent=0.0,
                                          session=SessionShape(1.0, 1.0, 4.0), head_exponent=0.6,
                                          tail_exponent=0.5), 0)
    r = simulate(SimConfig(nodes=1, ratio=0.3, policy=policy, warmup_s=0), w)
    steps = ratios(r)
    assert steps[0] == 0.3 and steps[-1] >= 0.3 + least_move - 1e-9
    if policy == "adaptive":                                  # one step up per 2-s interval
        assert all(b > a for a, b in zip(steps, steps[1:]))


@pytest.mark.parametrize("policy,least_move", [("adaptive", 0.08), ("latency-driven", 0.16)])
def test_moves_memory_to_the_kv_cache_when_only_it_gains(policy, least_move):
    """A catalogue that fits in EMB at any split, and 800 users coming back every ~2 s whose
    prefixes overflow the KV cache at r = 0.7: only the KV shadow (recent evictions) sees hits."""
    w = synthetic_workload(default_config("steady", rps=400, duration_s=12, n_items=20_000, n_clusters=16,
                                          n_users=5000, activity_exponent=0.0,
                                          session=SessionShape(30.0, 2.0, 4.0)), 0)
    r = simulate(SimConfig(nodes=1, ratio=0.7, policy=policy, warmup_s=0), w)
    steps = ratios(r)
    assert steps[0] == 0.7 and steps[-1] <= 0.7 - least_move + 1e-9
    assert all(b < a for a, b in zip(steps, steps[1:]))


class Recording(Static):
    def __init__(self):
        self.windows: list[NodeWindow] = []

    def observe(self, index, window, node):
        self.windows.append(window)


def test_policies_see_every_node_every_window_and_the_windows_add_up():
    w = synthetic_workload(default_config("steady", rps=400, duration_s=6, n_items=100_000, n_clusters=16,
                                          n_users=50_000), 0)
    policy = Recording()
    r = simulate(SimConfig(nodes=2, warmup_s=0), w, policy=policy)
    assert [(x.node, round(x.t, 6)) for x in policy.windows[:4]] == [(0, 1.0), (1, 1.0), (0, 2.0), (1, 2.0)]
    done_in_windows = sum(x.completed for x in policy.windows)
    assert done_in_windows <= r.summary["completed"]
    assert sum(x.emb_ids for x in policy.windows) <= sum(n.stats.ids for n in r.cluster.nodes)
    p99 = [x.p99_s for x in policy.windows if x.p99_s is not None]
    assert p99 and all(np.isfinite(p99))


def test_independent_sizes_each_cache_from_its_own_curve():
    """No KV reuse: the KV curve is flat at 1, so KV asks for nothing and EMB gets the pool
    (clamped to r_max). A catalogue that fits in 2 % of the pool: EMB asks for that little and KV,
    whose users overflow it, gets the rest (clamped to r_min)."""
    wa = synthetic_workload(default_config("steady", rps=250, duration_s=8, n_users=1_000_000, activity_exponent=0.0,
                                           session=SessionShape(1.0, 1.0, 4.0), head_exponent=0.6,
                                           tail_exponent=0.5), 0)
    assert ratios(simulate(SimConfig(nodes=1, ratio=0.3, policy="independent", warmup_s=0), wa)) == [0.3, 0.95]
    wb = synthetic_workload(default_config("steady", rps=400, duration_s=8, n_items=20_000, n_clusters=16,
                                           n_users=5000, activity_exponent=0.0,
                                           session=SessionShape(30.0, 2.0, 4.0)), 0)
    assert ratios(simulate(SimConfig(nodes=1, ratio=0.7, policy="independent", warmup_s=0), wb)) == [0.7, 0.05]


def test_marginal_value_prices_both_shadows_by_hand():
    """The counterfactual d(saved s)/dr per request: EMB shadow hits at a row's gather + copy, KV
    ghost tokens at their recompute plus their row's lookup at the window's miss rate."""
    from helmgr.core.costs import CostModel
    from helmgr.policy.marginal import marginal_value, shadow_prices
    cost = CostModel(row_bytes=1000, kv_bytes_per_token=1, hbm_bw=1e12, pcie_bw=1e9, pcie_latency_s=0.0,
                     host_lookup_s=2e-6, flops=1e9, layers=1, linear_flops=100, attention_flops=1,
                     launch_overhead_s=0.0)
    # a row: 2 us gather + 1 us copy; a token of a 10-token prefix: (100 x 10 + 55 pairs) / 1e9 / 10
    assert shadow_prices(cost, 10) == pytest.approx((3e-6, 1.055e-7))
    w = NodeWindow(node=0, t=2.0, span_s=1.0, ratio=0.5, arrivals=10, completed=10, p99_s=0.01, queue_len=0,
                   busy_s=0.5, emb_ids=1000, emb_misses=100, kv_prefix_tokens=100, kv_hit_tokens=50, cold_requests=0,
                   emb_wait_s=0.0, recompute_s=0.0, h2d_busy_s=0.0, emb_shadow_hits=50, kv_shadow_tokens=200)
    value, emb_s, kv_s = marginal_value(w, cost, share=0.05)
    assert emb_s == pytest.approx(50 * 3e-6) and kv_s == pytest.approx(200 * (1.055e-7 + 0.1 * 3e-6))
    assert value == pytest.approx((1.5e-4 - 8.11e-5) / 0.05 / 10)
    assert marginal_value(dataclasses.replace(w, completed=0), cost, 0.05) is None
