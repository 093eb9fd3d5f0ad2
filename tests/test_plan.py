"""`helmgr plan` on a tiny cluster: the size from the probe capacity, checked back by simulation."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from helmgr.experiments.plan import PlanConfig, plan
from helmgr.sim import SimConfig

PROBE = SimConfig(nodes=2, engine="pipelined", max_batch=8, slo_ms=20.0)


@pytest.fixture(scope="module")
def planned():
    pc = PlanConfig(rps=900.0, cluster=PROBE, duration_s=6.0, tol=0.2, candidates=(("static", "least-loaded"),),
                    quick=True)
    return plan(pc)


def test_nodes_follow_the_probe_capacity(planned):
    (cand,) = planned["candidates"]
    assert cand["per_node_rps"] == cand["capacity_rps"] / 2
    assert cand["nodes"] == math.ceil(900.0 / cand["per_node_rps"])


def test_the_plan_is_simulated_back_and_meets_the_slo(planned):
    p = planned["plan"]
    cand = planned["candidates"][0]
    assert (p["policy"], p["router"]) == ("static", "least-loaded")
    assert p["nodes"] >= cand["nodes"] and p["met_slo"]
    assert all(c["passed"] and c["window_slo_satisfaction"] >= 0.95 for c in p["checks"])
    # --quick: the headroom is the linear estimate at the chosen size
    assert p["capacity_measured"] is False
    assert p["headroom"] == pytest.approx(p["nodes"] * cand["per_node_rps"] / 900.0 - 1)


def test_no_candidate_no_plan():
    pc = PlanConfig(rps=100.0, cluster=SimConfig(nodes=1, engine="pipelined", max_batch=8, slo_ms=0.01),
                    duration_s=4.0, tol=0.5, candidates=(("static", "least-loaded"),), quick=True)
    out = plan(pc)
    assert out["plan"] is None and "no candidate" in out["reason"]


def test_a_check_past_the_memory_limit_is_the_estimate_unsimulated(monkeypatch):
    """Where simulating the planned size would pass the memory limit, the plan is the linear
    estimate, not simulated, and says why; --allow-large simulates it."""
    from helmgr.core.validate import Limits
    monkeypatch.setattr("helmgr.experiments.plan.LIMITS", Limits(memory_gib=1e-3))
    pc = PlanConfig(rps=900.0, cluster=PROBE, duration_s=4.0, tol=0.5, candidates=(("static", "least-loaded"),),
                    quick=True)
    out = plan(pc)
    p, cand = out["plan"], out["candidates"][0]
    assert p["met_slo"] is None and p["checks"] == [] and "--allow-large" in p["unchecked"]
    assert p["nodes"] == cand["nodes"] and p["capacity_rps"] == p["nodes"] * cand["per_node_rps"]
    assert p["headroom"] == pytest.approx(p["capacity_rps"] / 900.0 - 1)
    assert plan(replace(pc, allow_large=True))["plan"]["checks"]
