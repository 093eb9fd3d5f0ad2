"""Speed figures (`helmgr bench`): how long one routing decision takes.

The router's index is filled the way a running cluster fills it: every node has published an EMB
summary (a resident bitmap over the default workload's 1 M items: its hottest ~60 % of rows, 95 %
of them resident) and the users of the first simulated 10 s have their prefixes spread over the
nodes by KV events. Requests are the default steady workload's (4 new tokens, 512 candidates).
Each decision is timed alone with `perf_counter_ns`; dispatch and completion bookkeeping run
between decisions, outside the timed call, with ~4 requests in flight per node.
"""
from __future__ import annotations

import time
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
    index = router.attach(CostModel.from_profile(node_profile("a100-80g", "large")), n_items)
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
    users, prefix = chunk.user.tolist(), chunk.prefix_len.tolist()
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
        node = router.route_request(now, users[i], prefix[i], new, cand)
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
    """Wall-clock latency of `Controller.step` (all three tiers and safety on), from its own
    per-decision record, over `steps` windows of plausible, varying stats. `cold_mb` > 0 writes
    over a buffer of that size between two decisions, as the rest of a serving process would,
    so each decision finds its code and data as cold as that leaves them (docs/controller.md)."""
    from helmgr.controller import Controller, WindowStats
    ctl = Controller.load(policy_path) if policy_path else Controller.default()
    rng = np.random.default_rng(seed)
    u = rng.random((steps, 6))
    ratio = 0.5
    other = np.zeros(cold_mb * 2**20 // 8) if cold_mb > 0 else None
    for k in range(steps):
        if other is not None:
            other += 1.0
        burst = 1.0 + 3.0 * ((k // 500) % 10 == 9)           # a 4x burst every 5,000 windows
        ratio = ctl.step(WindowStats(ratio=ratio, arrival_rps=300.0 * burst * (0.9 + 0.2 * u[k, 0]),
                                     p99_s=0.005 + 0.03 * u[k, 1], slo_s=0.03, emb_hit_rate=0.8 + 0.15 * u[k, 2],
                                     kv_hit_rate=0.6 + 0.3 * u[k, 3], queue_len=10 * u[k, 4],
                                     h2d_utilization=0.5 * u[k, 5], new_user_share=0.1, emb_time_share=0.4))
    us = np.asarray(ctl.latency_ns[steps // 10:], float) / 1e3
    return {"steps": steps, "p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99)),
            "p999_us": float(np.percentile(us, 99.9)), "mean_us": float(us.mean()), "bursts": len(ctl.events) // 2,
            "policy": str(policy_path) if policy_path else "default", "cold_mb": cold_mb}
