import json

import numpy as np
import pytest

from helmgr.core.records import NodeConfig
from helmgr.sim.node import Node
from helmgr.sim import SimConfig, parse_fault, simulate
from helmgr.routing.residency import (BLOCKED, CHUNK_S, HISTORY_MIN_IDS, HISTORY_MISS, REFILL_UNTIL, EmbSummary, KVBatch,
                                      ResidencyIndex, ResidencyReporter, history_miss_rate)
from helmgr.routing import kernel as route_kernel
from helmgr.routing.kernel import FREE, LINK_WASTE, MEMO, MISS, N_CONSTS
from helmgr.routing.helm import Helm
from helmgr.routing.routers import ROUTERS
from tests.conftest import tiny_node_profile
from tests.test_node import N_ITEMS, history
from tests.test_sim import small


def warm_node(i=0):
    n = Node(tiny_node_profile(), N_ITEMS, NodeConfig(ratio=0.05), node_id=i)
    n.emb.warm(np.linspace(1, 0, N_ITEMS, dtype=np.float32))   # rows 0 .. 13,311 resident
    return n


def helm(nodes, name="helm", **kw):
    """A HELM router (or ablation) over warm tiny nodes that knows them exactly: every node is a
    candidate, its summary published, every candidate id tested (sample >= candidates), and the
    test users' history rows all resident."""
    r = ROUTERS[name](d=8, sample=1024, **kw)
    r.bind(len(nodes), [True] * len(nodes), np.random.default_rng(0))
    index = r.attach(nodes[0].cost, N_ITEMS)
    for i, node in enumerate(nodes):
        index.apply_summary(ResidencyReporter(i, node).summary(0.0))
    index.node[:, HISTORY_MISS] = 0.0
    return r, index


CANDS = np.array([2, 3, 160_000, 170_000])                    # two resident, two not


def test_predicted_service_is_what_the_node_charges():
    """Exact knowledge -> the router's price equals Node.serve's service, KV miss and KV hit."""
    node = warm_node()
    r, index = helm([node])
    new = history(5, 100, 102)                                   # item 100 (resident) and 150,000 (not)
    assert r.route_request(0.0, 5, 100, new, CANDS) == 0
    predicted = r.last_decision.service_s
    s = node.serve(0.0, 5, 100, new, CANDS, history)             # cold: recomputes the 100-token prefix
    assert predicted == pytest.approx(s.end - s.start, rel=1e-12)
    index.apply_kv(ResidencyReporter(0, node).kv_batch() or KVBatch(0, 1, [(5, 102)]))
    new2 = history(5, 102, 103)
    r.route_request(1.0, 5, 102, new2, CANDS)
    s2 = node.serve(1.0, 5, 102, new2, CANDS, history)           # warm: 102 tokens cached
    assert s2.kv_tokens == 102
    assert r.last_decision.service_s == pytest.approx(s2.end - s2.start, rel=1e-12)


def recompute_saving(node, prefix, new, cands):
    """What holding `prefix` tokens saves on this request (no misses differ): by the cost model."""
    c = node.cost
    k, n = len(new), len(cands)
    cold = c.compute_s(prefix + k, 0, n) + c.lookup_s(prefix + k + n)
    warm = c.compute_s(k, prefix, n) + c.lookup_s(k + n)
    return cold - warm


@pytest.mark.parametrize("waste, queue", [(1.0, 2.0), (4.0, 5.0), (None, 1.0)])
def test_prefix_holder_wins_unless_its_queue_outweighs_the_recompute_it_saves_and_wastes(waste, queue):
    """An idle node recomputing the prefix finishes `saving` later than the holder would idle and
    wastes `saving` of work, priced x the waste weight: the holder wins until its queue passes
    (1 + weight) x saving. Weight 1: 2 x; 4: 5 x; the load-based weight (the default, None) on
    an idle cluster (rho = 0, the others' backlog 0): 0, so 1 x."""
    nodes = [warm_node(i) for i in range(3)]
    r, index = helm(nodes, waste=waste)
    index.apply_kv(KVBatch(1, 1, [(5, 1000)]))                  # node 1 holds user 5's 1,000 tokens
    new = np.array([1000, 1001])
    saving = recompute_saving(nodes[0], 1000, new, CANDS)
    assert saving == pytest.approx(7.3024e-7)                    # 2 x 2,002,000 attention pairs + 1,000 tokens' rows
    assert r.route_request(1.0, 5, 1000, new, CANDS) == 1
    r.mine[1, FREE] = 1.0 + (queue - 0.01) * saving              # queued work just under the bound
    assert r.route_request(1.0, 5, 1000, new, CANDS) == 1
    r.mine[1, FREE] = 1.0 + (queue + 0.01) * saving              # just over: recompute elsewhere
    assert r.route_request(1.0, 5, 1000, new, CANDS) in (0, 2)


def test_with_few_nodes_up_among_many_slots_the_holder_still_has_a_rival():
    """A serving app lists more slots than it has replicas (here 2 up of 6, d = 2): random draws
    would mostly land on down slots, leaving the prefix holder alone; the router then prices every
    up node, so a holder whose queue outweighs the recompute it saves loses, every time."""
    nodes = [warm_node(i) for i in range(2)]
    r = ROUTERS["helm"](d=2, sample=1024)
    r.bind(6, [True] * 6, np.random.default_rng(0))
    index = r.attach(nodes[0].cost, N_ITEMS)
    for n in range(2, 6):
        r.node_down(n)
    for i, node in enumerate(nodes):
        index.apply_summary(ResidencyReporter(i, node).summary(0.0))
    index.node[:, HISTORY_MISS] = 0.0
    index.apply_kv(KVBatch(1, 1, [(5, 1000)]))                  # node 1 holds user 5's prefix
    new = np.array([1000, 1001])
    r.mine[1, FREE] = 1.0 + 1.01 * recompute_saving(nodes[0], 1000, new, CANDS)   # idle rivals: waste is free

    def route():                       # the last decision's least-wait node was the holder too
        r.consts[MEMO] = 1
        return r.route_request(1.0, 5, 1000, new, CANDS)
    assert {route() for _ in range(100)} == {0}
    r.mine[1, FREE] = 0.0
    assert {route() for _ in range(100)} == {1}


def test_a_refilling_node_loses_to_an_equal_node_that_is_not():
    nodes = [warm_node(i) for i in range(2)]
    r, index = helm(nodes)
    new = np.array([10, 11])
    picks = {r.route_request(1.0, u, 0, new, CANDS) for u in range(200)}
    assert picks == {0, 1}                                       # equal: both chosen
    index.node[1, BLOCKED] = 1.0 + 1e-3                          # a sync refill holds node 1 for 1 ms
    assert {r.route_request(1.0, u, 0, new, CANDS) for u in range(200)} == {0}
    index.node[1, BLOCKED] = 0.0
    index.node[1, REFILL_UNTIL], index.node[1, CHUNK_S] = 2.0, 1e-4   # background refill on its link
    assert {r.route_request(1.0, u, 0, new, CANDS) for u in range(200)} == {0}
    assert {r.route_request(2.5, u, 0, new, CANDS) for u in range(200)} == {0, 1}   # refill over


def test_equal_nodes_are_chosen_evenly():
    nodes = [warm_node(i) for i in range(4)]
    r, _ = helm(nodes)
    new = np.array([10, 11])
    counts = np.bincount([r.route_request(1.0, u, 0, new, CANDS) for u in range(40_000)], minlength=4)
    assert counts.sum() == 40_000
    chi2 = float(((counts - 10_000) ** 2 / 10_000).sum())
    assert chi2 < 16.3                                           # p = 0.001 for 3 degrees of freedom


def test_ablations_drop_their_term():
    nodes = [warm_node(i) for i in range(2)]
    new = np.array([1000, 1001])
    saving = recompute_saving(nodes[0], 1000, new, CANDS)
    for name, follows_prefix in (("helm", True), ("helm-kv", True), ("helm-emb", False), ("helm-load", False)):
        r, index = helm(nodes, name)
        index.apply_kv(KVBatch(1, 1, [(5, 1000)]))
        r.mine[1, FREE] = 1.0 + 0.5 * saving                     # node 1 busier, by less than the saving
        assert (r.route_request(1.0, 5, 1000, new, CANDS) == 1) == follows_prefix, name
    # the EMB term: node 1 reports none of the rows resident; only EMB-aware routers avoid it
    for name, avoids in (("helm", True), ("helm-emb", True), ("helm-kv", False), ("helm-load", False)):
        r, index = helm(nodes, name)
        index.bits[1] = 0
        assert ({r.route_request(1.0, u, 0, new, CANDS) for u in range(50)} == {0}) == avoids, name


def test_index_versions_gaps_and_forgetting():
    idx = ResidencyIndex(3, 64)
    idx.apply_kv(KVBatch(0, 1, [(7, 100), (8, 50)]))
    idx.apply_kv(KVBatch(0, 2, [(8, 50), (9, 10)]))             # overlaps version 2: only (9, 10) is new
    assert idx.holders == {7: {0: 100}, 8: {0: 50}, 9: {0: 10}} and idx.kv_version[0] == 3
    idx.apply_kv(KVBatch(0, 1, [(7, 0)]))                        # old news: dropped
    assert idx.stale == 1 and idx.holders[7] == {0: 100}
    idx.apply_kv(KVBatch(0, 6, [(7, 0), (8, 20)]))               # versions 4-5 lost: counted, applied
    assert idx.gaps == 1 and idx.holders == {8: {0: 20}, 9: {0: 10}}
    idx.apply_kv(KVBatch(2, 1, [(8, 30)]))
    bits = np.packbits(np.arange(64) < 10, bitorder="little")
    idx.apply_summary(EmbSummary(2, 5, bits, 0.25, 0.0, 0.0, 0.0))
    idx.apply_summary(EmbSummary(2, 4, np.zeros(8, np.uint8), 0.9, 0.0, 0.0, 0.0))   # older: dropped
    assert idx.resident(2, np.array([0, 9, 10, 63])).tolist() == [1, 1, 0, 0]
    assert idx.node[2, HISTORY_MISS] == 0.25 and idx.stale == 2
    idx.forget(2)
    assert idx.holders == {8: {0: 20}, 9: {0: 10}} and idx.resident(2, np.array([0])).tolist() == [0]


def blinded(corrupt):
    """A HELM router whose index gets `corrupt(index)` right after it is made. Without homes:
    they send a user who seems to hold nothing to the same node each time, which recovers some
    of the KV hits wrong reports lose (0.44 against 0.36 here) and would blur what this tests."""
    r = Helm(home_slack_s=0.0)
    attach = r.attach

    def corrupted(cost, n_items, **kw):
        index = attach(cost, n_items, **kw)
        corrupt(index)
        return index

    r.attach = corrupted
    return r


def test_stale_knowledge_degrades_the_choice_never_breaks_it():
    cfg = SimConfig(nodes=4, router="helm", warmup_s=2.0)
    good = simulate(cfg, small(rps=1200.0, duration_s=12.0), router=Helm(home_slack_s=0.0)).summary

    def lost(index):                      # no KV report ever arrives: only where the router sent users
        index.apply_kv = lambda batch: None

    def wrong(index):                     # every KV report names the wrong node; nothing else known
        real = index.apply_kv
        index.apply_kv = lambda b: real(b._replace(node=(b.node + 1) % 4))
        index.expect = lambda node, user, tokens: None

    for corrupt, kv_floor in ((lost, 0.9), (wrong, 0.0)):
        s = simulate(cfg, small(rps=1200.0, duration_s=12.0), router=blinded(corrupt)).summary
        assert s["completed"] == s["requests"] == good["requests"]
        assert np.isfinite(s["p99_ms"])
        assert kv_floor * good["kv_hit_rate"] <= s["kv_hit_rate"]
        if corrupt is wrong:
            assert s["kv_hit_rate"] < 0.5 * good["kv_hit_rate"]
            assert s["p99_ms"] > good["p99_ms"]


def test_helm_routing_in_the_simulator():
    cfg = SimConfig(nodes=4, router="helm", seed=3, warmup_s=2.0)
    a = simulate(cfg, small(seed=3)).summary
    b = simulate(cfg, small(seed=3)).summary
    a.pop("wall_s"), b.pop("wall_s")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert a["completed"] == a["requests"] > 5000
    ll = simulate(SimConfig(nodes=4, router="least-loaded", seed=3, warmup_s=2.0), small(seed=3)).summary
    assert a["kv_hit_rate"] > ll["kv_hit_rate"] + 0.2               # it follows prefixes


def test_helm_reroutes_a_failed_nodes_requests():
    cfg = SimConfig(nodes=4, router="helm", faults=(parse_fault("2@5:12", 4),), warmup_s=0.0)
    r = simulate(cfg, small(rps=2000.0, duration_s=15.0))
    s = r.summary
    assert s["completed"] == s["requests"] and s["rerouted"] > 0
    nodes, arrival = np.asarray(r.cluster.rec.node), np.asarray(r.cluster.rec.arrival)
    assert not ((nodes == 2) & (arrival > 5.01) & (arrival < 12.0)).any()
    assert ((nodes == 2) & (arrival > 12.5)).any()


def test_the_soonest_free_node_follows_dispatches_completions_and_failures():
    r = ROUTERS["helm"]()
    r.bind(4, [True] * 4, np.random.default_rng(0))
    r.attach(tiny_node_profile_cost(), N_ITEMS)
    for node, svc in ((0, 0.003), (1, 0.001), (2, 0.002), (3, 0.004)):
        r._last = (node, svc)
        r.dispatched(node, 7, 10)
    assert r._soonest() == 1                       # free at 1 ms
    r.completed(0, 0.0005)                         # node 0 done early: free now
    assert r._soonest() == 0
    r.node_down(0)
    assert r._soonest() == 1
    r.node_up(0)
    assert r._soonest() == 0
    for node in range(4):
        r.node_down(node)
    assert r._soonest() == -1


def test_the_soonest_free_node_is_always_a_candidate():
    """d = 1 sampled node of 64, all busy but one: the idle one is priced (and, with no prefix
    anywhere, chosen) every time — what a full scan would find, at O(log n) upkeep."""
    n = 64
    r = ROUTERS["helm"](d=1)
    r.bind(n, [True] * n, np.random.default_rng(3))
    r.attach(tiny_node_profile_cost(), N_ITEMS)
    for i in range(n):
        if i != 41:
            r._last = (i, 0.01)
            r.dispatched(i, 1000 + i, 10)          # 10 ms of work queued on every node but 41
    assert r._soonest() == 41
    picks = {r.route_request(0.0, 5, 0, np.array([1]), np.array([2, 3])) for _ in range(50)}
    assert picks == {41}


def tiny_node_profile_cost():
    return Node(tiny_node_profile(), N_ITEMS, NodeConfig(ratio=0.05)).cost


def test_history_miss_rate_rests_on_enough_lookups():
    """A sample of HISTORY_MIN_IDS or more lookups is its own rate; a smaller one is topped up with
    the previous rate, weighted by the lookups it lacks; no previous rate: the sample alone."""
    m = HISTORY_MIN_IDS
    assert history_miss_rate(3 * m // 4, m, 0.5) == 0.75
    assert history_miss_rate(0, 2 * m, 0.5) == 0.0
    assert history_miss_rate(0, m // 4, 0.4) == pytest.approx(0.3)      # (0 + 0.4 x 3m/4) / m
    assert history_miss_rate(m // 8, m // 4, 0.2) == pytest.approx(0.275)   # (m/8 + 0.2 x 3m/4) / m
    assert history_miss_rate(10, 40, -1.0) == 0.25
    assert history_miss_rate(0, 0, 0.3) == 0.3 and history_miss_rate(0, 0, -1.0) == -1.0


def test_a_summary_soon_after_another_keeps_the_rate_it_had():
    """A resize right after a refresh publishes a summary over a few lookups: the rate it reports
    stays near the one before (the burst's resize spike: 0.035 reported for a node at 0.33)."""
    node = warm_node()
    rep = ResidencyReporter(0, node)
    s = node.stats
    s.token_ids, s.token_misses = 100_000, 33_000
    assert rep.summary(1.0).history_miss == pytest.approx(0.33)
    s.token_ids, s.token_misses = 100_000 + 1_000, 33_000 + 35                # 1,000 lookups at 0.035
    expected = (35 + 0.33 * (HISTORY_MIN_IDS - 1_000)) / HISTORY_MIN_IDS
    assert rep.summary(1.01).history_miss == pytest.approx(expected)
    assert 0.32 < expected


def half_missing_pair(waste: float, overlapped: bool) -> Helm:
    """Two warm nodes a HELM router with a fixed waste weight knows exactly, but for their history
    miss rates: node 0 misses none of a recomputed prefix's rows, node 1 half of them."""
    nodes = [warm_node(i) for i in range(2)]
    r = ROUTERS["helm"](d=8, sample=1024, waste=waste)
    r.bind(2, [True, True], np.random.default_rng(0))
    index = r.attach(nodes[0].cost, N_ITEMS, overlapped=overlapped)
    for i, node in enumerate(nodes):
        index.apply_summary(ResidencyReporter(i, node).summary(0.0))
    index.node[:, HISTORY_MISS] = (0.0, 0.5)
    return r


@pytest.mark.parametrize("overlapped, chosen", [(False, 0), (True, 1)])
def test_a_placements_waste_counts_its_link_seconds_only_on_serial_nodes(overlapped, chosen):
    """A cold 1,000-token history; node 1 misses half of its rows (history miss 0.5), node 0 none:
    node 1 costs d = 500 misses' link seconds more. Node 0 is busier by 3d. With a fixed waste
    weight of 4, node 0 finishes at 3d + s, node 1 at s + d + 4 x (its waste). Serial nodes: the
    waste is d (the link is the node) -> 5d, node 0 wins. Pipelined nodes (`overlapped`): the
    link fetches while the last batch computes, the waste is the compute part alone, 0 -> d,
    node 1 wins."""
    r = half_missing_pair(4.0, overlapped)
    d = 500 * r.consts[MISS]
    r.mine[0, FREE] = 1.0 + 3 * d
    assert r.route_request(1.0, 5, 1000, np.array([10, 11]), CANDS) == chosen


@pytest.mark.parametrize("overlapped, chosen", [(False, 0), (True, 1)])
def test_a_pipelined_nodes_misses_are_fetched_behind_the_work_before_them(overlapped, chosen):
    """Node 0 misses nothing and runs out of work at 1 + 2d; node 1 misses half of a cold
    1,000-token history's rows (d link seconds) and runs out at 1 + 1.5d; no waste weight. In
    series (serial nodes) node 1 finishes at 1 + 1.5d + d + c, after node 0's 1 + 2d + c: node 0.
    On pipelined nodes its rows come over the link while the work before them computes, so it
    computes at max(1 + 1.5d, 1 + d) and finishes at 1 + 1.5d + c: node 1, whose books take on c
    alone (d + c once it is idle and the fetch is on the request's path)."""
    r = half_missing_pair(0.0, overlapped)
    d = 500 * r.consts[MISS] + r.consts[route_kernel.PCIE_LATENCY]
    r.mine[:, FREE] = (1.0 + 2 * d, 1.0 + 1.5 * d)
    resident = np.array([2, 3])                                  # candidates node 0 and node 1 both hold
    assert r.route_request(1.0, 5, 1000, np.array([10, 11]), resident) == chosen
    behind = r.last_decision.service_s                           # what node `chosen`'s books take on
    r.mine[:, FREE] = (1.0 + 3 * d, 1.0)                         # node 1 idle: its fetch is on the path
    assert r.route_request(1.0, 6, 1000, np.array([10, 11]), resident) == 1
    idle = r.last_decision.service_s
    # serial: node 0 (no misses) took c, node 1 takes d + c; pipelined: node 1 took c behind other
    # work (its books move to its completion) and d + c idle
    assert idle - behind == pytest.approx(d, rel=1e-9)
    r.dispatched(1, 6, 1002)
    assert r.expected_free(1) == pytest.approx(1.0 + idle, rel=1e-12)
    if overlapped:                                               # node 0 a little busy, node 1 idle: node 0
        r.mine[:, FREE] = (1.0 + 0.5 * d, 1.0)
        assert r.route_request(1.0, 7, 1000, np.array([10, 11]), resident) == 0


@pytest.mark.parametrize("engine, link_waste", [("batched", 1.0), ("pipelined", 0.0)])
def test_the_cluster_tells_the_router_whether_its_link_overlaps_compute(engine, link_waste):
    cfg = SimConfig(nodes=2, router="helm", engine=engine, max_batch=4, warmup_s=0.0)
    res = simulate(cfg, small(duration_s=2.0))
    assert res.cluster.router.consts[LINK_WASTE] == link_waste
    assert res.cluster.router.consts[route_kernel.OVERLAP] == 1.0 - link_waste
    forced = simulate(cfg, small(duration_s=2.0), router=Helm(link_waste=True, overlap=False)).cluster.router
    assert forced.consts[LINK_WASTE] == 1.0 and forced.consts[route_kernel.OVERLAP] == 0.0


def test_home_node_is_the_segment_mod_nodes_or_one_of_its_homes():
    """n <= S: segment mod n; n > S: segment + S k, k = user mod (n // S); none without segments,
    slack or the EMB term."""
    from helmgr.routing.kernel import HOME_SLACK, SEGMENTS, USE_EMB, home_node
    c = np.zeros(N_CONSTS)
    c[SEGMENTS], c[HOME_SLACK], c[USE_EMB] = 64, 0.002, 1.0
    assert home_node(7, 13, 8, c) == 5                  # 13 mod 8
    assert home_node(7, 63, 8, c) == 7
    assert home_node(7, 13, 64, c) == 13
    assert home_node(7, 13, 256, c) == 13 + 64 * 3      # 256 // 64 = 4 homes; user 7 mod 4 = 3
    assert home_node(8, 13, 256, c) == 13
    assert home_node(7, 13, 200, c) == 13 + 64 * 1      # 200 // 64 = 3 homes; 7 mod 3 = 1 (nodes 192-199: none)
    assert home_node(7, -1, 8, c) == -1                 # the request names no segment
    for col, value in ((SEGMENTS, 1), (HOME_SLACK, 0.0), (USE_EMB, 0.0)):
        off = c.copy()
        off[col] = value
        assert home_node(7, 13, 8, off) == -1


def homed(nodes, slack_s, segments):
    r = Helm(d=8, sample=1024, home_slack_s=slack_s)
    r.bind(len(nodes), [True] * len(nodes), np.random.default_rng(0))
    index = r.attach(nodes[0].cost, N_ITEMS, segments=segments)
    for i, node in enumerate(nodes):
        index.apply_summary(ResidencyReporter(i, node).summary(0.0))
    index.node[:, HISTORY_MISS] = 0.0
    return r, index


def test_a_new_session_goes_home_unless_home_finishes_later_by_more_than_the_slack():
    """Three alike idle nodes, segments 3: a new session of segment 2 goes to node 2, whose queue
    may hold it back by up to the slack; past the slack, or with no slack, elsewhere."""
    nodes = [warm_node(i) for i in range(3)]
    new = np.array([1000, 1001])
    slack = 1e-3
    r, _ = homed(nodes, slack, 3)
    assert all(r.route_request(1.0, 5 + k, 100, new, CANDS, segment=2) == 2 for k in range(10))
    r, _ = homed(nodes, slack, 3)
    r.mine[2, FREE] = 1.0 + 0.99 * slack
    assert r.route_request(1.0, 5, 100, new, CANDS, segment=2) == 2
    r.mine[2, FREE] = 1.0 + 1.01 * slack
    assert r.route_request(1.0, 5, 100, new, CANDS, segment=2) in (0, 1)
    r, _ = homed(nodes, 0.0, 3)
    assert {r.route_request(1.0, 5 + k, 100, new, CANDS, segment=2) for k in range(30)} == {0, 1, 2}


def test_the_default_slack_is_the_requests_service_at_home():
    """home_slack 1 (the default share): home may finish up to one service later than the
    others (0.99 of it behind: home; 1.01: elsewhere); 0: no homes."""
    nodes = [warm_node(i) for i in range(3)]
    new = np.array([1000, 1001])
    for share, behind, home in ((1.0, 0.99, True), (1.0, 1.01, False), (0.0, 0.0, None)):
        r = Helm(d=8, sample=1024, home_slack=share)
        r.bind(3, [True] * 3, np.random.default_rng(0))
        index = r.attach(nodes[0].cost, N_ITEMS, segments=3)
        for i, node in enumerate(nodes):
            index.apply_summary(ResidencyReporter(i, node).summary(0.0))
        index.node[:, HISTORY_MISS] = 0.0
        r.route_request(1.0, 5, 100, new, CANDS, segment=2)
        svc = r.last_decision.service_s                       # the three nodes price it alike (not dispatched)
        r.mine[2, FREE] = 1.0 + behind * svc
        got = [r.route_request(1.0, 6 + k, 100, new, CANDS, segment=2) for k in range(20)]
        if home is None:
            assert set(got) == {0, 1, 2}
        else:
            assert (got[0] == 2) is home


def test_the_home_slack_shrinks_with_the_load_estimate():
    """At load 0.5 the slack is half: home 0.49 x slack behind still wins, 0.51 x does not; with
    `home_by_load` off the whole slack holds."""
    from helmgr.routing.kernel import RHO
    nodes = [warm_node(i) for i in range(3)]
    new, slack = np.array([1000, 1001]), 1e-3
    for by_load, behind, home in ((True, 0.49, True), (True, 0.51, False), (False, 0.99, True)):
        r = Helm(d=8, sample=1024, home_slack_s=slack, home_by_load=by_load)
        r.bind(3, [True] * 3, np.random.default_rng(0))
        index = r.attach(nodes[0].cost, N_ITEMS, segments=3)
        for i, node in enumerate(nodes):
            index.apply_summary(ResidencyReporter(i, node).summary(0.0))
        r.consts[RHO], r._rho_t = 0.5, 1.0          # (no renewal of the estimate at t = 1)
        r.mine[2, FREE] = 1.0 + behind * slack
        assert (r.route_request(1.0, 5, 100, new, CANDS, segment=2) == 2) is home


def test_a_user_holding_a_prefix_is_not_sent_home():
    """Node 1 holds 10 tokens of user 5 (a saving far below the slack): the holder wins, as
    without homes; user 6, holding nothing, goes home."""
    nodes = [warm_node(i) for i in range(3)]
    r, index = homed(nodes, 1e-3, 3)
    index.apply_kv(KVBatch(1, 1, [(5, 10)]))
    assert r.route_request(1.0, 5, 10, np.array([1000]), CANDS, segment=2) == 1
    assert r.route_request(1.0, 6, 10, np.array([1000]), CANDS, segment=2) == 2


def test_synthetic_chunks_name_each_users_cluster_as_its_segment():
    from helmgr.workload import WorkloadSpec
    w = WorkloadSpec("steady", 2.0, 3).build()
    chunk = next(iter(w.chunks(1.0)))
    assert w.n_segments == 64
    assert np.array_equal(chunk.segment, w.users.cluster(chunk.user))
    assert chunk.segment.min() >= 0 and chunk.segment.max() < 64


def test_helm_revision_changes_with_any_default(monkeypatch):
    """Stored results are keyed by `Helm.revision()`: it must change when a constructor default or
    a class constant the decisions depend on changes, and not otherwise."""
    from helmgr.routing.helm import Helm
    base = Helm.revision()
    assert base == Helm.revision() and base.startswith("helm(d=2,") and "HOME_SLACK=1.0" in base

    class Slacker(Helm):
        HOME_SLACK = 0.5
    assert Slacker.revision() != base

    class Wider(Helm):
        def __init__(self, d: int = 3, **kw):
            super().__init__(d=d, **kw)
    assert Wider.revision() != base and "d=3" in Wider.revision()


def test_a_sampled_cluster_prices_an_id_by_its_tracked_row():
    """EMB caches tracking one id in 4: the index holds a bit per tracked row, and the router prices
    any id by its row's bit (id >> 2). A candidate beside a resident tracked id costs nothing on
    the link; one beside an absent one costs a missed row: the service differs by one miss."""
    from helmgr.routing.kernel import EMB_SHIFT
    node = Node(tiny_node_profile(), N_ITEMS, NodeConfig(ratio=0.05, emb_sample=4))
    node.emb.warm(np.linspace(1, 0, N_ITEMS // 4, dtype=np.float32))       # the hottest rows resident
    assert node.emb.n_items == N_ITEMS // 4 and node.emb.state[0] and not node.emb.state[-1]
    r = ROUTERS["helm"](d=8, sample=1024)
    r.bind(1, [True], np.random.default_rng(0))
    index = r.attach(node.cost, N_ITEMS, emb_sample=4)
    assert r.consts[EMB_SHIFT] == 2 and index.bits.shape == (1, N_ITEMS // 4 // 8)
    index.apply_summary(ResidencyReporter(0, node).summary(0.0))
    np.testing.assert_array_equal(index.resident(0, np.array([0, 1, 3, N_ITEMS - 1])), [1, 1, 1, 0])
    index.node[:, HISTORY_MISS] = 0.0
    services = []
    for cand in (5, N_ITEMS - 3):                       # rows 1 (resident) and N/4 - 1 (absent)
        r.route_request(0.0, 7, 0, np.zeros(0, np.int64), np.array([cand]))
        services.append(r.last_decision.service_s)
    assert services[1] - services[0] == pytest.approx(r.consts[MISS] + r.consts[route_kernel.PCIE_LATENCY])
