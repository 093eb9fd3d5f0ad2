"""`helmgr simulate` with neither --policy nor --router: full HELM beside static-best +
prefix-aware (experiments.showcase)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from helmgr.cli import main
from helmgr.cli.simulate_cmd import build_config
from helmgr.cli.workload_cmd import workload_spec
from helmgr.experiments import showcase as sc
from helmgr.experiments.evaluate import EvalConfig, config_dict
from helmgr.sim import simulate
from helmgr.workload import default_config

ROOT = Path(__file__).resolve().parents[1]


def cli_default(regime="steady", **changes):
    """The spec and cluster `helmgr simulate --workload REGIME` builds (the defaults)."""
    cfg = build_config(8, "static", 0.5, "prefix-aware", "a100-80g", "large", 20.0, "lazy", (), 10.0, 2.0, 8, 0,
                       "pipelined", "auto")
    spec = workload_spec(regime, default_config(regime).duration_s, 0, None, None, "inter", None, 1, ())
    return spec, replace(cfg, **changes)


def test_the_stored_figures_apply_to_the_default_scenario_only():
    assert set(sc.REFERENCE) == {"steady", "burst", "trend"}
    for regime in ("steady", "burst", "trend"):
        spec, cfg = cli_default(regime)
        assert sc.reference(spec, cfg) is sc.REFERENCE[regime]
        # seed, initial ratio, policy, router and path are free
        assert sc.reference(replace(spec, seed=7), replace(cfg, ratio=0.3, seed=7, path="python")) is not None
        for other in (replace(cfg, nodes=4), replace(cfg, hardware="h100-80g"), replace(cfg, max_batch=1)):
            assert sc.reference(spec, other) is None
        for other in (replace(spec, rps=999.0), replace(spec, duration_s=60.0),
                      replace(spec, trace="x.inter")):
            assert sc.reference(other, cfg) is None
    spec, cfg = cli_default()
    assert sc.reference(replace(spec, rps=default_config("steady").rps), cfg) is not None


def test_the_stored_figures_are_the_committed_evaluations():
    """REFERENCE is what the committed records measured, on the cluster `helmgr simulate` builds:
    per regime, from the first of RECORDS that measured it (SOURCE), the evaluation's prefix-aware
    static ratio with the lowest P99 averaged over its seeds, and the capacities at SLO that the
    evaluation or `helmgr capacity` measured, with the HELM they measured."""
    _, cfg = cli_default()
    merged, source = {}, {}
    for folder, capacity in sc.RECORDS:
        record = json.loads((ROOT / folder / "evaluate.json").read_text())
        config = record["config"]
        assert config["duration_s"] is None and config["seeds"] == [1, 2, 3]
        assert config["cluster"] == json.loads(json.dumps(config_dict(EvalConfig(cluster=cfg))["cluster"]))
        runs = [] if capacity is None else [json.loads(p.read_text()) for p in sorted((ROOT / capacity).glob("*.json"))]
        assert all(sorted(r["seeds"]) == ["1", "2", "3"] and r["tol"] == 0.02 for r in runs)
        for regime, ref in sc.reference_from_record(record, runs).items():
            source.setdefault(regime, folder)
            merged.setdefault(regime, ref)
    assert merged == sc.REFERENCE and source == sc.SOURCE
    assert len({ref.helm_revision for ref in sc.REFERENCE.values()}) == 1


def test_reference_from_record_by_hand():
    check = {"seeds": {"1": {"ratios": [0.4, 0.8], "p99_ms": [10.0, 9.0]},
                       "2": {"ratios": [0.4, 0.8], "p99_ms": [8.0, 9.5]}}}          # means 9.0 and 9.25
    record = {"config": {"check_router": "prefix-aware"},
              "scenario_check": {"steady": check, "burst": check},
              "capacity": [{"regime": "steady", "config": "helm@helm", "capacity_rps": 3000.0},
                           {"regime": "steady", "config": "static-best@prefix-aware", "capacity_rps": 2500.0},
                           {"regime": "burst", "config": "helm@helm", "capacity_rps": 2000.0}]}
    assert sc.reference_from_record(record) == {
        "steady": sc.Reference(0.4, {"helm@helm": 3000.0, "static-best@prefix-aware": 2500.0}),
        "burst": sc.Reference(0.4, None)}
    with pytest.raises(ValueError, match="least-loaded"):
        sc.reference_from_record(record | {"config": {"check_router": "least-loaded"}})
    # capacity runs: full HELM's and static-best's (at the regime's best split, 0.4) fill burst in
    record["config"] |= {"cluster": {"nodes": 8}, "helm_revision": "r"}
    run = {"workload": "burst", "nodes": 8, "policy": "helm", "router": "helm", "ratio": 0.5,
           "capacity_rps": 2100.0}
    base = run | {"policy": "static", "router": "prefix-aware", "ratio": 0.4, "capacity_rps": 1500.0}
    got = sc.reference_from_record(record, [run, base])
    assert got["burst"] == sc.Reference(0.4, {"helm@helm": 2100.0, "static-best@prefix-aware": 1500.0})
    assert got["burst"].helm_revision == "r"
    got = sc.reference_from_record(record, [run | {"helm_revision": "q"}, base])     # the run's HELM, if it names it
    assert got["burst"].helm_revision == "q" and got["steady"].helm_revision == "r"
    for bad in (base | {"ratio": 0.8}, run | {"nodes": 4}, run | {"router": "prefix-aware"}):
        with pytest.raises(ValueError, match="capacity run"):
            sc.reference_from_record(record, [bad])


def tiny():
    cfg = build_config(2, "static", 0.5, "prefix-aware", "a100-80g", "large", 20.0, "lazy", (), 10.0, 2.0, 8, 3,
                       "pipelined", "auto")
    return workload_spec("steady", 3.0, 3, 150.0, None, "inter", None, 1, ()), cfg


def test_a_configuration_without_stored_figures_sweeps_the_baseline():
    """The baseline is the best of SWEEP under prefix-aware, each exactly the one static run."""
    spec, cfg = tiny()
    out = sc.showcase(spec, cfg, jobs=1)
    w = spec.build()
    p99 = {r: simulate(replace(cfg, ratio=r), w).summary["p99_ms"] for r in sc.SWEEP}
    best = min(p99, key=p99.get)
    base, helm = out.baseline[0], out.helm[0]
    assert (base["policy"], base["router"], base["ratio"], base["p99_ms"]) == ("static-best", "prefix-aware", best,
                                                                               p99[best])
    assert (helm["policy"], helm["router"]) == ("helm", "helm")
    assert helm["p99_ms"] == simulate(replace(cfg, policy="helm", router="helm"), w).summary["p99_ms"]
    assert not out.stored and out.capacity_rps is None and out.headroom("helm") is None
    assert out.p99_reduction == pytest.approx(1 - helm["p99_ms"] / base["p99_ms"])


def test_stored_figures_hold_the_split_and_give_the_headroom(monkeypatch):
    """The stored capacities give the headroom over the run's base rate (150 req/s); HELM's only
    while HELM is the one measured (`showcase.stack_revision`): another base policy, adapter or
    router keeps the baseline's and drops HELM's."""
    from helmgr.policy.helm import helm_revision
    spec, cfg = tiny()
    caps = {"helm@helm": 240.0, "static-best@prefix-aware": 180.0}
    assert sc.stack_revision().startswith(helm_revision() + "/router=helm(")
    for revision, expect in ((sc.stack_revision(), {"helm": 240.0, "baseline": 180.0}),
                             (helm_revision(), {"baseline": 180.0}),
                             ("0123456789abcdef/adapter=True/recovery=True", {"baseline": 180.0})):
        ref = sc.Reference(0.3, caps, revision)
        monkeypatch.setattr(sc, "reference", lambda s, c: ref)
        out = sc.showcase(spec, cfg, jobs=1)
        assert out.stored and out.baseline[0]["ratio"] == 0.3 and out.baseline[0]["policy"] == "static-best"
        assert out.capacity_rps == expect and out.headroom("baseline") == pytest.approx(0.2)
        assert out.headroom("helm") == (pytest.approx(240 / 150 - 1) if "helm" in expect else None)


def test_simulate_without_policy_or_router_shows_both(capsys, tmp_path):
    argv = ["simulate", "--duration", "3", "--nodes", "2", "--rps", "150", "--seed", "3", "--jobs", "1"]
    assert main(argv + ["--json", "--out", str(tmp_path / "sc")]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["helm"]["policy"] == "helm" and got["static_best"]["router"] == "prefix-aware"
    assert got["static_best_source"] == "swept" and got["capacity_rps"] is None
    assert got["p99_reduction"] == pytest.approx(1 - got["helm"]["p99_ms"] / got["static_best"]["p99_ms"])
    assert {"summary.json", "summary.md", "showcase.png", "ratio_timeline.png"} <= {
        p.name for p in (tmp_path / "sc").iterdir()}
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "HELM (helm + helm router)" in out and f"static-best {got['static_best']['ratio']:g} + prefix-aware" in out
    assert "capacity at SLO: not stored" in out
    # naming a policy (or a router) is one run, the other option at its old default
    assert main(argv + ["--policy", "helm", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert (one["policy"], one["router"]) == ("helm", "prefix-aware")
