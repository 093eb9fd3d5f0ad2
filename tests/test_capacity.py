"""Capacity at SLO: the bisection on hand-built probes, and on the simulator."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from helmgr.core.errors import HelmInputError
from helmgr.experiments.capacity import Bracket, Probe, bisect_rate, capacity, capacity_tasks, summarize_capacity
from helmgr.sim import SimConfig
from helmgr.workload import WorkloadSpec

MU, SLO_S = 1000.0, 0.020                      # service rate (1/s) and SLO of the hand-built node
KNOWN = MU - math.log(100) / SLO_S             # M/M/1 sojourn ~ Exp(mu - lambda): P99 = ln 100 / (mu - lambda)


def mm1_probe(windows: int = 1, per_window: int = 2_000_000, seed: int = 7):
    """An M/M/1 node simulated by Lindley's recursion (vectorized: W_n = X_n - min_k<=n X_k), its
    sojourn times cut into `windows` windows; a rate passes when >= 95 % of windows meet the SLO.
    One window of 2M requests: its P99 is within ~1 % of ln 100 / (mu - lambda) (windows of 200k
    near rho = 0.77 spread +-7 %: busy periods are long)."""
    def probe(rate: float) -> Probe:
        rng = np.random.default_rng(seed)
        n = windows * per_window
        gaps = rng.exponential(1 / rate, n)
        service = rng.exponential(1 / MU, n)
        x = np.concatenate([[0.0], np.cumsum(service[:-1] - gaps[1:])])
        wait = x - np.minimum.accumulate(np.minimum(x, 0.0))
        sojourn = (wait + service).reshape(windows, per_window)
        p99 = np.quantile(sojourn, 0.99, axis=1)
        sat = float(np.mean(p99 <= SLO_S))
        return Probe(rate, sat >= 0.95, sat)
    return probe


def test_lindley_matches_a_loop():
    rng = np.random.default_rng(1)
    gaps, service = rng.exponential(1 / 800, 50), rng.exponential(1 / MU, 50)
    w = [0.0]
    for i in range(1, 50):
        w.append(max(0.0, w[-1] + service[i - 1] - gaps[i]))
    x = np.concatenate([[0.0], np.cumsum(service[:-1] - gaps[1:])])
    assert np.allclose(x - np.minimum.accumulate(np.minimum(x, 0.0)), w)


def test_bisection_finds_mm1_capacity_within_2_percent():
    b = bisect_rate(mm1_probe(), start=100.0)
    assert abs(b.capacity / KNOWN - 1) <= 0.02                  # KNOWN = 769.74 req/s
    assert b.fails_at / b.capacity - 1 <= 0.02
    assert b.capacity <= KNOWN <= b.fails_at                     # measured: [766.1, 774.4], 10 probes
    passed = {p.rate: p.passed for p in b.probes}
    assert passed[b.capacity] and not passed[b.fails_at]
    assert [p.rate for p in b.probes[:4]] == [100.0, 200.0, 400.0, 800.0]   # doubles until 800 fails


def test_bisection_halves_from_above_and_keeps_every_probe_in_order():
    threshold = 333.0
    b = bisect_rate(lambda r: Probe(r, r <= threshold), start=1000.0, tol=0.01)
    rates = [p.rate for p in b.probes]
    assert rates[:3] == [1000.0, 500.0, 250.0]
    assert b.capacity <= threshold < b.fails_at and b.fails_at / b.capacity - 1 <= 0.01
    # geometric midpoints: from [250, 500], the bracket halves in log space: 1 + 6 + 1 probes
    assert len(rates) == 3 + math.ceil(math.log2(math.log(2) / math.log(1.01)))


def test_bisection_limits():
    nothing = bisect_rate(lambda r: Probe(r, False), start=10.0, floor=1.0)
    assert nothing.capacity is None and nothing.fails_at == 1.0
    everything = bisect_rate(lambda r: Probe(r, True), start=10.0, ceiling=100.0)
    assert everything.fails_at is None and everything.capacity == 100.0
    with pytest.raises(ValueError):
        bisect_rate(lambda r: Probe(r, True), start=0.0)


def test_a_search_probes_no_higher_than_the_limits_allow(monkeypatch):
    """A cluster that passes every rate: the doubling stops at the highest rate whose run stays
    within the request and memory limits (by hand below), or at CEILING with --allow-large."""
    from helmgr.core.validate import max_rate
    from helmgr.experiments import capacity as cap
    # 20e6 requests / 10 s; memory: (16 GiB - 2,000 nodes x 8 MiB) / 400 B a request / 10 s
    assert max_rate(10.0, 2) == 2e6
    assert max_rate(10.0, 2000) == pytest.approx((16 * 2**30 - 2000 * 2**23) / 400 / 10)
    monkeypatch.setattr(cap, "run_probe", lambda spec, cfg, rate, target: Probe(rate, True))
    task = cap.CapacityTask(WorkloadSpec("steady", 10.0), SimConfig(nodes=2), 1300.0)
    b = cap.bisect_task(task)
    assert b.capacity == 2e6 and b.fails_at is None and max(p.rate for p in b.probes) == 2e6
    assert b.to_dict()["ceiling_rps"] == 2e6                             # capped, and the JSON says where
    lifted = cap.bisect_task(replace(task, allow_large=True))
    assert lifted.capacity == cap.CEILING == 1e7 == lifted.to_dict()["ceiling_rps"]


def test_capacity_is_the_lowest_seed():
    a = Bracket(500.0, 510.0, ())
    b = Bracket(480.0, 489.0, ())
    assert summarize_capacity([a, b], [1, 2])["capacity_rps"] == 480.0
    assert summarize_capacity([a, Bracket(None, 1.0, ())], [1, 2])["capacity_rps"] is None


def test_capacity_refuses_a_trace_and_bad_targets():
    cfg = SimConfig(nodes=2)
    with pytest.raises(HelmInputError, match="trace"):
        capacity_tasks(WorkloadSpec(trace="x.txt"), cfg, [1])
    with pytest.raises(HelmInputError, match="target"):
        capacity_tasks(WorkloadSpec(), cfg, [1], target=1.5)


def test_capacity_on_the_simulator_is_where_the_slo_breaks():
    """A small cluster: the capacity passes, the rate 2 % above it fails, both measured."""
    spec = WorkloadSpec("steady", duration_s=8.0, rps=300.0)
    cfg = SimConfig(nodes=2, slo_ms=20.0, warmup_s=2.0, engine="pipelined", max_batch=8)
    out = capacity(spec, cfg, seeds=[1], tol=0.05)
    seed = out["seeds"]["1"]
    probes = {p["rate"]: p for p in seed["probes"]}
    assert out["capacity_rps"] == seed["capacity_rps"]
    assert probes[seed["capacity_rps"]]["satisfaction"] >= 0.95
    failed = probes[seed["fails_at_rps"]]
    assert failed["satisfaction"] < 0.95 or failed["overloaded"]
    assert seed["fails_at_rps"] / seed["capacity_rps"] - 1 <= 0.05


class _Rec:
    def __init__(self, t, queues):
        self.window_t, self.window_queues = t, queues


class _Cluster:
    def __init__(self, t, queues):
        self.rec = _Rec(t, queues)


def test_backlogged_stops_after_more_failed_windows_than_the_target_allows():
    from helmgr.experiments.capacity import backlogged
    cfg = SimConfig(nodes=2, warmup_s=15.0)
    check = backlogged(cfg, duration_s=60.0, rate=100.0)     # 45 windows after the warm-up: 2 may fail
    t = [float(k) for k in range(1, 21)]
    big, small = [60, 50], [40, 40]                          # 110 > 100 x 1 s queued; 80 is not
    assert check(_Cluster(t, [small] * 17 + [big] * 3)) == (
        "stopped at 20 s: 3 windows in a row ended with over 1 s of arrivals queued")
    assert check(_Cluster(t, [small] * 18 + [big] * 2)) is None      # two: still within the 5 %
    assert check(_Cluster(t, [big] * 16 + [small] + [big] * 3)) is not None
    assert check(_Cluster(t[:15], [big] * 15)) is None               # the warm-up's windows do not count


def test_a_probe_far_above_capacity_is_stopped_early():
    from helmgr.experiments.capacity import run_probe
    cfg = SimConfig(nodes=2, slo_ms=20.0, engine="pipelined", max_batch=8)
    p = run_probe(WorkloadSpec("steady", duration_s=60.0, seed=1), cfg, 2000.0)
    assert not p.passed and p.overloaded and p.satisfaction is None
    assert p.stopped.startswith("stopped at 18 s: 3 windows in a row")


def test_capacity_json_names_the_helm_it_measured(capsys):
    """`helmgr capacity --json` of full HELM carries `showcase.stack_revision()` (which HELM the
    figure is of, what the main job's stored headroom is checked against); of anything else, None."""
    import json

    from helmgr.cli import main
    from helmgr.experiments.showcase import stack_revision
    small = ["capacity", "--duration", "2", "--nodes", "2", "--seeds", "1", "--tol", "0.5", "--jobs", "1", "--json"]
    for policy, router, revision in (("helm", "helm", stack_revision()), ("static", "helm", None)):
        assert main(small + ["--policy", policy, "--router", router]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["helm_revision"] == revision and out["class_table"] is None and out["tenancy"] is None
    assert main(small + ["--classes", "surfaces"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["class_table"], out["tenancy"]) == ("class table 'surfaces'", "helm")     # helm: the default


def test_with_classes_every_class_must_keep_its_target():
    from helmgr.core.classes import ClassTable, SloClass, Tenant
    from helmgr.experiments.capacity import satisfaction
    nan = float("nan")
    s = {"window_slo_satisfaction": 0.99, "classes": {"a": {"window_slo_satisfaction": 0.97, "requests": 5},
                                                      "b": {"window_slo_satisfaction": 0.90, "requests": 5}}}
    assert satisfaction(s) == (0.90, "b")
    s["classes"]["a"]["window_slo_satisfaction"] = nan               # a class with no window: it fails
    assert satisfaction(s)[1] == "a"
    s["classes"]["a"]["requests"] = 0                                # ... unless it had no request at all
    assert satisfaction(s) == (0.90, "b")
    assert satisfaction({"window_slo_satisfaction": 0.5}) == (0.5, None)
    # one class whose target is the run's SLO: the same bisection as without a table
    spec = WorkloadSpec("steady", duration_s=4.0, rps=300.0)
    cfg = SimConfig(nodes=2, slo_ms=20.0, warmup_s=1.0)
    one = ClassTable((SloClass("all", 20.0),), (Tenant("everyone", "all", 1.0),))
    plain = capacity(spec, cfg, seeds=[1], tol=0.3)
    classed = capacity(spec, replace(cfg, classes=one), seeds=[1], tol=0.3)
    assert classed["capacity_rps"] == plain["capacity_rps"]
    assert [p["rate"] for p in classed["seeds"]["1"]["probes"]] == [p["rate"] for p in plain["seeds"]["1"]["probes"]]
    assert {p["worst_class"] for p in classed["seeds"]["1"]["probes"] if p["satisfaction"] is not None} == {"all"}
    for p in classed["seeds"]["1"]["probes"]:                      # each class's own figure, here the one
        assert p["classes"] == ({"all": p["satisfaction"]} if p["satisfaction"] is not None else None)
    assert all(p["classes"] is None for p in plain["seeds"]["1"]["probes"])
    tighter = capacity(spec, replace(cfg, classes=ClassTable((SloClass("all", 17.0),), one.tenants)), seeds=[1],
                       tol=0.3)
    assert tighter["capacity_rps"] < plain["capacity_rps"]


def test_a_probe_or_bracket_kept_before_a_field_was_added_reads_back_with_its_default():
    import pickle
    from dataclasses import astuple
    from helmgr.experiments.capacity import CEILING, Probe
    p = Probe(100.0, True, 0.99, 0.5, False, 12.0, worst_class="feed", classes={"feed": 0.99})
    assert pickle.loads(pickle.dumps(p)) == p
    old = Probe.__new__(Probe)
    old.__setstate__(list(astuple(p))[:-1])           # what an evaluation kept before `classes`
    assert old == Probe(100.0, True, 0.99, 0.5, False, 12.0, worst_class="feed")
    b = Bracket(100.0, 200.0, (p,), ceiling=1e4)
    assert pickle.loads(pickle.dumps(b)) == b
    kept = Bracket.__new__(Bracket)
    kept.__setstate__([100.0, 200.0, (p,)])            # ... and a bracket kept before `ceiling`
    assert kept.to_dict()["ceiling_rps"] == CEILING
