"""`helmgr plan`: for a target rate and SLO, how many nodes, which split policy and
which router, and the headroom left, from capacity runs.

1. Capacity at SLO (experiments.capacity) of each candidate policy + router on a probe cluster
   (`probe_nodes`, by default the scenario's 8), each seed a bisection, all in parallel.
2. Per candidate, nodes = ceil(target / (capacity / probe_nodes)): capacity taken to scale
   linearly with nodes (the router spreads users, and each node brings its own HBM and link).
3. The candidate needing the fewest nodes (then: the highest capacity) is checked by simulating
   it back at that size and the target rate, every seed; if a seed misses the SLO (window SLO
   satisfaction < 95 % or overloaded) one node is added and it is checked again.
   A check whose runs would pass the memory or EMB re-rank limit runs are held to is not simulated (unless
   `allow_large`): the plan is then the linear estimate, with `met_slo` null and why in `unchecked`.
4. Unless `quick`, the chosen size's own capacity is measured: the headroom is capacity / target - 1,
   and the plot of capacity against nodes gets its second point. With `quick` the headroom is
   the linear estimate, and says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from helmgr.experiments.capacity import TARGET, CapacityTask, base_rate, bisect_task, run_probe, summarize_capacity
from helmgr.core.validate import GIB, LIMITS, refresh_rows, run_memory_bytes
from helmgr.experiments.parallel import run_all
from helmgr.sim import SimConfig
from helmgr.workload import WorkloadSpec, default_config

CANDIDATES = (("helm", "helm"), ("static", "prefix-aware"), ("static", "least-loaded"))
MAX_GROW = 4                   # nodes added at most when the simulated check misses


@dataclass(frozen=True)
class PlanConfig:
    rps: float                                   # the target rate, whole cluster
    cluster: SimConfig                           # hardware, model, SLO, engine; nodes = the probe cluster's
    regime: str = "steady"
    seeds: tuple[int, ...] = (1,)
    duration_s: float | None = 60.0              # each probe's simulated seconds
    tol: float = 0.02
    candidates: tuple[tuple[str, str], ...] = CANDIDATES
    quick: bool = False
    allow_large: bool = False                    # past the limits: searches to CEILING, the check at any size

    def spec(self, seed: int, rps: float | None = None) -> WorkloadSpec:
        return WorkloadSpec(self.regime, self.duration_s, seed, rps)

    def cfg(self, policy: str, router: str, nodes: int, seed: int) -> SimConfig:
        return replace(self.cluster, policy=policy, router=router, nodes=nodes, seed=seed)


def _tasks(pc: PlanConfig, pairs, nodes: int, start: float) -> list[CapacityTask]:
    return [CapacityTask(pc.spec(s), pc.cfg(p, rt, nodes, s), start, pc.tol, allow_large=pc.allow_large)
            for p, rt in pairs for s in pc.seeds]


def _name(t: CapacityTask) -> str:
    return f"capacity {t.cfg.policy}@{t.cfg.router}, {t.cfg.nodes} nodes, seed {t.cfg.seed}"


def _capacities(pc: PlanConfig, pairs, nodes: int, start: float, jobs: int, ray_address, on_done) -> list[dict]:
    tasks = _tasks(pc, pairs, nodes, start)
    brackets = run_all(bisect_task, tasks, jobs, ray_address, [_name(t) for t in tasks],
                       on_done and (lambda _: on_done()))
    k = len(pc.seeds)
    return [summarize_capacity(brackets[i * k:(i + 1) * k], pc.seeds) for i in range(len(pairs))]


def _check(args: tuple[PlanConfig, str, str, int, int]) -> dict:
    pc, policy, router, nodes, seed = args
    p = run_probe(pc.spec(seed), pc.cfg(policy, router, nodes, seed), pc.rps)
    return {"seed": seed, "passed": p.passed, "window_slo_satisfaction": p.satisfaction, "p99_ms": p.p99_ms,
            "utilization": p.utilization, "overloaded": p.overloaded}


def _past_limits(pc: PlanConfig, nodes: int) -> str | None:
    """What a check of `nodes` at the target rate asks for past the limits every run is held to
    (memory, EMB rows re-ranked), or None."""
    seconds = pc.spec(pc.seeds[0]).seconds
    memory = run_memory_bytes(pc.rps * seconds, nodes) / GIB
    rows = refresh_rows(seconds, pc.cluster.refresh_s, nodes, default_config(pc.regime).n_items)
    if memory > LIMITS.memory_gib:
        return f"~{memory:.3g} GiB of memory (limit {LIMITS.memory_gib:g})"
    if rows > LIMITS.refresh_rows:
        return f"~{rows:.3g} EMB rows re-ranked (limit {LIMITS.refresh_rows:.3g})"
    return None


def plan(pc: PlanConfig, jobs: int = 1, ray_address: str | None = None, on_done=None) -> dict:
    probe_nodes = pc.cluster.nodes
    base = base_rate(pc.spec(pc.seeds[0])) * probe_nodes / SimConfig().nodes     # the regime's rate is for the default cluster
    caps = _capacities(pc, pc.candidates, probe_nodes, base, jobs, ray_address, on_done)
    table = []
    for (policy, router), c in zip(pc.candidates, caps):
        cap = c["capacity_rps"]
        need = math.ceil(pc.rps / (cap / probe_nodes) - 1e-9) if cap else None
        table.append({"policy": policy, "router": router, "probe_nodes": probe_nodes, "capacity_rps": cap,
                      "per_node_rps": cap / probe_nodes if cap else None, "nodes": need, "seeds": c["seeds"]})
    ok = [r for r in table if r["nodes"] is not None]
    if not ok:
        return {"target_rps": pc.rps, "candidates": table, "plan": None,
                "reason": "no candidate met the SLO at any rate on the probe cluster"}
    best = min(ok, key=lambda r: (r["nodes"], -r["capacity_rps"]))
    nodes, checks = best["nodes"], []
    past = None if pc.allow_large else _past_limits(pc, nodes + MAX_GROW)
    if past is not None:                                     # the linear estimate, not simulated
        chosen = {"policy": best["policy"], "router": best["router"], "nodes": nodes, "met_slo": None, "checks": [],
                  "unchecked": f"simulating {nodes} nodes at {pc.rps:g} req/s asks for {past}; pass --allow-large "
                               "to check it",
                  "capacity_rps": nodes * best["per_node_rps"], "capacity_measured": False}
        chosen["headroom"] = chosen["capacity_rps"] / pc.rps - 1
        return {"target_rps": pc.rps, "candidates": table, "plan": chosen, "target": TARGET}
    for _ in range(MAX_GROW + 1):
        tasks = [(pc, best["policy"], best["router"], max(1, nodes), s) for s in pc.seeds]
        checks = run_all(_check, tasks, jobs, ray_address, [f"check {nodes} nodes seed {s}" for s in pc.seeds])
        if all(c["passed"] for c in checks):
            break
        nodes += 1
    chosen = {"policy": best["policy"], "router": best["router"], "nodes": nodes,
              "met_slo": all(c["passed"] for c in checks), "checks": checks}
    estimate = nodes * best["per_node_rps"]
    if pc.quick:
        chosen |= {"capacity_rps": estimate, "capacity_measured": False}
    else:
        measured = _capacities(pc, [(best["policy"], best["router"])], nodes, pc.rps, jobs, ray_address, on_done)[0]
        chosen |= {"capacity_rps": measured["capacity_rps"], "capacity_measured": True,
                   "capacity_seeds": measured["seeds"]}
    cap = chosen["capacity_rps"]
    chosen["headroom"] = cap / pc.rps - 1 if cap else None
    return {"target_rps": pc.rps, "candidates": table, "plan": chosen, "target": TARGET}
