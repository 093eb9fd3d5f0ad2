"""Several base-policy seeds, the one that ships chosen on validation runs (experiments.training)."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from helmgr.controller.mlp import MLPPolicy
from helmgr.experiments import training
from helmgr.sim import SimConfig, simulate
from helmgr.workload import WorkloadSpec

pytest.importorskip("stable_baselines3")

TINY_ENV = dict(episode_s=4.0, warmup_s=2.0, rps_per_node=80.0, users_per_node=4000,
                workload={"n_items": 20_000, "n_clusters": 8, "duration_s": 8.0})   # runs of 8 s: an episode
                                                                                         # starts in its first second


def test_score_is_the_geometric_mean_and_infinite_for_a_run_without_a_figure():
    ok = {"overloaded": False}
    assert training.score([ok | {"p99_ms": 2.0}, ok | {"p99_ms": 8.0}]) == pytest.approx(4.0)
    assert training.score([ok | {"p99_ms": 2.0}, {"p99_ms": 8.0, "overloaded": True}]) == math.inf
    assert training.score([ok | {"p99_ms": None}]) == math.inf


def test_select_trains_each_seed_validates_and_ships_the_best(tmp_path):
    cluster = SimConfig(nodes=2, engine="pipelined", max_batch=8, slo_ms=20.0, router="helm")
    sc = training.SelectConfig(seeds=(1, 2), timesteps=64, env=TINY_ENV, validate_seeds=(101,),
                               validate_regimes=("steady", "trend"), validate_duration_s=3.0, validate_rps=150.0,
                               cluster=cluster)
    out = tmp_path / "policy.npz"
    done = []
    sel = training.select_policy(sc, out, tmp_path / "report", tmp_path / "runs", jobs=1, on_done=done.append)
    assert done == ["train"] * 2 + ["validate"] * 6 and sc.steps() == 8      # (2 seeds + the shipped) x 2 runs
    cands = {c["seed"]: c for c in sel["candidates"]}
    assert set(cands) == {1, 2}
    for c in cands.values():
        assert c["score_p99_ms"] == training.score(c["validation"])
        assert [(v["regime"], v["seed"]) for v in c["validation"]] == [("steady", 101), ("trend", 101)]
    best = min(cands.values(), key=lambda c: (c["score_p99_ms"], c["seed"]))
    assert sel["chosen_seed"] == best["seed"]
    # a validation figure is the run of that candidate as helm-base
    from helmgr.policy.helm import HelmBase
    v = cands[2]["validation"][1]
    direct = simulate(replace(cluster, policy="helm-base", seed=101), WorkloadSpec("trend", 3.0, 101, 150.0).build(),
                      policy=HelmBase(path=cands[2]["policy"]))
    assert v["p99_ms"] == direct.summary["p99_ms"]
    shipped = MLPPolicy.load(out)
    assert shipped.meta["selected"]["seeds"] == [1, 2] and f"--seed {best['seed']}" in shipped.meta["command"]
    assert (tmp_path / "report" / "training.png").stat().st_size > 0
    assert json.loads((tmp_path / "report" / "selection.json").read_text())["chosen_seed"] == best["seed"]
    # the shipped policy, validated on the same runs
    inc = sel["incumbent"]
    assert inc["score_p99_ms"] == training.score(inc["validation"]) and inc["policy"].endswith("default_policy.npz")
