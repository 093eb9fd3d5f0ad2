"""Speed figures (`helmgr bench`): how long one routing decision and one controller decision
take, and how many simulated requests the simulator runs per wall-second (`sim_bench`).

The router's index is filled the way a running cluster fills it: every node has published an EMB
summary (a resident bitmap over the default workload's 1 M items: its hottest ~60 % of rows, 95 %
of them resident) and the users of the first simulated 10 s have their prefixes spread over the
nodes by KV events. Requests are the default steady workload's (4 new tokens, 512 candidates).
Each decision is timed alone with `perf_counter_ns`; dispatch and completion bookkeeping run
between decisions, outside the timed call, with ~4 requests in flight per node.
"""
from __future__ import annotations

import os
import time
import tracemalloc
from collections import deque

import numpy as np

from helmgr.core.costs import CostModel
from helmgr.core.profiles import node_profile
from helmgr.routing.residency import EmbSummary, KVBatch
from helmgr.routing.routers import make_router


def request_sample(seconds: float = 10.0, seed: int = 1):
    """The first `seconds` of the default steady workload, as one chunk; and its item count."""
    from helmgr.workload import default_config, synthetic_workload
    w = synthetic_workload(default_config("steady", duration_s=seconds + 2.0), seed)
    return next(iter(w.chunks(seconds))), w.n_items


def decision_times_us(router_name: str, nodes: int, chunk, n_items: int, decisions: int, seed: int = 1) -> np.ndarray:
    """Microseconds per `route_request`, one entry per decision."""
    rng = np.random.default_rng(seed)
    router = make_router(router_name)
    router.bind(nodes, [True] * nodes, np.random.default_rng([seed, 2]))
    index = router.attach(CostModel.from_profile(node_profile("a100-80g", "large")), n_items,
                          segments=int(chunk.segment.max()) + 1)
    if index is not None:
        hot = rng.permutation(n_items)[: int(0.6 * n_items)]
        for i in range(nodes):
            resident = np.zeros(n_items, bool)
            resident[hot] = rng.random(len(hot)) < 0.95
            index.apply_summary(EmbSummary(i, 1, np.packbits(resident, bitorder="little"), 0.2, 0.0, 0.0, 0.0))
        users = np.unique(chunk.user)
        homes = rng.integers(0, nodes, len(users))
        for i in range(nodes):
            index.apply_kv(KVBatch(i, 1, [(u, 1000) for u in users[homes == i].tolist()]))
    users, prefix, segment = chunk.user.tolist(), chunk.prefix_len.tolist(), chunk.segment.tolist()
    io, co = chunk.item_offsets.tolist(), chunk.cand_offsets.tolist()
    items, cands = chunk.item_ids, chunk.cand_ids
    out = np.empty(decisions, np.int64)
    in_flight: deque[int] = deque()
    clock = time.perf_counter_ns
    now = 0.0
    for k in range(decisions):
        i = k % len(users)
        new, cand = items[io[i]:io[i + 1]], cands[co[i]:co[i + 1]]
        now += 1e-4
        t0 = clock()
        node = router.route_request(now, users[i], prefix[i], new, cand, segment[i])
        out[k] = clock() - t0
        router.dispatched(node, users[i], prefix[i] + len(new))
        in_flight.append(node)
        if len(in_flight) > 4 * nodes:
            router.completed(in_flight.popleft(), now)
    return out / 1e3


def router_bench(router_name: str, sizes: list[int], decisions: int, repeats: int, on_done=None) -> dict:
    """p50/p99/mean per cluster size: the median over `repeats` runs of each (this box's timing
    noise moves single runs by up to 2x). The first tenth of each run is dropped (warm-up)."""
    chunk, n_items = request_sample()
    rows = []
    for n in sizes:
        runs = []
        for _ in range(repeats):
            us = decision_times_us(router_name, n, chunk, n_items, decisions)[decisions // 10:]
            runs.append((float(np.percentile(us, 50)), float(np.percentile(us, 99)), float(us.mean())))
            if on_done:
                on_done()
        p50, p99, mean = (float(np.median(x)) for x in zip(*runs))
        rows.append({"nodes": n, "p50_us": p50, "p99_us": p99, "mean_us": mean,
                     "p50_us_runs": [r[0] for r in runs]})
    return {"router": router_name, "decisions": decisions, "repeats": repeats, "n_items": n_items, "sizes": rows}


def controller_bench(policy_path=None, steps: int = 20000, seed: int = 1, cold_mb: int = 0) -> dict:
    """Wall-clock latency of `Controller.step` (the shipped HELM: base, adapter v2, recovery and
    safety on), from its own per-decision record, over `steps` windows of plausible, varying stats,
    with a counterfactual sample for adapter v2 every second window (as the simulator's EMB
    refresh gives one) and the window's rate as its load. `cold_mb` > 0 writes
    over a buffer of that size between two decisions, as the rest of a serving process would,
    so each decision finds its code and data as cold as that leaves them (docs/controller.md)."""
    from helmgr.controller import Controller, WindowStats
    ctl = Controller.load(policy_path) if policy_path else Controller.default()
    rng = np.random.default_rng(seed)
    u = rng.random((steps, 7))
    ratio = 0.5
    other = np.zeros(cold_mb * 2**20 // 8) if cold_mb > 0 else None
    for k in range(steps):
        if other is not None:
            other += 1.0
        burst = 1.0 + 3.0 * ((k // 500) % 10 == 9)           # a 4x burst every 5,000 windows
        sample = (u[k, 6] - 0.2) * 1e-4 if k % 2 else None          # seconds a window, leaning to a larger EMB share
        ratio = ctl.step(WindowStats(ratio=ratio, arrival_rps=300.0 * burst * (0.9 + 0.2 * u[k, 0]),
                                     p99_s=0.005 + 0.03 * u[k, 1], slo_s=0.03, emb_hit_rate=0.8 + 0.15 * u[k, 2],
                                     kv_hit_rate=0.6 + 0.3 * u[k, 3], queue_len=10 * u[k, 4],
                                     h2d_utilization=0.5 * u[k, 5], new_user_share=0.1, emb_time_share=0.4),
                         sample)
    us = np.asarray(ctl.latency_ns[steps // 10:], float) / 1e3
    return {"steps": steps, "p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99)),
            "p999_us": float(np.percentile(us, 99.9)), "mean_us": float(us.mean()), "bursts": len(ctl.events) // 2,
            "policy": str(policy_path) if policy_path else "default", "cold_mb": cold_mb,
            "adapter_steps": ctl.adapter.applied if ctl.adapter else 0}


# -- the simulator's own speed (docs/simulator.md#speed) ----------------------------------------
SIM_PHASES = ("generation", "setup", "compiled", "routing", "node_model", "emb_refresh", "windows_policy", "summary",
              "event_loop")
RPS_PER_NODE = 162.5                      # the default scenario's per-node load (1,300 req/s on 8 nodes)


class PhaseClock:
    """Wall time by phase from cheap timers around the methods that make up a phase; a timed call
    nested in another counts for its own phase only (the outer one's time excludes it)."""

    def __init__(self):
        self.spent = dict.fromkeys(SIM_PHASES, 0.0)
        self.calls = dict.fromkeys(SIM_PHASES, 0)
        self._inner: list[float] = []     # per open timed call: time spent in timed calls within it

    def wrap(self, phase: str, fn):
        spent, calls, inner, clock = self.spent, self.calls, self._inner, time.perf_counter

        def timed(*args, **kwargs):
            calls[phase] += 1
            inner.append(0.0)
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = clock() - t0
                spent[phase] += dt - inner.pop()
                if inner:
                    inner[-1] += dt
        return timed

    def wrap_generator(self, phase: str, make):
        """`make(...)` returns an iterator; each of its steps is timed."""
        def timed(*args, **kwargs):
            it = iter(make(*args, **kwargs))
            step = self.wrap(phase, next)
            while True:
                try:
                    yield step(it)
                except StopIteration:
                    return
        return timed


def _instrument(clock: PhaseClock, cluster) -> None:
    """Time the cluster's phases through its collaborators' verbs (instance attributes: nothing
    outside this run is touched; the compiled path's `step`, a module function, is wrapped by
    `_phase_run` for the run's length). A method the compiled path no longer calls counts as
    event loop."""
    from helmgr.sim import engine
    compiled = (cluster.choose_path()[0] == "compiled"                         # routes inside `step`
                and engine.router_mode(cluster.router, cluster.index) != engine.EXTERNAL)
    targets = {"routing": [] if compiled else [(cluster.router, "route_request"), (cluster.router, "dispatched"),
                                               (cluster.router, "completed"), (cluster, "report")],
               "node_model": [(cluster.server, "serve")],
               "emb_refresh": [(cluster, "refresh")] + [(s.node, "refill_step") for s in cluster.slots],
               "windows_policy": [(cluster, "window"), (cluster, "tick")]}
    for phase, pairs in targets.items():
        for owner, name in pairs:
            if hasattr(owner, name):
                setattr(owner, name, clock.wrap(phase, getattr(owner, name)))
    cluster.workload.chunks = clock.wrap_generator("generation", cluster.workload.chunks)


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _phase_run(cfg, make_workload) -> dict:
    """One instrumented run: wall time by phase (building the workload's tables apart: `simulate`
    does not time it either), and memory per node (tracemalloc peak of building the cluster; RSS
    growth over building the workload and the run)."""
    from helmgr.policy.policies import make_policy
    from helmgr.sim.cluster import Cluster
    from helmgr.sim.metrics import summarize
    clock = PhaseClock()
    rss0 = _rss_bytes()
    t0 = time.perf_counter()
    w = make_workload()
    t1 = time.perf_counter()
    cfg = cfg.validate(w.duration_s)
    profile = node_profile(cfg.hardware, cfg.model)
    tracemalloc.start()
    cluster = Cluster(cfg, w, profile, make_router(cfg.router), make_policy(cfg.policy))
    _, setup_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    t2 = time.perf_counter()
    _instrument(clock, cluster)
    from helmgr.sim.engine import CompiledRun
    step = CompiledRun.step
    CompiledRun.step = clock.wrap("compiled", step)        # arrivals, routing and service, compiled
    try:
        cluster.run()
    finally:
        CompiledRun.step = step
    t3 = time.perf_counter()
    summarize(cluster.rec, cluster.nodes, w.duration_s, profile.model.slo_ms * 1e-3, cfg.window_s, w.bursts,
              t3 - t2, cluster.rerouted, cfg.metrics_warmup_s(w.duration_s))
    t4 = time.perf_counter()
    spent = clock.spent
    spent["event_loop"] = (t3 - t2) - sum(spent.values())          # the run less its timed phases
    spent["setup"], spent["summary"] = t2 - t1, t4 - t3
    total = t4 - t1                                                # what `simulate` times, instrumented
    return {"workload_build_s": t1 - t0, "phase_wall_s": total, "phase_s": dict(spent), "phase_calls": dict(clock.calls),
            "phase_share": {p: v / total for p, v in spent.items()},
            "setup_bytes_per_node": setup_peak / cfg.nodes,
            "rss_growth_bytes_per_node": max(0, _rss_bytes() - rss0) / cfg.nodes}


def sim_bench(sizes=(8, 32, 128), routers=("least-loaded", "helm"), duration_s: float = 10.0,
              max_requests: int = 150_000, seed: int = 1, on_done=None, paths=("auto",), samples=(1,),
              policies=("static",)) -> dict:
    """Simulated requests per wall-second of the default scenario (steady) at each cluster size,
    162.5 req/s per node on the default node model, one row per router x size: `simulate` end to end on one core (chunk
    generation included, as the run draws them; building the workload's tables not), then an
    instrumented run of the same configuration for the split by phase and the memory per node.
    Each size runs min(duration_s, max_requests / (162.5 x nodes)) simulated seconds, so 128 nodes
    stays a few seconds long. `samples`: the EMB caches' sampling (SimConfig.emb_sample), a row each;
    `policies`: the memory policies (static at 0.5, full HELM `helm`, ...), a row each."""
    from helmgr.sim import SimConfig, simulate
    from helmgr.workload import default_config, synthetic_workload

    def workload(nodes: int, seconds: float):
        return synthetic_workload(default_config("steady", rps=RPS_PER_NODE * nodes, duration_s=seconds), seed)
    runs = [(pol, rt, path, k) for pol in policies for rt in routers for path in paths for k in samples]
    for pol, rt, path, k in runs:                        # compile / load the kernels outside the timings
        simulate(SimConfig(nodes=2, router=rt, seed=seed, path=path, emb_sample=k, policy=pol),
                 workload(2, 1.0))
    rows = []
    for nodes in sizes:
        seconds = min(duration_s, max_requests / (RPS_PER_NODE * nodes))
        for pol, rt, path, k in runs:
            cfg = SimConfig(nodes=nodes, router=rt, seed=seed, path=path, emb_sample=k, policy=pol)
            r = simulate(cfg, workload(nodes, seconds))
            s = r.summary
            ids = sum(n.stats.ids for n in r.cluster.nodes)
            row = {"nodes": nodes, "policy": pol, "router": rt, "emb_sample": k, "duration_s": seconds,
                   "requests": s["requests"],
                   "wall_s": s["wall_s"], "req_per_s": s["requests"] / s["wall_s"], "sim_path": s["sim_path"],
                   "ids_per_request": ids / max(s["requests"], 1), "ids_per_s": ids / s["wall_s"],
                   "p99_ms": s["p99_ms"] if np.isfinite(s["p99_ms"]) else None, "utilization": s["utilization"]}
            row |= {k: s[k] for k in ("engine",) if k in s}
            rows.append(row | _phase_run(cfg, lambda: workload(nodes, seconds)))
            if on_done:
                on_done()
    return {"scenario": "steady", "rps_per_node": RPS_PER_NODE, "seed": seed, "max_requests": max_requests,
            "phases": list(SIM_PHASES), "rows": rows}
