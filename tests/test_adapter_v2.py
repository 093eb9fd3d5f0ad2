"""Adapter v2: the offset learned from the shadows' marginal value."""
import math

import numpy as np
import pytest

from helmgr.controller import Controller
from helmgr.controller.adapter import MarginalAdapter
from helmgr.controller.safety import Safety
from tests.test_controller import constant_policy, stats


def test_a_block_of_significant_samples_steps_the_offset_toward_its_sign():
    """Block 5, z 2.5, step 0.02: samples 1.0, 1.2, 0.8, 1.1, 0.9 have mean 1.0 and standard
    error sqrt(0.025 / 5) = 0.0707, so 14 standard errors: +0.02. The same block negated: back to
    0. Eight such blocks end at the bound (0.15, not 0.16); a ninth moves nothing. (A fixed step:
    grow 1; bound 0.15.)"""
    a = MarginalAdapter(bound=0.15, grow=1.0, max_step=None)
    block = [1.0, 1.2, 0.8, 1.1, 0.9]
    assert [a.learn(x) for x in block] == [False] * 4 + [True]
    assert a.offset == pytest.approx(0.02) and a.updates == 5 and a.applied == 1
    assert a.params.tolist() == pytest.approx([0.02])
    for x in block:
        a.learn(-x)
    assert a.offset == pytest.approx(0.0, abs=1e-12)
    for _ in range(8):
        for x in block:
            a.learn(x)
    assert a.offset == pytest.approx(0.15) and a.applied == 2 + 8
    assert [a.learn(x) for x in block] == [False] * 5 and a.applied == 10


def test_each_load_level_learns_its_own_offset():
    """load_width 0.1: rates 1.1^48 and 1.1^53 are levels 48 and 53 (ln(rate) / ln 1.1). A
    significant block at level 48 steps +0.02. The load jumps to 1.1^53: the rate's EWMA (weight
    0.3 a sample) leaves level 48 at the first sample (1.1^49.6; past the 0.75 hysteresis), which
    swaps in level 50's offset, 0, and drops the open block; it then climbs level by level to
    53, where a negative block steps -0.02. Back at 1.1^48, level 48's +0.02 returns, and level 53
    keeps its -0.02 (levels between hold 0)."""
    block = [1.0, 1.2, 0.8, 1.1, 0.9]
    low, high = 1.1 ** 48, 1.1 ** 53
    a = MarginalAdapter(grow=1.0, max_step=None, load_width=0.1)
    assert [a.learn(x, low) for x in block] == [False] * 4 + [True]
    assert a.level == 48 and a.offset == pytest.approx(0.02)
    assert a.learn(0.0, high) and a.level == 50 and a.offset == 0.0 and a.params.tolist() == [0.0]
    for _ in range(20):
        a.learn(0.0, high)
    assert a.level == 53 and a.offset == 0.0
    a.samples = []                                  # a fresh block
    for x in block:
        a.learn(-x, high)
    assert a.level == 53 and a.offset == pytest.approx(-0.02)
    for _ in range(20):
        a.learn(0.0, low)
    assert a.level == 48 and a.offset == pytest.approx(0.02)
    assert a.levels[53][0] == pytest.approx(-0.02) and a.levels[50][0] == 0.0


def test_load_levels_follow_the_node_or_the_cluster_mean_rate():
    """The controller hands its adapter the node's rate unless told another: a window of 300
    req/s with load_width 0.1 is level round(ln 300 / ln 1.1) = 60; the same window with load
    1.1^48 is level 48. HELM's "cluster" load is the mean of the latest rates of the nodes that
    reported within two windows (1-s windows): 100; (100 + 200) / 2 = 150; node 0 again at 2 s:
    (120 + 200) / 2 = 160; at 4 s node 1's 1-s window is stale: 90 alone. "cluster" is HELM's
    default; "node" gives None (the controller then takes the node's own)."""
    from helmgr.policy.helm import HelmPolicy
    for load, level in ((None, 60), (1.1 ** 48, 48)):
        ctl = Controller(constant_policy(0.0), adapter=MarginalAdapter(load_width=0.1))
        ctl.step(stats(0.5, rps=300.0), marginal=1.0, load=load)
        assert ctl.adapter.level == level
    p = HelmPolicy()
    assert [p._load(0, 1.0, 1.0, 100.0), p._load(1, 1.0, 1.0, 200.0), p._load(0, 2.0, 1.0, 120.0),
            p._load(0, 4.0, 1.0, 90.0)] == [100.0, 150.0, 160.0, 90.0]
    assert HelmPolicy(level_load="node")._load(0, 1.0, 1.0, 100.0) is None
    with pytest.raises(ValueError, match="level_load must be 'node' or 'cluster', got 'rack'"):
        HelmPolicy(level_load="rack")


def test_noise_frozen_and_missing_samples_leave_the_offset_alone():
    """Mean 0.2 with samples 1, -1, 1, -1, 0.2: standard error sqrt(4.2 / 4 / 5) = 0.458, 0.44
    errors: no step. Frozen (recovery) or None / NaN: not even counted."""
    a = MarginalAdapter()
    params = a.params
    for x in (1.0, -1.0, 1.0, -1.0, 0.2):
        assert not a.learn(x)
    assert a.offset == 0.0 and a.params is params and a.updates == 5
    a.frozen = True
    for x in [1.0] * 10:
        a.learn(x)
    a.frozen = False
    for x in (None, math.nan, math.inf):
        a.learn(x)
    assert a.updates == 5 and a.offset == 0.0


def test_steps_in_one_direction_grow_and_a_turn_starts_again_from_the_first():
    """step 0.02, grow 1.5, max_step 0.06, bound 0.15: four positive blocks step 0.02, 0.03,
    0.045, then 0.06 (0.0675 capped), the offsets 0.02, 0.05, 0.095, 0.15 (0.155 at the bound).
    A negative block turns: 0.02 back to 0.13; the next one grows again: 0.03, to 0.10."""
    a = MarginalAdapter(bound=0.15, grow=1.5, max_step=0.06)
    block = [1.0, 1.2, 0.8, 1.1, 0.9]
    offsets = []
    for sign in (1, 1, 1, 1, -1, -1):
        for x in block:
            a.learn(sign * x)
        offsets.append(a.offset)
    assert offsets == pytest.approx([0.02, 0.05, 0.095, 0.15, 0.13, 0.10])
    assert a.last_step == pytest.approx(-0.03) and a.applied == 6


def test_adapter_v2_rejects_a_step_past_its_bound():
    with pytest.raises(ValueError, match="step"):
        MarginalAdapter(bound=0.05, step=0.1, max_step=0.1)
    with pytest.raises(ValueError, match="block"):
        MarginalAdapter(block=1)
    with pytest.raises(ValueError, match="max_step 0.3"):
        MarginalAdapter(max_step=0.3)
    with pytest.raises(ValueError, match="grow 0.5"):
        MarginalAdapter(grow=0.5)
    with pytest.raises(ValueError, match="load_hysteresis"):
        MarginalAdapter(load_hysteresis=0.4)
    with pytest.raises(ValueError, match="load_width"):
        MarginalAdapter(load_width=0.0)


def test_the_controller_adds_the_learned_offset_after_the_decision_that_closed_the_block():
    """A base that holds at 0.5 (no min_move), a sample every other window: the block closes in
    the learning after the ninth decision (the fifth sample's), which is still 0.5; from the
    tenth decision on the ratio is 0.52. Windows without a sample learn nothing."""
    ctl = Controller(constant_policy(0.0), adapter=MarginalAdapter(), safety=Safety(max_slew=0.1))
    ratios = []
    for k in range(7):
        ratios.append(ctl.step(stats(0.5), marginal=1.0 + 0.1 * (k % 2)))
        ratios.append(ctl.step(stats(0.5)))                         # no sample this window
    assert ratios[:9] == pytest.approx([0.5] * 9, abs=1e-12)
    assert ratios[9:] == pytest.approx([0.52] * 5, abs=1e-12)
    assert ctl.adapter.updates == 7 and ctl.adapter.applied == 1 and ctl.plan == pytest.approx(0.5)


@pytest.mark.parametrize("offset, hold, moved", [(-0.125, True, 0.01), (-0.125, False, 0.02), (0.125, True, 0.02),
                                                  (-0.25, True, 0.0)])
def test_a_base_step_against_the_offset_shrinks_with_the_share_of_the_bound_it_takes(offset, hold, moved):
    """A base that steps up by 0.02 a window, an offset held by the adapter (no samples): against
    an offset of -0.125 (half the 0.25 bound) the plan climbs 0.01 a window with the hold and
    0.02 without; with the offset (+0.125) it climbs 0.02; at the bound it holds still."""
    adapter = MarginalAdapter(hold_base=hold)
    adapter.set(offset)
    ctl = Controller(constant_policy(1.0), adapter=adapter, safety=Safety(max_slew=1.0))
    ratio = 0.5
    for k in range(1, 4):
        ratio = ctl.step(stats(ratio))
        assert ctl.plan == pytest.approx(0.5 + moved * k, abs=1e-9)
        assert ratio == pytest.approx(ctl.plan + offset, abs=1e-9)


def test_the_shipped_controller_takes_adapter_v2_by_name():
    ctl = Controller.default(adapter="marginal")
    assert isinstance(ctl.adapter, MarginalAdapter) and ctl.adapter.bound == 0.25
    with pytest.raises(ValueError, match="unknown adapter 'ghost'"):
        Controller.default(adapter="ghost")


def test_helm_v2_samples_the_shadows_once_per_emb_refresh():
    """On a small two-node run (6 s, refresh every 2 s) each node's controller gets a sample at
    the windows closing at 2, 4 and 6 s (a refresh runs before a window due at the same time):
    three each, one block short of a step; the run took the compiled path, which keeps the
    shadows (tests/test_engine.py checks it against the Python path). A bias of 0.1 sets every node 0.1 above its controller's decision: the node's
    final ratio is the last decision applied (the fifth window's; the sixth's comes after the
    run) plus 0.1, to the page."""
    from helmgr.policy.helm import HelmBaseAdapter
    from helmgr.sim import SimConfig, simulate
    from tests.test_sim import small

    class Recording(HelmBaseAdapter):
        def observe(self, index, w, node):
            super().observe(index, w, node)
            self.decided.setdefault(index, []).append((self.ctl[index].last, self.target[index]))

    policy = Recording(bias=0.1)
    policy.decided = {}
    r = simulate(SimConfig(nodes=2, ratio=0.5, router="helm", warmup_s=2.0), small(duration_s=6.0), policy=policy)
    s = r.summary
    assert s["sim_path"] == "compiled"
    assert s["controller"]["adapter_estimates"] == 6 and s["controller"]["adapter_offsets"] == [0.0, 0.0]
    for i, node in enumerate(r.cluster.nodes):
        decided = policy.decided[i]
        assert len(decided) == 6
        assert all(t == pytest.approx(min(c + 0.1, 0.95)) for c, t in decided)
        assert node.ratio == pytest.approx(decided[-2][1], abs=0.011)


@pytest.mark.parametrize("shared", [False, True])
def test_a_prefix_recomputed_anywhere_credits_the_ghost_that_evicted_it(shared):
    """Node A evicted user 9's 80-token prefix (its ghost holds it); the router sent user 9's next
    request, a 100-token prefix, to node B, which holds 60 of it. With the ghosts shared, A is
    credited the 80 - 60 = 20 tokens keeping the prefix would have saved; per node, nobody is."""
    from helmgr.memory.kv_table import ghost_put
    from helmgr.policy.marginal import track_shadows
    from tests.test_node import history, warm_node
    a, b = warm_node(), warm_node()
    a.id, b.id = 0, 1
    peers = [] if shared else None
    for node in (a, b):
        track_shadows(node, 0.05, peers)
    ghost_put(a.kv.gmeta, a.kv.gtab, 9, 80)
    assert a.kv.ghost_tokens(9) == 80
    b.kv.insert(9, 60)
    b.serve(0.0, 9, 100, np.zeros(0, np.int64), np.zeros(0, np.int64), history)
    assert (a.stats.kv_shadow_tokens, b.stats.kv_shadow_tokens) == ((20, 0) if shared else (0, 0))
    assert peers is None or [n.id for n in peers] == [0, 1]


def test_helm_revision_names_the_tiers_default_settings():
    """Stored HELM runs are keyed by the revision: a change of adapter v2's or the recovery tier's
    defaults must give a new one (bound 0.25, grow 1.5, the base held; recovery to 0.95 with a
    down-step of 0.05 on three samples today); the base alone names neither tier's settings."""
    from helmgr.policy.helm import helm_revision
    from helmgr.policy.policies import POLICIES
    full, base = helm_revision(POLICIES["helm"]), helm_revision(POLICIES["helm-base"])
    assert "adapter=marginal(bound=0.25," in full and "grow=1.5" in full and "hold_base=True" in full
    assert "shadow=0.05,levels=cluster,value=tail)" in full
    assert "/recovery=True(ratio=0.95,step=0.1,hold=60.0,miss=0.01,signal=0.05,samples=3,z=2.5)" in full
    assert base.endswith("/adapter=False/recovery=False") and base.split("/")[0] == full.split("/")[0]


def test_a_tail_priced_sample_weighs_each_cache_by_its_share_of_the_tails_seconds():
    """Two windows make one sample (the EMB refresh comes before the second). Each: 100 requests,
    the KV ghost k tokens, the EMB shadow 1,000 hits in the second only (prefix 200 tokens a
    request, no EMB misses, so the same prices), k chosen so that the ghost's 2k tokens are worth
    40 % of the shadow's 1,000 rows. Priced over every request the sample is
    (1000 row_s - 2k token_s) / 0.05 / 200, positive (grow EMB); by the tail, the EMB side counts
    (0.01 + 0.01) / (0.2 + 0.2) = 5 % of its seconds and the KV side 50 %: 50 - 200 rows' worth,
    and the sign turns."""
    from helmgr.core.window import NodeWindow
    from helmgr.policy.helm import HelmPolicy
    from helmgr.policy.marginal import MarginalSampler, shadow_prices
    from tests.test_node import warm_node
    node = warm_node()
    row_s, token_s = shadow_prices(node.cost, 200)
    k = round(200 * row_s / token_s)

    def window(t, emb_hits):
        return NodeWindow(node=0, t=t, span_s=1.0, ratio=0.5, arrivals=100, completed=100, p99_s=0.01, queue_len=0,
                          busy_s=0.5, emb_ids=1000, emb_misses=0, kv_prefix_tokens=20_000, kv_hit_tokens=10_000,
                          cold_requests=5, emb_wait_s=0.2, recompute_s=0.1, h2d_busy_s=0.1, emb_shadow_hits=emb_hits,
                          kv_shadow_tokens=k, tail_fetch_s=0.01, tail_recompute_s=0.05)

    samples = {}
    for value in ("mean", "tail"):
        policy = HelmPolicy(value=value)
        policy.sampler = MarginalSampler(policy.shadow_share, value)
        policy.sampler.acc[0] = MarginalSampler.open(node.emb.epoch)
        assert policy._sample(0, window(1.0, 0), node) is None
        node.emb.epoch += 1
        samples[value] = policy._sample(0, window(2.0, 1000), node)
    assert 2 * k * token_s == pytest.approx(400 * row_s, rel=1e-3)
    assert samples["mean"] == pytest.approx((1000 * row_s - 2 * k * token_s) / 0.05 / 200)
    assert samples["mean"] == pytest.approx(600 * row_s / 0.05 / 200, rel=1e-3)
    assert samples["tail"] == pytest.approx((0.05 * 1000 * row_s - 0.5 * 2 * k * token_s) / 0.05 / 200)
    assert samples["tail"] == pytest.approx(-150 * row_s / 0.05 / 200, rel=1e-2)
    with pytest.raises(ValueError, match="value must be 'mean' or 'tail', got 'p99'"):
        HelmPolicy(value="p99")


@pytest.mark.parametrize("value, expected", [("mean", 0.2), ("tail", -0.06)])
def test_a_samples_price_from_its_sums(value, expected):
    """Sums of 2 s of EMB shadow and 1 s of KV ghost over 100 requests, shadows of 5 %: priced
    over every request (2 - 1) / 0.05 / 100 = 0.2; by the tail, the EMB side at 0.1 / 1 of its
    seconds and the KV side at 0.5 / 1, (0.2 - 0.5) / 0.05 / 100 = -0.06."""
    from helmgr.policy.marginal import MarginalSampler
    acc = [2.0, 1.0, 100, 0, 0.1, 1.0, 0.5, 1.0]
    assert MarginalSampler(0.05, value).price(acc) == pytest.approx(expected)


def test_the_library_controller_decides_as_policy_helm():
    """One HELM: the windows, samples and loads that node 0's controller saw in a `--policy helm`
    run (two nodes, 8 s, the HELM router), replayed into `Controller.default()`, give the same
    ratios, one for one, and the same adapter state."""
    from helmgr.policy.helm import HelmPolicy
    from helmgr.sim import SimConfig, simulate
    from tests.test_sim import small

    seen = []

    class Recording(HelmPolicy):
        def attach(self, index, node):
            super().attach(index, node)
            if index == 0:
                step = self.ctl[0].step
                def recorded(stats, marginal=None, load=None):
                    seen.append((stats, marginal, load, step(stats, marginal, load)))
                    return seen[-1][-1]
                self.ctl[0].step = recorded

    policy = Recording()
    r = simulate(SimConfig(nodes=2, ratio=0.5, router="helm", warmup_s=2.0), small(duration_s=8.0), policy=policy)
    assert len(seen) == 8 and sum(m is not None for _, m, _, _ in seen) >= 3     # samples reached adapter v2
    node = r.cluster.nodes[0]
    ctl = Controller.default()
    ctl.safety.r_min, ctl.safety.r_max = node.config.r_min, node.config.r_max
    assert [ctl.step(s, m, load) for s, m, load, _ in seen] == [ratio for *_, ratio in seen]
    assert isinstance(ctl.adapter, MarginalAdapter) and ctl.adapter.updates == policy.ctl[0].adapter.updates
