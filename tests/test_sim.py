import json
import math

import numpy as np
import pytest

from helmgr.core.errors import HelmInputError
from helmgr.sim import SimConfig, parse_fault, simulate
from helmgr.sim.bursts import peak_load
from helmgr.sim.metrics import mean_ratio, node_load_peak, p99_block_se, tail_profile, window_stats
from helmgr.policy.base import Scheduled
from helmgr.workload import default_config, synthetic_workload
from helmgr.workload.arrivals import SessionShape

SMALL = dict(n_items=100_000, n_clusters=16, n_users=50_000)


def small(regime="steady", seed=0, **kw):
    return synthetic_workload(default_config(regime, **(SMALL | dict(rps=400.0, duration_s=20.0) | kw)), seed)


def short_burst(seed=1, duration_s=60.0, **kw):
    """`small` burst traffic with one short, tall burst (seed 1: x3.84 from 37.24 s to 40.97 s)."""
    return small("burst", seed=seed, duration_s=duration_s, burst_len_s=(2.0, 6.0), burst_mult=(3.0, 5.0),
                 burst_first_s=(35.0, 40.0), **kw)


def poisson(rate, duration, seed):
    """Poisson arrivals: one request per session, ids irrelevant."""
    return synthetic_workload(default_config("steady", rps=rate, duration_s=duration, n_items=1000, n_clusters=1,
                                             candidates=1, n_users=100_000, session=SessionShape(1.0, 1.0, 1.0)), seed)


def erlang_c_wait(c: int, lam: float, mu: float) -> float:
    """Mean wait in queue of M/M/c (Erlang C)."""
    a = lam / mu
    head = sum(a**k / math.factorial(k) for k in range(c))
    tail = a**c / math.factorial(c) * c / (c - a)
    return tail / (head + tail) / (c * mu - lam)


@pytest.mark.parametrize("c,lam,mu,duration", [(1, 1000.0, 2000.0, 200.0), (4, 2800.0, 1000.0, 200.0)])
def test_queueing_matches_erlang_c(c, lam, mu, duration):
    cfg = SimConfig(nodes=c, central_queue=True, bypass_caches=True, service_mean_s=1 / mu, warmup_s=0, seed=3,
                    engine="batched", max_batch=1)                 # one request at a time: M/M/c
    rec = simulate(cfg, poisson(lam, duration, 3)).cluster.rec
    wait = np.mean(np.asarray(rec.start) - np.asarray(rec.arrival))
    assert len(rec.start) > 150_000
    assert wait == pytest.approx(erlang_c_wait(c, lam, mu), rel=0.03)


def test_same_seed_same_json():
    cfg = SimConfig(nodes=4, seed=5, warmup_s=2.0)
    a = simulate(cfg, small(seed=5)).summary
    b = simulate(cfg, small(seed=5)).summary
    a.pop("wall_s"), b.pop("wall_s")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    c = simulate(SimConfig(nodes=4, seed=6, warmup_s=2.0), small(seed=6)).summary
    assert c["p99_ms"] != a["p99_ms"]


def test_every_request_completes_and_metrics_are_sane():
    s = simulate(SimConfig(nodes=4, warmup_s=2.0), small()).summary
    assert s["completed"] == s["requests"] > 5000
    assert s["p50_ms"] <= s["p95_ms"] <= s["p99_ms"] <= s["p999_ms"]
    assert 0 < s["emb_hit_rate"] <= 1 and 0 < s["kv_hit_rate"] <= 1
    assert s["mean_ratio"] == pytest.approx(0.5, abs=1e-3)
    assert s["goodput_rps"] <= s["throughput_rps"]
    assert s["h2d_gb"] == pytest.approx(sum(s["h2d_gb_by_cause"].values()))


def test_failed_node_requests_are_rerouted_and_none_lost():
    cfg = SimConfig(nodes=4, faults=(parse_fault("2@5:12", 4),), warmup_s=0.0)
    r = simulate(cfg, small(rps=2000.0, duration_s=15.0))      # ~90 % busy: node 2 has work at 5 s
    s = r.summary
    assert s["completed"] == s["requests"]
    assert s["rerouted"] > 0
    nodes = np.asarray(r.cluster.rec.node)
    arrival = np.asarray(r.cluster.rec.arrival)
    served_while_down = (nodes == 2) & (arrival > 5.01) & (arrival < 12.0)
    assert not served_while_down.any()
    assert ((nodes == 2) & (arrival > 12.5)).any()             # back, and serving again


def test_sync_refill_stalls_the_next_window_lazy_does_not():
    """Grow EMB from 0.3 to 0.6 of a loaded node's pool at t = 8 s: sync copies ~23 GB on the
    critical path (~1 s at 24 GB/s); lazy lets misses bring rows in."""
    p99 = {}
    for mode in ("sync", "lazy"):
        cfg = SimConfig(nodes=1, ratio=0.3, refill=mode, warmup_s=0.0)
        w = synthetic_workload(default_config("steady", rps=150.0, duration_s=12.0, n_users=50_000), 0)
        r = simulate(cfg, w, policy=Scheduled([(8.0, 0.6)]))
        starts, window_p99, _, _ = window_stats(np.asarray(r.cluster.rec.arrival),
                                                np.asarray(r.cluster.rec.end) - np.asarray(r.cluster.rec.arrival),
                                                1.0, 12.0)
        p99[mode] = window_p99[8]
        if mode == "sync":
            assert r.summary["refill_blocked_s"] == pytest.approx(r.cluster.nodes[0].link.bytes_by_cause["refill"]
                                                                  / 24e9, rel=0.01)
    assert p99["sync"] > 0.5                                     # the stall is on the critical path
    assert p99["lazy"] < 0.1 * p99["sync"]


def test_window_stats_by_hand():
    arrival = np.array([0.1, 0.2, 0.5, 1.5, 2.9])
    latency = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    starts, p99, counts, (s,) = window_stats(arrival, latency, 1.0, 3.0, np.ones(5))
    assert starts.tolist() == [0.0, 1.0, 2.0] and counts.tolist() == [3, 1, 1] and s.tolist() == [3, 1, 1]
    assert p99[0] == pytest.approx(np.percentile([1, 2, 3], 99)) and p99[1] == 4.0


def test_node_load_peak_by_hand():
    # window [0, 10): node 0 busy 3 s, node 1 busy 1 s -> 3 / 2 = 1.5; [10, 20): 2 and 2 -> 1.0;
    # [20, 30) is the last, cut-short window: ignored
    node = [0, 0, 1, 0, 1, 1]
    start = np.array([1.0, 5.0, 2.0, 12.0, 13.0, 25.0])
    end = start + np.array([1.0, 2.0, 1.0, 2.0, 2.0, 9.0])
    assert node_load_peak(node, start, end, 2, 10.0) == pytest.approx(1.5)
    assert node_load_peak(node, start, end, 2, 10.0, from_s=10.0) == pytest.approx(1.0)   # only [10, 20) full


def test_tail_profile_by_hand():
    """Latencies 1..200 ms: the P99 (numpy's interpolation) is 198.01 ms, so the tail is the two
    slowest, 199 and 200 ms. Their waits 9.95 and 10 ms -> 9.975; services 189.05 and 190 ->
    189.525 ms; own fetches 4 and 6 ms -> 5, computes 100 and 120 -> 110, so behind
    189.525 - 5 - 110 = 74.525. Of the two, 199 had its 100-token prefix cached whole, 200 none
    of its 300 -> cold share 0.5, recompute (0 + 300) / 2 = 150 tokens; 200 came in a burst -> 0.5."""
    latency = np.arange(1, 201) * 1e-3
    wait = np.arange(1, 201) * 5e-5
    fetch, compute = np.zeros(200), np.zeros(200)
    fetch[198:], compute[198:] = (4e-3, 6e-3), (0.1, 0.12)
    prefix, kv, burst = np.zeros(200), np.zeros(200), np.zeros(200)
    prefix[198], kv[198], prefix[199], burst[199] = 100, 100, 300, 1
    got = tail_profile(latency, wait, fetch, compute, prefix, kv, burst, np.percentile(latency, 99))
    assert got == pytest.approx({"tail_wait_ms": 9.975, "tail_service_ms": 189.525, "tail_fetch_ms": 5.0,
                                 "tail_behind_ms": 74.525, "tail_compute_ms": 110.0, "tail_cold_share": 0.5,
                                 "tail_recompute_tokens": 150.0, "tail_burst_share": 0.5})
    none = np.zeros(0)
    assert all(np.isnan(v) for v in tail_profile(*[none] * 7, float("nan")).values())


@pytest.mark.parametrize("engine", ["batched", "pipelined"])
def test_each_requests_service_splits_into_fetch_behind_and_compute(engine):
    """Every request: its fetch ends no later than its launch, its launch no later than its end;
    the requests of one batch share its launch and end."""
    res = simulate(SimConfig(nodes=2, engine=engine, max_batch=4, warmup_s=0.0), small(duration_s=3.0))
    rec = res.cluster.rec
    start, end, fetch, launch = (np.asarray(x) for x in (rec.start, rec.end, rec.fetch, rec.launch))
    assert len(launch) == len(end) > 1000
    assert np.all(start + fetch <= launch + 1e-12) and np.all(launch < end)
    order = np.lexsort((end, np.asarray(rec.node)))          # a batch: one launch, one end
    same = np.diff(end[order]) == 0
    assert same.any() and np.all(np.diff(launch[order])[same] == 0)
    s = res.summary
    assert s["tail_fetch_ms"] + s["tail_behind_ms"] + s["tail_compute_ms"] == pytest.approx(s["tail_service_ms"])


def test_mean_ratio_is_time_weighted():
    # node 0 at 0.2 for 10 s then 0.6 for 10 s; node 1 at 0.4 for 20 s -> (2 + 6 + 8) / 40
    timeline = [(0.0, 0, 0.2), (0.0, 1, 0.4), (10.0, 0, 0.6)]
    assert mean_ratio(timeline, 2, 20.0) == pytest.approx(0.4)
    # node 1 down from 5 s: its time after that does not count -> (2 + 6 + 2) / 25
    assert mean_ratio(timeline + [(5.0, 1, None)], 2, 20.0) == pytest.approx(0.4)


@pytest.mark.parametrize("text,msg", [("2@", "not of the form"), ("x@1", "not of the form"),
                                      ("9@1", "node 9 does not exist"), ("1@5:3", "not after")])
def test_bad_faults(text, msg):
    with pytest.raises(HelmInputError, match=msg):
        parse_fault(text, 4)


def test_bad_config():
    with pytest.raises(HelmInputError, match="nodes must be >= 1"):
        SimConfig(nodes=0).validate()
    with pytest.raises(HelmInputError, match="fault on node 5"):
        SimConfig(nodes=2, faults=(parse_fault("5@1"),)).validate()


def test_all_nodes_down_is_a_named_error():
    with pytest.raises(HelmInputError, match="every node is down"):
        simulate(SimConfig(nodes=1, faults=(parse_fault("0@2"),)), small(duration_s=5.0))


def test_window_ratios_and_oracle_distance_by_hand():
    from helmgr.sim.metrics import oracle_distance, window_ratios
    # node 0: 0.2 until 1.5 s then 0.6; node 1: 0.4 throughout; node 1 down from 2.0 s
    timeline = [(0.0, 0, 0.2), (0.0, 1, 0.4), (1.5, 0, 0.6), (2.0, 1, None)]
    r = window_ratios(timeline, 2, 3.0)
    np.testing.assert_allclose(r, [0.3, 0.4, 0.6])             # window 1: (0.2 + 0.6) / 2 and 0.4
    assert oracle_distance(timeline, 2, 3.0, np.array([0.3, 0.5, 0.5])) == pytest.approx((0 + 0.1 + 0.1) / 3)


def test_a_node_window_carries_every_counter_by_name():
    from helmgr.core.window import NodeCounters, NodeWindow, node_window
    delta = NodeCounters(*range(1, len(NodeCounters._fields) + 1))
    w = node_window(3, 2.0, 1.0, 0.4, 7, [0.01, 0.02, 0.09], 2, delta, ([0.001, 0.0, 0.05], [0.0, 0.01, 0.02]))
    assert all(getattr(w, f) == getattr(delta, f) for f in NodeCounters._fields)
    assert (w.node, w.arrivals, w.completed, w.queue_len) == (3, 7, 3, 2)
    assert w.p99_s == pytest.approx(np.percentile([0.01, 0.02, 0.09], 99))
    assert (w.tail_fetch_s, w.tail_recompute_s) == (0.05, 0.02)     # only the slowest is at or above P99
    assert set(NodeCounters._fields) < {f for f in NodeWindow.__dataclass_fields__}


def test_peak_load_by_hand():
    t = [1.0, 2.0, 3.0, 4.0]
    loads = [[0.2, 0.4], [0.6, float("nan")], [1.0, 0.8], [0.1, 0.1]]     # node 1 down in window 2
    # per window: 0.3, 0.6, 0.9, 0.1; the busiest two in a row: (0.6 + 0.9) / 2
    assert peak_load(t, loads, 0.0, span=2) == pytest.approx(0.75)
    assert peak_load(t, loads, 2.5, span=10) == pytest.approx(0.5)            # windows after 2.5 s only
    assert math.isnan(peak_load(t, loads, 9.0)) and math.isnan(peak_load([], []))

    # laid out by window: the one closing at t covers [t - 1, t); 3.5 s is no window's end
    from helmgr.sim.bursts import window_load_series
    got = window_load_series([1.0, 2.0, 4.0, 9.0], [loads[0], loads[1], loads[3], loads[2]], 1.0, 5)
    assert got[:2] == pytest.approx([0.3, 0.6]) and math.isnan(got[2]) and got[3] == pytest.approx(0.1)
    assert math.isnan(got[4]) and np.isnan(window_load_series([], [], 1.0, 3)).all()


def test_overload_is_marked():
    light = simulate(SimConfig(nodes=4, seed=1, warmup_s=2.0), small(duration_s=10.0)).summary
    assert not light["overloaded"] and light["backlog_s"] < 0.1 and 0 < light["peak_utilization"] < 1
    heavy = simulate(SimConfig(nodes=1, seed=1, warmup_s=2.0), small(duration_s=10.0, rps=3000.0)).summary
    assert heavy["overloaded"] and heavy["backlog_s"] > 1.0


def test_window_ratios_take_the_last_of_same_instant_changes():
    # node 0 starts at 0.8 and is resized to 0.3 at the same instant: 0.3 holds, whatever the values
    timeline = [(0.0, 0, 0.8), (0.0, 0, 0.3), (1.0, 0, 0.6)]
    from helmgr.sim.metrics import window_ratios
    assert window_ratios(timeline, 1, 2.0) == pytest.approx([0.3, 0.6])


def test_a_bursts_worst_window_counts_only_busy_windows_it_overlaps():
    """1-s windows P99 5, 25, 8, 30, 3 ms, the fourth idle: a burst over 0.5-2.0 s sees windows 0-1
    (worst 25), one over 3.0-4.0 s only the idle one (NaN, never violated), one over 2.0-4.5 s
    windows 2 and 4 (worst 8)."""
    from helmgr.sim.bursts import burst_worst
    from helmgr.workload.arrivals import Burst
    p99 = np.array([5.0, 25.0, 8.0, 30.0, 3.0])
    busy = np.array([True, True, True, False, True])
    worst = burst_worst(p99, busy, [Burst(0.5, 2.0, 2.0, 0), Burst(3.0, 4.0, 2.0, 0), Burst(2.0, 4.5, 2.0, 0)], 1.0)
    assert worst[0] == 25.0 and math.isnan(worst[1]) and worst[2] == 8.0


def test_burst_peaks_and_the_provisioned_bursts_by_hand():
    """Window loads 0.5, 0.9, 0.7, NaN, 0.95: a burst over 0.5-2.0 s peaks at the mean of windows
    0-1 (0.7, fewer than ten windows: all of them), one over 3.0-4.0 s has no load (None), one over
    2.0-5.0 s at the mean of windows 2 and 4 (0.825). With a 20-ms SLO and worst window P99s of 25,
    None and 15 ms, the reference run's peaks make the first and third provisioned (<= 0.85): one
    of the two is violated; counted over every burst with a P99, one of two as well."""
    from helmgr.sim.bursts import burst_peaks, provisioned, violation_share
    from helmgr.workload.arrivals import Burst
    loads = np.array([0.5, 0.9, 0.7, np.nan, 0.95])
    bursts = [Burst(0.5, 2.0, 2.0, 0), Burst(3.0, 4.0, 2.0, 0), Burst(2.0, 5.0, 2.0, 0)]
    peaks = burst_peaks(loads, bursts, 1.0)
    assert peaks == pytest.approx([0.7, None, 0.825]) and peaks[1] is None
    keep = provisioned({"burst_peak_utilization": peaks})
    assert keep == [True, False, True]
    run = {"slo_ms": 20.0, "burst_worst_p99_ms": [25.0, None, 15.0]}
    assert violation_share(run, keep) == 0.5 and violation_share(run) == 0.5
    assert violation_share(run, [False, True, False]) is None
    assert provisioned({"burst_peak_utilization": [0.86, 0.85]}) == [False, True]


def test_a_column_keeps_values_appended_and_extended_in_order():
    import pickle
    from helmgr.sim.metrics import Column
    c = Column(np.int64)
    buf = np.array([[5, 50], [6, 60]])
    c.append(1)
    c.append(2)
    c.extend(buf[:, 0])                 # a strided view of a buffer the engine reuses
    buf[:] = -1
    c.append(3)
    assert len(c) == 5 and list(c) == [1, 2, 5, 6, 3]
    a = np.asarray(c)
    assert a.dtype == np.int64 and a.tolist() == [1, 2, 5, 6, 3] and not a.flags.writeable
    assert np.asarray(c, float).dtype == np.float64 and np.sum(c) == 17
    c.extend(np.array([7.0]))            # cast to the column's type
    assert np.asarray(c).tolist() == [1, 2, 5, 6, 3, 7]
    back = pickle.loads(pickle.dumps(c))
    back.append(8)
    assert list(back) == [1, 2, 5, 6, 3, 7, 8] and len(c) == 6
    assert len(Column(float)) == 0 and np.asarray(Column(float)).shape == (0,)


def test_the_window_p99_is_numpys_percentile_bit_for_bit():
    from helmgr.core.window import p99
    assert p99([]) is None and p99([0.004]) == 0.004
    assert p99([1.0, 3.0]) == 1.0 + 2.0 * 0.99                     # index 0.99: below the midpoint
    assert p99(np.arange(51.0)) == 50.0 - 1.0 * (1.0 - 0.5)         # index 49.5: numpy's upper form
    assert p99(np.arange(101.0)) == 99.0                            # index 99 exactly
    rng = np.random.default_rng(3)
    for n in list(range(1, 300)) + [997, 1000, 4321]:
        for a in (rng.exponential(1e-3, n), np.round(rng.exponential(1e-3, n), 4), rng.lognormal(-6, 2, n)):
            assert p99(a) == float(np.percentile(a, 99)) and p99(a.tolist()) == p99(a)


def test_p99_block_se_by_hand():
    """Three 10-s blocks of 100, 50 and 30 requests at 1, 2 and 3 ms (unequal sizes: a resample's
    blocks must be read at their own offsets). Each block holds over 1 % of any resample, so a
    resample's P99 is the largest value among its three blocks: 1 with probability 1/27, 2 with
    7/27, 3 with 19/27, a standard deviation of sqrt(200/27 - (72/27)^2) = 0.5443. Identical
    blocks give 0."""
    t = np.concatenate([np.linspace(0, 9.9, 100), np.linspace(10, 19.9, 50), np.linspace(20, 29.9, 30)])
    x = np.concatenate([np.full(100, 1.0), np.full(50, 2.0), np.full(30, 3.0)])
    se = p99_block_se(t, x, block_s=10.0, reps=4000, seed=1)
    assert abs(se - np.sqrt(200 / 27 - (72 / 27) ** 2)) < 0.02
    same = np.tile(np.arange(1.0, 51.0), 3)
    assert p99_block_se(t[:150], same, block_s=10.0, reps=50) == 0.0
    assert np.isnan(p99_block_se([], [])) and np.isnan(p99_block_se(t[:100], x[:100], block_s=10.0))

