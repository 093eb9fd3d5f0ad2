"""How much EMB capacity would nodes gain if each served only some interest clusters? (issue 22)

    python benchmarks/emb_specialization.py [--clusters-per-node 8] [--ratios 0.3,0.5,0.6,0.7,0.9]

The v2 default workload draws a candidate from the global head (Zipf 0.9 over 2 M items) with
probability 0.8, else from the user's cluster tail (Zipf 0.6 over its 31,250 items), and a
history row from the head with probability 0.2, else from the tail (docs/workloads.md). A node
that serves every cluster sees each tail at 1/64 of the tail mass; a node that serves only k
clusters sees those at 1/k. For an ideal frequency cache of C rows (the A100-80G pool x r, 64-KiB
rows of the large model) the hit rate is the mass of the C most likely items, computed exactly
from the same ItemSpace and Zipf masses the generator draws from. Printed per r: the hit rates
both ways, and the split a uniformly-routed node would need to match the specialized node's
candidate hit rate (effective capacity). Stationary popularity, ideal LFU: an upper bound on
what routing by interest cluster could earn, not a simulation. Asserts nothing.
"""
from __future__ import annotations

import argparse

import numpy as np

from helmgr.core.profiles import node_profile
from helmgr.workload import default_config
from helmgr.workload.popularity import ItemSpace, zipf_pmf


def access_mass(space: ItemSpace, head_share: float, head_exp: float, tail_exp: float,
                clusters: np.ndarray) -> np.ndarray:
    """Per item, its share of a node's accesses when the node serves `clusters` equally."""
    p = np.zeros(space.n_items)
    p[space.head_ids(np.arange(space.n_items))] += head_share * zipf_pmf(space.n_items, head_exp)
    m = space.segment
    tail = zipf_pmf(m, tail_exp) * (1.0 - head_share) / len(clusters)
    for c in clusters:
        p[space.tail_ids(np.arange(m), np.full(m, c))] += tail
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clusters-per-node", type=int, default=8)
    ap.add_argument("--ratios", default="0.3,0.5,0.6,0.7,0.9")
    args = ap.parse_args()
    cfg, prof = default_config("steady", "v2"), node_profile()
    space = ItemSpace(cfg.n_items, cfg.n_clusters)
    row_bytes = prof.model.row_bytes
    every, some = np.arange(cfg.n_clusters), np.arange(args.clusters_per_node)
    curves = {}
    for what, share in (("candidates", cfg.cand_head_share), ("history", cfg.hist_head_share)):
        for name, clusters in (("all", every), ("some", some)):
            curves[what, name] = np.cumsum(np.sort(access_mass(space, share, cfg.head_exponent, cfg.tail_exponent,
                                                               clusters))[::-1])
    print(f"{cfg.n_items:,} items in {cfg.n_clusters} clusters; a node serving all of them vs "
          f"{args.clusters_per_node}; pool {prof.pool_budget_bytes / 2**30:.0f} GiB, rows of {row_bytes:,} B")
    for r in (float(x) for x in args.ratios.split(",")):
        c = int(prof.pool_budget_bytes * r / row_bytes)
        hit = {k: float(v[c - 1]) for k, v in curves.items()}
        need = int(np.searchsorted(curves["candidates", "all"], hit["candidates", "some"]))
        print(f"r = {r:.2f} ({c:,} rows): candidates {hit['candidates', 'all']:.3f} -> {hit['candidates', 'some']:.3f}, "
              f"history {hit['history', 'all']:.3f} -> {hit['history', 'some']:.3f}; a node serving every cluster "
              f"needs {need * row_bytes / prof.pool_budget_bytes:.2f} of its pool ({need / c:.2f} x the rows) "
              f"for the specialized candidate hit rate")


if __name__ == "__main__":
    main()
