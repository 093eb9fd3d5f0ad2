"""Node-model speed: request generation, EMB residency checks, node.serve, EMB refresh.

    python benchmarks/bench_node.py [--items 1000000] [--seconds 120]

Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import time


from helmgr.core.records import NodeConfig
from helmgr.sim.node import Node
from helmgr.core.profiles import node_profile
from helmgr.workload import default_config, synthetic_workload


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=120.0)
    args = ap.parse_args()

    w, build_s = timed(lambda: synthetic_workload(default_config("steady", n_items=args.items, duration_s=args.seconds), 1))
    n_req = n_ids = 0
    t = time.perf_counter()
    for c in w.chunks():                         # consumed and dropped, as the simulator does
        n_req += len(c)
        n_ids += len(c.cand_ids) + len(c.item_ids)
    gen_s = time.perf_counter() - t
    print(f"workload build                 {build_s * 1e3:9.1f} ms  (id pools, prior)")
    print(f"requests generated             {n_req / gen_s:11,.0f} req/s   {n_ids / gen_s:14,.0f} ids/s")

    chunks = [c for _, c in zip(range(20), w.chunks())]
    node = Node(node_profile("a100-80g", "large"), args.items, NodeConfig(ratio=0.1))
    node.emb.warm(w.prior, per_refresh=100 * 1000)
    cands = [c.candidates(i) for c in chunks for i in range(len(c))][:10_000]
    _, look_s = timed(lambda: [node.emb.lookup(a) for a in cands])
    ids = sum(len(a) for a in cands)
    print(f"EMB residency checks           {ids / look_s:11,.0f} ids/s    ({len(cands[0])} ids per lookup, "
          f"{look_s / len(cands) * 1e6:.2f} us each)")
    node.emb.refresh()

    reqs = [(c, i) for c in chunks for i in range(len(c))]
    serve_s = refresh_s = 0.0
    refreshes = 0
    for k in range(0, len(reqs), 100):           # 100 requests ~ one node's second at 800 req/s on 8 nodes
        t = time.perf_counter()
        for c, i in reqs[k:k + 100]:
            node.serve(float(c.t[i]), int(c.user[i]), int(c.prefix_len[i]), c.items(i), c.candidates(i), w.history)
        serve_s += time.perf_counter() - t
        _, dt = timed(node.emb.refresh)
        refresh_s += dt
        refreshes += 1
    print(f"node.serve                     {len(reqs) / serve_s:11,.0f} req/s   "
          f"(ratio 0.1: kv hit {node.stats.kv_hit_rate:.2f}, emb hit {node.stats.emb_hit_rate:.3f})")
    print(f"EMB refresh ({args.items:,} rows)    {refresh_s / refreshes * 1e3:9.2f} ms   (after 100 requests each)")


if __name__ == "__main__":
    main()
