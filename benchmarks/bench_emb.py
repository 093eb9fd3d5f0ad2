"""Device EMB cache lookups on the serving workload: admission from the pool of coldest slots
against a scan of every slot (the same victims; tests/test_real_caches.py checks that).

    PYTHONPATH=src python benchmarks/bench_emb.py [--requests 600] [--pool-mib 48] [--items 100000] [--device cpu]

Two caches built alike (the serving replica's defaults, warmed from the workload's prior) look up
the same requests' ids (candidates, new items, up to 200 history rows), in interleaved blocks
of 50 so both see the same moments of a noisy machine. Prints CPU ms per lookup (wall on CUDA);
asserts nothing. Needs torch and numpy only.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np
import torch

from helmgr.serve.config import ServeConfig
from helmgr.serve.node import ServeNode
from helmgr.workload import synthetic_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--pool-mib", type=float, default=48.0, help="each node's pool (EMB + KV)")
    ap.add_argument("--ratio", type=float, default=0.3, help="EMB share of the pool")
    ap.add_argument("--items", type=int, default=100_000, help="rows of the host table")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = replace(ServeConfig(), pool_mib=args.pool_mib, ratio=args.ratio, n_items=args.items, device=args.device,
                  controller=False)
    nodes = {"pool": ServeNode(cfg), "scan": ServeNode(cfg)}
    nodes["scan"].runtime.emb.POOL = 1 << 62               # every admission sorts all slots
    w = synthetic_workload(cfg.workload_config(20.0, 600.0), cfg.seed)
    dev = torch.device(args.device)
    reqs = []
    for chunk in w.chunks():
        for i in range(len(chunk)):
            hist = w.history(int(chunk.user[i]), 0, int(chunk.prefix_len[i]))[:200]
            reqs.append(torch.as_tensor(np.concatenate([chunk.candidates(i), chunk.items(i), hist])).to(dev))
            if len(reqs) == args.requests:
                break
        if len(reqs) == args.requests:
            break
    clock = time.perf_counter if dev.type == "cuda" else time.process_time
    spent = {k: 0.0 for k in nodes}
    for start in range(0, len(reqs), 50):
        for name, node in nodes.items():
            emb = node.runtime.emb
            t = clock()
            for ids in reqs[start:start + 50]:
                emb.lookup(ids)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            spent[name] += clock() - t
    emb = nodes["pool"].runtime.emb
    same = torch.equal(emb.item_of, nodes["scan"].runtime.emb.item_of)
    print(f"{len(reqs)} lookups, {emb.item_of.numel():,} EMB slots, {emb.n_items:,} items, "
          f"hit rate {emb.hits / max(emb.lookups, 1):.3f}, same slots in both caches: {same}")
    for name, s in spent.items():
        print(f"  {name:5} {s / len(reqs) * 1e3:7.3f} ms per lookup")
    print(f"  scan / pool: {spent['scan'] / spent['pool']:.2f}x")


if __name__ == "__main__":
    main()
