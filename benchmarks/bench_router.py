"""HELM router decision cost: microseconds per `route_request`, p50 / p99, at 32 and 1,024 nodes.

    python benchmarks/bench_router.py [--decisions 20000] [--router helm]

The router's index is filled the way a running cluster fills it: every node has published an EMB
summary (a resident bitmap over the default workload's 1 M items, its hottest ~60 % of rows plus
noise), and 20,000 users' prefixes are spread over the nodes by KV events. Requests are the
default steady workload's (4 new tokens, 512 candidates). Each decision is timed alone with
`perf_counter_ns`, dispatch and completion bookkeeping outside the timed call. Prints figures;
asserts nothing.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from helmgr.costs import CostModel
from helmgr.profiles import node_profile
from helmgr.sim.residency import EmbSummary, KVBatch
from helmgr.sim.routers import make_router
from helmgr.workload import default_config, synthetic_workload


def decision_times(router_name: str, nodes: int, chunk, n_items: int, decisions: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    router = make_router(router_name)
    up = [True] * nodes
    router.bind(nodes, up, np.random.default_rng([seed, 2]))
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
            mine = users[homes == i].tolist()
            index.apply_kv(KVBatch(i, 1, [(u, 1000) for u in mine]))
    t_ns = np.empty(decisions, np.int64)
    users, prefix = chunk.user.tolist(), chunk.prefix_len.tolist()
    io, co = chunk.item_offsets.tolist(), chunk.cand_offsets.tolist()
    items, cands = chunk.item_ids, chunk.cand_ids
    n_req = len(users)
    outstanding = []
    now = 0.0
    clock = time.perf_counter_ns
    for k in range(decisions):
        i = k % n_req
        new, cand = items[io[i]:io[i + 1]], cands[co[i]:co[i + 1]]
        now += 1e-4
        t0 = clock()
        node = router.route_request(now, users[i], prefix[i], new, cand)
        t_ns[k] = clock() - t0
        router.dispatched(node, users[i], prefix[i] + len(new))
        outstanding.append(node)
        if len(outstanding) > 4 * nodes:          # keep a realistic amount of work in flight
            router.completed(outstanding.pop(0), now)
    return t_ns / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decisions", type=int, default=20000)
    ap.add_argument("--router", default="helm")
    args = ap.parse_args()
    w = synthetic_workload(default_config("steady", duration_s=12.0), 1)
    chunk = next(iter(w.chunks(10.0)))
    print(f"{args.router}: {args.decisions:,} decisions per size, requests of the default steady workload "
          f"({len(chunk):,} distinct), {w.n_items:,} items")
    for nodes in (32, 1024):
        us = decision_times(args.router, nodes, chunk, w.n_items, args.decisions)
        us = us[len(us) // 10:]                   # skip the first tenth (warming caches and draws)
        print(f"{nodes:5d} nodes: p50 {np.percentile(us, 50):6.2f} us   p99 {np.percentile(us, 99):6.2f} us   "
              f"mean {us.mean():6.2f} us")


if __name__ == "__main__":
    main()
