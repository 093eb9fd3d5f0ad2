"""SLO classes and tenants: the class table, the tenant draw, and the figures per class and tenant."""
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from helmgr.cli import main
from helmgr.core.classes import ClassTable, SloClass, Tenant, load_table, parse_table
from helmgr.core.errors import HelmInputError
from helmgr.policy.base import MemoryPolicy
from helmgr.sim import SimConfig, simulate
from helmgr.sim.config import parse_fault
from helmgr.sim.class_metrics import (client_figures, fair_shares, group_figures, jain, max_service_gap,
                                      normalised_service)
from helmgr.workload.arrivals import Burst
from tests.test_sim import short_burst, small

TWO = {"classes": {"tight": {"slo_ms": 10.0}, "loose": {"slo_ms": 100.0, "band": 1, "sheddable": True,
                                                         "min_share": 0.1}},
       "tenants": {"a": {"class": "tight", "share": 0.7}, "b": {"class": "loose", "share": 0.2},
                   "noisy": {"class": "loose", "share": 0.1, "bursts": True}}}


def with_(path: str, value) -> dict:
    """TWO with one value replaced (`path` as "tenants.a.share"; None deletes it)."""
    data = json.loads(json.dumps(TWO))
    *head, last = path.split(".")
    d = data
    for k in head:
        d = d[k]
    if value is None:
        del d[last]
    else:
        d[last] = value
    return data


def test_the_shipped_table_loads():
    t = load_table("surfaces")
    assert t.class_names == ["feed", "interactive", "refresh"]
    assert [x.name for x in t.tenants if x.bursts] == ["trending"]
    assert sum(x.share for x in t.tenants) == pytest.approx(1.0)
    assert t.classes[0] == SloClass("feed", 15.0, 0)
    assert t.tenant_class.tolist() == [0, 1, 1, 1, 2]


def test_shares_above_1_within_the_tolerance_are_scaled_to_sum_to_1():
    t = parse_table(with_("tenants.a.share", 0.7000005), "t")
    assert sum(x.share for x in t.tenants) == pytest.approx(1.0, abs=1e-15) and t.tenants[1].share < 0.2


def test_parse_keeps_every_field():
    t = parse_table(TWO, "t")
    assert t.classes[1] == SloClass("loose", 100.0, band=1, weight=1.0, sheddable=True, min_share=0.1)
    assert t.tenants[2] == Tenant("noisy", "loose", 0.1, bursts=True)


@pytest.mark.parametrize("data,needle", [
    (with_("tenants.a.share", 0.6), "shares sum to 0.9, not 1"),
    (with_("tenants.a.class", "gold"), "tenant 'a' names unknown class 'gold'"),
    (with_("tenants.a.class", None), "tenant 'a' needs class"),
    (with_("classes.tight.band", -1), "band"),
    (with_("classes.tight.band", 1.5), "band"),
    (with_("classes.tight.band", 16), "band must be in [0, 15], got 16"),
    (with_("classes.loose.weight", 0.001), "weight must be in [0.01, 100], got 0.001"),
    ({**TWO, "classes": TWO["classes"] | {"third": {"slo_ms": 200.0, "band": 2, "min_share": 0.95}}},
     "the lower bands' min_share (each band's largest) sum to 1.05, which must stay below 1"),
    (with_("tenants.a.class", 3), "tenant 'a': class must be a non-empty string, got 3"),
    (with_("classes.tight.slo_ms", 0.0), "slo_ms"),
    (with_("classes.loose.min_share", 1.0), "min_share"),
    (with_("classes.loose.kv_floor", 1.0), "kv_floor"),
    ({**TWO, "classes": {"tight": {"slo_ms": 10.0, "kv_floor": 0.5}, "loose": {"slo_ms": 9.0, "kv_floor": 0.5}}},
     "classes' kv_floor sum to 1, which must stay below 1"),
    (with_("classes.loose.sheddable", "yes"), "sheddable must be true or false, got 'yes'"),
    (with_("classes.tight.target", 3), "unknown ['target']"),
    (with_("classes.tight.name", "x"), "unknown ['name']"),
    (with_("tenants.a.share", True), "share"),
    (with_("tenants", None), "needs at least one [tenants.NAME] table"),
    (with_("classes", {}), "needs at least one [classes.NAME] table"),
    (TWO | {"extra": {}}, "unknown table(s) ['extra']"),
])
def test_bad_tables_are_refused_by_name(data, needle):
    with pytest.raises(HelmInputError) as e:
        parse_table(data, "t.toml")
    assert needle in str(e.value) and str(e.value).startswith("t.toml")


def test_bad_files_are_refused_by_name(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[classes.a\n")
    for name, needle in ((str(bad), "is not valid TOML"), (str(tmp_path / "no.toml"), "does not exist"),
                         ("gold", "unknown class table 'gold' (known: surfaces)")):
        with pytest.raises(HelmInputError, match=None) as e:
            load_table(name)
        assert needle in str(e.value)


def test_each_user_is_one_tenant_by_share_and_bursts_go_to_the_noisy_one():
    t = parse_table(TWO, "t")
    rng = np.random.default_rng(0)
    user = rng.integers(0, 50_000, 200_000)            # many requests per user
    burst = np.zeros(len(user), bool)
    burst[::7] = True
    a = t.assign(user, burst, seed=3)
    base = np.bincount(a[~burst], minlength=3) / np.count_nonzero(~burst)
    assert base == pytest.approx([0.7, 0.2, 0.1], abs=0.01)
    assert (a[burst] == 2).all()
    calm = ~burst
    first = {}
    for u, x in zip(user[calm].tolist(), a[calm].tolist()):
        assert first.setdefault(u, x) == x              # one tenant per user
    # drawn in two pieces or at once: the same tenants; another seed: others
    assert (np.r_[t.assign(user[:1000], burst[:1000], 3), t.assign(user[1000:], burst[1000:], 3)] == a).all()
    assert (t.assign(user, burst, 4) != a).mean() > 0.3


def test_without_a_noisy_tenant_bursts_are_drawn_like_the_rest():
    t = parse_table(with_("tenants.noisy.bursts", False), "t")
    burst = np.ones(100_000, bool)
    assert np.bincount(t.assign(np.arange(100_000), burst, 0), minlength=3) / 1e5 == pytest.approx(
        [0.7, 0.2, 0.1], abs=0.005)


def test_group_figures_by_hand():
    # four windows of 1 s; warm-up 1 s drops the first request; target 10 ms
    arrival = np.array([0.5, 1.2, 1.4, 2.5, 3.1, 3.2])
    latency = np.array([0.050, 0.004, 0.020, 0.008, 0.006, 0.002])
    f = group_figures(7, arrival, latency, 10.0, duration=4.0, window_s=1.0, warmup_s=1.0)
    assert f["requests"] == 7 and f["completed"] == 6 and f["shed"] == 0 and f["slo_ms"] == 10.0
    assert f["p50_ms"] == pytest.approx(6.0)                        # median of 4, 20, 8, 6, 2 ms
    assert f["slo_attainment"] == pytest.approx(4 / 5)             # 20 ms misses
    assert f["goodput_rps"] == pytest.approx(4 / 3.0)              # 4 good over the 3 s after the warm-up
    assert f["window_slo_satisfaction"] == pytest.approx(2 / 3)    # window 1 holds the 20-ms one
    prefix, kv = np.array([10, 10, 0, 20, 10, 0]), np.array([10, 5, 0, 5, 0, 0])
    f = group_figures(7, arrival, latency, 10.0, 4.0, 1.0, 1.0, prefix=prefix, kv=kv)
    assert f["kv_hit_rate"] == pytest.approx(10 / 40)              # the warm-up's 10 of 10 dropped
    ids, misses = np.array([9, 10, 10, 20, 0, 10]), np.array([9, 1, 4, 5, 0, 0])
    f = group_figures(7, arrival, latency, 10.0, 4.0, 1.0, 1.0, ids=ids, misses=misses)
    assert f["emb_hit_rate"] == pytest.approx(1 - 10 / 50)         # the warm-up's 9 of 9 missed dropped
    assert "burst_window_slo_satisfaction" not in f                  # no bursts: not reported
    f = group_figures(7, arrival, latency, 10.0, 4.0, 1.0, 1.0, bursts=[Burst(1.5, 2.2, 3.0, 0)])
    assert f["burst_window_slo_satisfaction"] == pytest.approx(1 / 2)   # windows 1 (missed) and 2 (met)
    f = group_figures(7, arrival, latency, 10.0, 4.0, 1.0, 1.0, bursts=[Burst(0.2, 0.8, 3.0, 0)])
    assert math.isnan(f["burst_window_slo_satisfaction"]) and set(f["nulls"]) == {"burst_window_slo_satisfaction"}
    empty = group_figures(0, np.zeros(0), np.zeros(0), 10.0, 4.0, 1.0, 1.0)
    assert math.isnan(empty["p99_ms"]) and set(empty["nulls"]) == {"p50_ms", "p99_ms", "slo_attainment",
                                                                    "window_slo_satisfaction"}


def test_jain():
    assert jain(np.array([0.5, 0.5, 0.5])) == pytest.approx(1.0)
    assert jain(np.array([1.0, 0.0, 0.0])) == pytest.approx(1 / 3)
    assert jain(np.array([1.0, 0.5])) == pytest.approx(1.5 ** 2 / (2 * 1.25))
    assert math.isnan(jain(np.zeros(0)))


def test_fair_shares_by_hand():
    one = np.ones(2)
    assert fair_shares(np.array([10.0]), np.array([[2.0], [10.0]]), one).ravel().tolist() == [2.0, 8.0]
    assert fair_shares(np.array([8.0]), np.array([[10.0], [10.0]]), np.array([1.0, 3.0])).ravel().tolist() == [2.0, 6.0]
    three = fair_shares(np.array([9.0]), np.array([[1.0], [5.0], [10.0]]), np.ones(3))
    assert three.ravel().tolist() == [1.0, 4.0, 4.0]
    # windows settle after different numbers of passes: each still gets its own level
    got = fair_shares(np.array([5.0, 3.0, 0.0]), np.array([[5.0, 5.0, 0.0], [1.0, 5.0, 2.0]]), one)
    assert got.tolist() == [[4.0, 1.5, 0.0], [1.0, 1.5, 0.0]]


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 4)), min_size=1, max_size=6), st.integers(0, 300))
def test_fair_shares_are_max_min_fair(tenants, cap):
    demand = np.array([[float(d)] for d, _ in tenants])
    weight = np.array([float(w) for _, w in tenants])
    cap = min(float(cap), demand.sum())
    share = fair_shares(np.array([cap]), demand, weight).ravel()
    assert share.sum() == pytest.approx(cap) and (share <= demand.ravel() + 1e-9).all()
    short = share < demand.ravel() - 1e-9                  # capped: no one with demand left holds more per weight
    if short.any():
        level = (share / weight)[short]
        assert np.allclose(level, level[0]) and ((share / weight)[~short] <= level[0] + 1e-9).all()


def test_normalised_service_by_hand():
    # band 0: a and b (weight 1 each); band 1: c alone; band 2: d, with nothing. Work 1 per request.
    # window [0, 1): a's first is served; b's two arrive and wait (demand from the next window's
    # start). [1, 2): b has 2 waiting, a 3 arriving and served there: the band served 4, fair 2
    # and 2, a got 3 and b 1. [2, 3): b's last, fair. a: 4 served of 3 fair; b: 2 of 3.
    band, weight = np.array([0, 0, 1, 2]), np.ones(4)
    tenant = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    arrival = np.array([0.1, 1.1, 1.2, 1.3, 0.5, 0.6, 0.3, 2.1])
    served = np.array([0.2, 1.2, 1.3, 1.4, 2.5, 1.9, 1.5, 2.2])
    x = normalised_service(tenant, arrival, served, np.ones(8), band, weight, 1.0, 0.0, 3.0)
    assert x[:3].tolist() == pytest.approx([4 / 3, 2 / 3, 1.0]) and math.isnan(x[3])
    assert jain(x[:3]) == pytest.approx((4 / 3 + 2 / 3 + 1) ** 2 / (3 * (16 / 9 + 4 / 9 + 1)))
    # from 1 s (a warm-up): b's two waiting since 0.5 and 0.6 are demand in [1, 2); [0, 1) is not counted
    x = normalised_service(tenant, arrival, served, np.ones(8), band, weight, 1.0, 1.0, 3.0)
    assert x[:2].tolist() == pytest.approx([3 / 2, 2 / 3])
    # work, not requests: b's requests of 3 tokens each; in [1, 2) the band served 6, fair 3 and 3: b got its 3
    work = np.array([1, 1, 1, 1, 3, 3, 1, 1.0])
    assert normalised_service(tenant, arrival, served, work, band, weight, 1.0, 0.0, 3.0)[:2].tolist() == [1.0, 1.0]
    # a request arriving after its band mate was served is not owed that service: a's at 0.9,
    # started at 1.05; b's at 0.1 (served 0.2) and 1.5 (served 1.6)
    x = normalised_service(np.array([0, 1, 1]), np.array([0.9, 0.1, 1.5]), np.array([1.05, 0.2, 1.6]), np.ones(3),
                           band, weight, 1.0, 0.0, 2.0)
    assert x[:2].tolist() == [1.0, 1.0]


ONE = ClassTable((SloClass("all", 20.0),), (Tenant("everyone", "all", 1.0),))


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_one_class_figures_are_the_runs_own(path):
    w = small("burst", seed=2)
    cfg = SimConfig(nodes=2, seed=2, warmup_s=2.0, path=path)
    plain = simulate(cfg, w).summary
    s = simulate(SimConfig(nodes=2, seed=2, warmup_s=2.0, path=path, classes=ONE), small("burst", seed=2)).summary
    for k in ("wall_s",):
        plain.pop(k), s.pop(k)
    assert (s["class_table"], s["tenancy"]) == ("<table>", "blind")
    assert {k: v for k, v in s.items() if k not in ("shed", "classes", "tenants", "fairness", "class_table",
                                                   "tenancy")} == plain
    c = s["classes"]["all"]
    assert s["tenants"]["everyone"] == {"class": "all", "normalised_service": 1.0} | c
    for k in ("p50_ms", "p99_ms", "slo_attainment", "window_slo_satisfaction", "goodput_rps", "completed",
              "kv_hit_rate", "emb_hit_rate"):
        assert c[k] == pytest.approx(plain[k]), k
    assert c["requests"] == plain["requests"] and s["fairness"]["jain"] == pytest.approx(1.0)


def test_classes_count_every_request_the_same_on_both_paths():
    t = parse_table(TWO, "t")
    results = [simulate(SimConfig(nodes=2, seed=1, warmup_s=2.0, path=p, classes=t), short_burst(duration_s=45.0))
               for p in ("compiled", "python")]
    runs = [r.summary for r in results]
    bursts = sum(int(c.burst.sum()) for c in short_burst(duration_s=45.0).chunks(1.0))
    for s in runs:
        assert sum(c["requests"] for c in s["classes"].values()) == s["requests"]
        assert sum(x["completed"] for x in s["tenants"].values()) == s["completed"]
        assert bursts > 1000 and s["tenants"]["noisy"]["requests"] > bursts      # the bursts are its
    assert json.dumps(runs[0]["tenants"], sort_keys=True) == json.dumps(runs[1]["tenants"], sort_keys=True)


def test_cli_classes(capsys, tmp_path):
    assert main(["simulate", "--classes", "gold"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "unknown class table 'gold'" in err
    assert main(["simulate", "--duration", "6", "--rps", "200", "--nodes", "2", "--policy", "static", "--classes",
                 "surfaces", "--json", "--out", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "p99_windows_by_class.png").stat().st_size > 0
    s = json.loads(capsys.readouterr().out)
    assert set(s["classes"]) == {"feed", "interactive", "refresh"}
    assert set(s["fairness"]) == {"jain", "jain_attainment", "max_gap_s"}
    x = [t["normalised_service"] for t in s["tenants"].values()]
    assert s["fairness"]["jain"] == pytest.approx(jain(np.array(x)))
    assert s["tenancy"] == "helm"                                     # the default with a class table
    assert s["classes"]["feed"]["slo_ms"] == 15.0
    assert sum(t["requests"] for t in s["tenants"].values()) == s["requests"]


def test_tenancy_needs_a_table_and_a_node_queue():
    for kw, needle in ((dict(tenancy="strict"), "--tenancy strict needs a class table"),
                       (dict(tenancy="fifo", classes=ONE), "unknown tenancy 'fifo'"),
                       (dict(tenancy="helm", classes=ONE, central_queue=True), "a central queue has none")):
        with pytest.raises(HelmInputError, match=None) as e:
            SimConfig(**kw).validate()
        assert needle in str(e.value)


def class_waits(tenancy: str) -> tuple[dict, np.ndarray]:
    """2 nodes overloaded by half again (1,500 req/s of `small`): each class's mean wait, ms."""
    t = load_table("surfaces")
    r = simulate(SimConfig(nodes=2, seed=1, warmup_s=2.0, classes=t, tenancy=tenancy),
                 small("steady", seed=1, rps=1500.0, duration_s=10.0))
    rec = r.cluster.rec
    cls = t.tenant_class[np.asarray(rec.tenant)[np.asarray(rec.rid)]]
    wait = np.asarray(rec.start) - np.asarray(rec.arrival)
    return r.summary, np.array([wait[cls == k].mean() * 1e3 for k in range(3)])


def test_class_aware_queues_move_the_wait_to_the_lower_bands():
    blind, w_blind = class_waits("blind")
    assert blind["sim_path"] == "compiled"
    assert w_blind.max() < 1.1 * w_blind.min()                 # class-blind: every class waits alike
    for tenancy in ("strict", "helm"):
        s, w = class_waits(tenancy)
        assert s["sim_path"] == "compiled"
        assert s["completed"] == s["requests"] == blind["requests"]
        assert w[0] < 0.5 * w_blind[0] and w[2] > 2 * w_blind[2]    # the feed first, the refresh last
        assert w[0] < w[1] < w[2]


def test_helm_sheds_a_sheddable_class_predicted_late_and_loses_nothing():
    t = parse_table(with_("classes.loose.slo_ms", 3.0), "t")          # b and noisy: sheddable, 3 ms
    runs = {ten: simulate(SimConfig(nodes=2, seed=1, warmup_s=2.0, classes=t, tenancy=ten, router="helm"),
                          small("steady", seed=1, rps=1500.0, duration_s=10.0)).summary
            for ten in ("strict", "helm")}
    assert runs["strict"]["shed"] == 0
    s = runs["helm"]
    assert s["shed"] > 0 and s["completed"] + s["shed"] == s["requests"]
    assert s["classes"]["tight"]["shed"] == 0 and s["classes"]["loose"]["shed"] == s["shed"]
    for name, c in s["tenants"].items():
        assert c["completed"] + c["shed"] == c["requests"], name
    assert s["classes"]["tight"]["p99_ms"] < runs["strict"]["classes"]["tight"]["p99_ms"]   # less load behind it


def test_helm_keeps_the_top_bands_prefixes_and_the_floors_hold():
    t = load_table("surfaces")
    runs = {ten: simulate(SimConfig(nodes=2, seed=1, warmup_s=2.0, classes=t, tenancy=ten),
                          small("steady", seed=1, rps=1500.0, duration_s=10.0)) for ten in ("strict", "helm")}
    hit = {ten: [r.summary["classes"][c]["kv_hit_rate"] for c in t.class_names] for ten, r in runs.items()}
    assert hit["helm"][0] > 1.3 * hit["strict"][0]           # the feed's prefixes stay
    assert hit["helm"][2] < hit["strict"][2]                  # the refresh's go first
    assert t.band_floors == [0.0, 0.2, 0.05]
    for node in runs["helm"].cluster.nodes:
        kv = node.kv
        kv.check_integrity()
        assert kv.groups == 3 and node.kv_group == [0, 1, 1, 1, 2]
        assert kv.group_bytes(0) > kv.group_bytes(1) > 0 and kv.group_bytes(2) > 0
    assert all(node.kv.groups == 1 for node in runs["strict"].cluster.nodes)


def test_quota_holds_each_tenant_to_its_share_of_every_nodes_kv():
    t = load_table("surfaces")
    r = simulate(SimConfig(nodes=2, seed=1, warmup_s=2.0, classes=t, tenancy="quota"),
                 small("steady", seed=1, rps=1500.0, duration_s=10.0))
    s = r.summary
    assert s["completed"] == s["requests"] and s["shed"] == 0 and s["sim_path"] == "compiled"
    for node in r.cluster.nodes:
        kv = node.kv
        kv.check_integrity()                                  # each group within its quota
        assert kv.groups == 5 and node.kv_group == [0, 1, 2, 3, 4]
        cap = kv.capacity_bytes
        used = [kv.group_bytes(g) / cap for g in range(5)]
        assert used[0] > 0.40 and used[4] > 0.10              # full partitions: 0.45 and 0.15 of the cache
        assert all(u <= x.share + 1e-6 for u, x in zip(used, t.tenants))


def test_serve_refuses_a_bad_class_table_before_any_work(capsys):
    assert main(["serve", "--classes", "gold"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "unknown class table 'gold'" in err


def test_pools_split_the_nodes_by_class_share_by_hand():
    t = load_table("surfaces")                        # feed 0.45, interactive 0.40, refresh 0.15
    assert [t.pool_sizes(n) for n in (3, 4, 5, 8, 16)] == [[1, 1, 1], [2, 1, 1], [2, 2, 1], [4, 3, 1], [7, 6, 3]]
    skew = parse_table(with_("tenants.a.share", 0.9) | {"tenants": {"a": {"class": "tight", "share": 0.9},
                                                                   "b": {"class": "loose", "share": 0.1}}}, "t")
    assert skew.pool_sizes(2) == [1, 1] and skew.pool_sizes(4) == [3, 1] and skew.pool_sizes(10) == [9, 1]
    with pytest.raises(HelmInputError) as e:
        SimConfig(nodes=2, classes=t, tenancy="pools").validate()
    assert str(e.value) == "--tenancy pools needs a node per class: 2 nodes, 3 classes (feed, interactive, refresh)"


def test_pools_serve_each_class_on_its_own_nodes_and_lose_nothing():
    t = load_table("surfaces")
    r = simulate(SimConfig(nodes=4, seed=1, warmup_s=2.0, classes=t, tenancy="pools", router="helm"),
                 small("steady", seed=1, rps=1500.0, duration_s=10.0))
    s, rec = r.summary, r.cluster.rec
    assert s["pools"] == {"feed": 2, "interactive": 1, "refresh": 1} and s["completed"] == s["requests"]
    cls = t.tenant_class[np.asarray(rec.tenant)[np.asarray(rec.rid)]]
    node = np.asarray(rec.node)
    assert [sorted(set(node[cls == k].tolist())) for k in range(3)] == [[0, 1], [2], [3]]


def test_one_pool_routes_as_its_router_alone():
    runs = []
    for tenancy in ("blind", "pools"):          # (the router compiled; the pool's from Python)
        s = simulate(SimConfig(nodes=3, seed=2, warmup_s=2.0, classes=ONE, tenancy=tenancy, router="helm"),
                     small("burst", seed=2)).summary
        assert s["sim_path"] == "compiled"
        assert s["tenancy"] == tenancy
        runs.append({k: v for k, v in s.items() if k not in ("wall_s", "pools", "tenancy")})
    assert runs[0] == runs[1]


class Windows(MemoryPolicy):
    """Keeps every node window the policy is shown."""

    name = "static"

    def __init__(self):
        self.seen = []

    def observe(self, index, window, node):
        self.seen.append(window)


def test_under_helm_the_controller_sees_each_latency_against_its_class_target():
    t = load_table("surfaces")
    for tenancy in ("strict", "helm"):
        policy = Windows()
        r = simulate(SimConfig(nodes=2, seed=1, warmup_s=2.0, classes=t, tenancy=tenancy),
                     small("steady", seed=1, rps=1500.0, duration_s=6.0), policy=policy)
        rec = r.cluster.rec
        model_slo = 30.0                                       # the large model's target, ms
        scale = np.array([model_slo / 15, model_slo / 30, model_slo / 30, model_slo / 30, model_slo / 250])
        latency = np.asarray(rec.end) - np.asarray(rec.arrival)
        if tenancy == "helm":
            latency = latency * scale[np.asarray(rec.tenant)[np.asarray(rec.rid)]]
        end, node = np.asarray(rec.end), np.asarray(rec.node)
        assert len(policy.seen) == 12
        for w in policy.seen:
            mine = latency[(node == w.node) & (end > w.t - 1.0) & (end <= w.t)]
            assert w.completed == len(mine) > 100 and w.p99_s == pytest.approx(np.percentile(mine, 99), rel=1e-12)


def test_a_pool_reroutes_within_itself_and_a_pool_with_every_node_down_is_named():
    t = load_table("surfaces")
    fault = (parse_fault("1@3:6", 4),)                       # one of the feed's two nodes, down 3-6 s
    r = simulate(SimConfig(nodes=4, seed=1, warmup_s=2.0, classes=t, tenancy="pools", router="helm", faults=fault),
                 small("steady", seed=1, rps=800.0, duration_s=10.0))
    s, rec = r.summary, r.cluster.rec
    assert s["completed"] == s["requests"] and r.cluster.rerouted > 0
    cls = t.tenant_class[np.asarray(rec.tenant)[np.asarray(rec.rid)]]
    node, start = np.asarray(rec.node), np.asarray(rec.start)
    assert set(node[cls == 0].tolist()) == {0, 1} and not np.any((node == 1) & (start > 3.0) & (start < 6.0))
    with pytest.raises(HelmInputError) as e:                 # the refresh pool's one node
        simulate(SimConfig(nodes=4, seed=1, warmup_s=2.0, classes=t, tenancy="pools", faults=(parse_fault("3@3", 4),)),
                 small("steady", seed=1, rps=800.0, duration_s=10.0))
    assert str(e.value).startswith("every node of the pool of class 'refresh' is down at t=3.")


def test_a_request_a_fault_routes_again_is_queued_at_its_new_node_from_the_fault():
    from helmgr.sim.class_metrics import completed, queued
    t = load_table("surfaces")
    r = simulate(SimConfig(nodes=4, seed=1, warmup_s=2.0, classes=t, tenancy="helm", faults=(parse_fault("1@3:6", 4),)),
                 small("steady", seed=1, rps=3000.0, duration_s=8.0))
    rec = r.cluster.rec
    assert r.cluster.rerouted > 0 and len(rec.requeued) == r.cluster.rerouted        # one fault: each moved once
    assert set(rec.requeued.values()) == {3.0}
    tenant, arrival, _ = completed(rec)
    q = queued(rec, arrival)
    moved = np.isin(np.asarray(rec.rid), list(rec.requeued))
    assert moved.sum() == len(rec.requeued) and (q[moved] == 3.0).all() and (arrival[moved] < 3.0).all()
    assert (q[~moved] == arrival[~moved]).all()
    gap = max_service_gap(q, np.asarray(rec.start), np.asarray(rec.node), tenant, t.tenant_band, 4, 2.0)
    assert r.summary["fairness"]["max_gap_s"] == gap


def test_the_service_gap_counts_a_moved_request_at_its_new_node_from_the_fault():
    # a (arrived 0.1 at node 0) is moved to node 1 by a fault at 0.5 and starts there at 0.6; b,
    # its band mate, arrived at node 1 at 0.2 and started at 0.3. From its first arrival, a would
    # have been overtaken at node 1 for 0.3 s; from the fault, no one was.
    from helmgr.core.records import Request, Service
    from helmgr.sim.class_metrics import class_figures
    from helmgr.sim.metrics import Recorder
    t = parse_table({"classes": {"c": {"slo_ms": 100.0}},
                     "tenants": {"a": {"class": "c", "share": 0.5}, "b": {"class": "c", "share": 0.5}}}, "t")
    rec = Recorder(2)
    rec.requests = 2
    rec.tenant.extend(np.array([0, 1]))
    none = np.zeros(0, np.int64)
    for rid, arrived, start, node in ((1, 0.2, 0.3, 1), (0, 0.1, 0.6, 1)):
        req = Request(rid, arrived, 7, 0, none, none, 0, rerouted=int(rid == 0), tenant=rid)
        rec.complete(req, Service(start, start + 0.01, 0, 1, 0, 0, 0.0, 0.0, start), node, start + 0.01)
    assert class_figures(rec, t, 1.0, 1.0, 0.0)["fairness"]["max_gap_s"] == pytest.approx(0.3)
    rec.requeued[0] = 0.5
    assert class_figures(rec, t, 1.0, 1.0, 0.0)["fairness"]["max_gap_s"] == 0.0


def test_the_service_gap_is_the_longest_a_tenant_waits_after_its_band_mate_is_served():
    # tenants a, b share band 0, c is alone in band 1. Node 0: b queued from 0.1, a served at 0.5
    # (b overtaken), b served at 1.0: a gap of 0.5; c is never overtaken by a or b (another band).
    # Node 1: a and b queued at 0, a served at 0.1 and 0.3, b at 0.9: 0.8. Both served at one
    # instant (one batch): no gap.
    a, b, c = 0, 1, 2
    rows = [(0, a, 0.0, 0.0), (0, b, 0.1, 1.0), (0, a, 0.2, 0.5), (0, c, 0.3, 2.0),
            (1, a, 0.0, 0.1), (1, b, 0.0, 0.9), (1, a, 0.2, 0.3), (2, a, 0.0, 0.5), (2, b, 0.0, 0.5)]
    node, tenant, arrival, start = (np.array(col) for col in zip(*rows))
    band = np.array([0, 0, 1])
    gap = lambda from_s: max_service_gap(arrival, start, node, tenant, band, 3, from_s)
    assert gap(0.0) == pytest.approx(0.8)
    assert gap(0.4) == pytest.approx(0.5)            # counted from the warm-up: 0.9 - 0.4, 1.0 - 0.5
    assert gap(1.0) == 0.0
    assert math.isnan(gap(2.0))                       # nothing started after it: nothing measured
    assert max_service_gap(arrival, start, node, tenant, np.array([0, 1, 2]), 3, 0.0) == 0.0   # no band mates
    keep = node == 2
    assert max_service_gap(arrival[keep], start[keep], node[keep], tenant[keep], band, 3, 0.0) == 0.0
    # a batch of a's and b's first requests at 1, b's second at 5: nobody overtaken, in either
    # recording order; b's request arriving at the instant a is served is not overtaken either
    for order in ([0, 1, 2], [1, 0, 2]):
        rows = np.array([(a, 0.0, 1.0), (b, 0.0, 1.0), (b, 0.0, 5.0)])[order]
        assert max_service_gap(rows[:, 1], rows[:, 2], np.zeros(3, np.int64), rows[:, 0].astype(np.int64), band, 1,
                               0.0) == 0.0
    same = max_service_gap(np.array([0.5, 1.0]), np.array([1.0, 3.0]), np.zeros(2, np.int64), np.array([a, b]), band,
                           1, 0.0)
    assert same == 0.0


def test_a_clients_figures_count_answers_refusals_and_failures_by_tenant():
    # tenant a (tight, 10 ms): answered in 5 and 20 ms, one refused (429); b (loose): one answered
    # in 50 ms, one lost (status 0: neither completed nor shed)
    t = parse_table(TWO, "t")
    a, b = t.tenant_names.index("a"), t.tenant_names.index("b")
    tenant = np.array([a, a, a, b, b])
    status = np.array([200, 429, 200, 200, 0])
    arrival, latency = np.array([0.1, 0.2, 0.3, 0.4, 0.5]), np.array([0.005, 0.0, 0.020, 0.050, 1.0])
    f = client_figures(t, tenant, status, arrival, latency, np.full(5, 100), np.array([50, 0, 0, 100, 0]), 1.0)
    ta, tb = f["tenants"]["a"], f["tenants"]["b"]
    assert (ta["requests"], ta["completed"], ta["shed"], tb["requests"], tb["completed"], tb["shed"]) == (3, 2, 1, 2, 1, 0)
    assert ta["slo_attainment"] == 0.5 and tb["slo_attainment"] == 1.0 and ta["kv_hit_rate"] == 0.25
    assert f["fairness"]["jain_attainment"] == pytest.approx(1.5 ** 2 / (2 * 1.25))
    assert f["fairness"]["jain"] == 1.0                              # a and b alone in their bands
    assert math.isnan(f["fairness"]["max_gap_s"]) and "replicas' queues" in f["fairness"]["nulls"]["max_gap_s"]
    late = client_figures(t, tenant, status, arrival, latency + 1.0, np.full(5, 100), np.zeros(5, np.int64), 1.0)
    assert late["fairness"]["nulls"]["jain_attainment"] == "no tenant had a request answered within its target"


@pytest.mark.parametrize("tenancy", ["strict", "helm"])
def test_a_class_no_tenant_is_in_counts_nothing_and_binds_no_capacity(tenancy):
    from helmgr.experiments.capacity import satisfaction
    t = parse_table({"classes": {"a": {"slo_ms": 20.0}, "b": {"slo_ms": 30.0, "band": 1}},
                     "tenants": {"x": {"class": "a", "share": 1.0}}}, "t")
    s = simulate(SimConfig(nodes=2, seed=1, warmup_s=1.0, classes=t, tenancy=tenancy),
                 small("steady", seed=1, rps=400.0, duration_s=4.0)).summary
    b = s["classes"]["b"]
    assert (b["requests"], b["completed"]) == (0, 0) and s["classes"]["a"]["requests"] == s["requests"]
    assert math.isnan(b["band_share_backlogged"]) and "never waited" in b["nulls"]["band_share_backlogged"]
    assert satisfaction(s) == (s["classes"]["a"]["window_slo_satisfaction"], "a")


def test_loadgens_class_figures_count_the_requests_that_named_a_tenant():
    from helmgr.serve.answers import Answer, by_class
    from helmgr.serve.loadgen import Sent
    t = parse_table(TWO, "t")
    sent = [Sent(0.1, {"tenant": "a"}), Sent(0.2, {"tenant": "b"}), Sent(0.3, {}), Sent(0.4, {"tenant": "a"})]
    answers = [Answer(s.t, 0.005, status, 10, 5, 14, 1.0, "n", 0.5) for s, status in zip(sent, (200, 200, 200, 429))]
    f = by_class(t, sent, answers, 1.0)
    assert [(g["requests"], g["completed"], g["shed"]) for g in f["tenants"].values()] == [(2, 1, 1), (1, 1, 0), (0, 0, 0)]
    assert f["classes"]["tight"]["kv_hit_rate"] == 0.5 and f["classes"]["tight"]["emb_hit_rate"] == pytest.approx(1.0)
