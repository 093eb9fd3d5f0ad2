"""Adapter v2's counterfactual signal: shadows of both caches, priced in seconds by the cost model.

Each cache keeps a shadow of a small share of the pool (EMB rows ranked just below the cut, KV
prefixes just evicted) and counts the hits it would have had; priced (an EMB row's fetch, a
prefix token's recompute), the two sides give d(saved seconds)/dr without probing.
"""
from __future__ import annotations

from helmgr.core.window import NodeWindow


def shadow_prices(cost, mean_prefix: int, row_miss_rate: float = 0.0) -> tuple[float, float]:
    """Seconds one shadow hit saves: (an EMB row that would have been resident: its host gather
    and copy; a cached prefix token: its recompute, plus its row's lookup missing at
    `row_miss_rate`), for a mean prefix of `mean_prefix` tokens."""
    row_s = cost.host_s(1) + cost.row_bytes / cost.pcie_bw
    mean_prefix = max(1, int(mean_prefix))
    return row_s, cost.recompute_s(mean_prefix, 0) / mean_prefix + row_miss_rate * row_s


def track_shadows(node, share: float, peers: list | None = None) -> int:
    """Count, on `node`, the hits of a shadow of `share` of its pool on each side: EMB rows ranked
    just below the cut, KV prefixes just evicted. Returns the shadow's bytes.

    A prefix is credited to the ghost of the node that evicted it wherever its user's next request
    recomputes it, among `peers` (a list shared by the cluster's nodes, this one appended; None:
    this node alone). Under a router that follows KV residency that is the counterfactual: had the
    node kept the prefix, the router would have sent the request there; having lost it, the router
    sends it elsewhere, and a per-node ghost would never see the hit."""
    shadow_bytes = int(share * node.pool_budget_bytes)
    node.emb.track_shadow(max(1, shadow_bytes // node.emb.row_bytes))
    node.kv.track_ghosts(shadow_bytes)
    if peers is not None:
        peers[:] = [p for p in peers if p.id != node.id] + [node]   # (a restarted node replaces itself)
        node.ghost_peers = peers
    return shadow_bytes


def marginal_value(w: NodeWindow, cost, share: float) -> tuple[float, float, float] | None:
    """The window's counterfactual d(saved seconds)/dr per request (adapter v2's signal), from
    shadows of `share` of the pool on each side (`track_shadows`): the seconds an EMB shadow's hits
    would have saved minus those a KV ghost's would have, over `share` (moving r by `share` moves
    that many bytes), per completed request. Positive: a larger EMB share saves time. Also the
    two sides' seconds, for reports. None for a window without completions."""
    if w.completed <= 0:
        return None
    row_s, token_s = shadow_prices(cost, w.kv_prefix_tokens // w.completed, w.emb_misses / max(1, w.emb_ids))
    emb_s, kv_s = w.emb_shadow_hits * row_s, w.kv_shadow_tokens * token_s
    return (emb_s - kv_s) / share / w.completed, emb_s, kv_s


class MarginalSampler:
    """Adapter v2's samples, one stream per node: the marginal value (`marginal_value`)
    of shadows of `share` of the pool on each side, summed since the last sample and closed at the
    first window after an EMB refresh (which folds the EMB shadow's hits in). In seconds per
    request per unit of r, positive: a larger EMB share saves time. The adapter learns from them,
    the recovery tier tests them, and a base policy that reads "marginal_ms" sees their EWMA.

    With `value` "tail" each side's seconds are weighed by the share of its cost that fell on
    the requests at or above their window's P99 (the EMB side by their fetch seconds over
    all requests', the KV side by their recompute seconds'), so the sample is what the
    shadows would have saved the tail, on the assumption that a cache's hits land where its
    cost does. Priced over every request ("mean") the signal's zero is the split with the
    lowest mean latency, and on steady that is above the one with the lowest P99: the P99
    is cold requests recomputing long prefixes, which only the KV side saves (steady seed 1:
    the adapter held 0.63-0.64 where static 0.6 is best, docs/results/2026-12-04-tail-value.md).
"""

    VALUES = ("mean", "tail")

    def __init__(self, share: float = 0.05, value: str = "tail"):
        self.check_value(value)
        self.share, self.value = share, value
        self.acc: dict[int, list] = {}      # node -> the open sample's sums (`open`)

    def attach(self, index: int, node, peers: list | None = None) -> None:
        """Shadows on node `index` (`track_shadows`; `peers`: the cluster's ghost peers) and an
        empty sample."""
        track_shadows(node, self.share, peers)
        self.acc[index] = self.open(node.refresh_epoch)

    def sample(self, index: int, w: NodeWindow, node) -> float | None:
        """Window `w` into node `index`'s open sample; the sample if an EMB refresh closed it,
        else None (and None for a node without shadows)."""
        acc = self.acc.get(index)
        if acc is None:
            return None
        self.fold(acc, w, node.cost)
        if node.refresh_epoch == acc[3] or not acc[2]:
            return None
        self.acc[index] = self.open(node.refresh_epoch)
        return self.price(acc)

    def fold(self, acc: list, w: NodeWindow, cost) -> None:
        """Window `w` into the sums `acc` (`open`'s layout)."""
        value = marginal_value(w, cost, self.share)
        if value is not None:
            acc[0] += value[1]
            acc[1] += value[2]
            acc[2] += w.completed
        acc[4] += w.tail_fetch_s
        acc[5] += w.emb_wait_s
        acc[6] += w.tail_recompute_s
        acc[7] += w.recompute_s

    def price(self, acc: list) -> float:
        """The sample the sums `acc` (with completions) make, priced by `value`."""
        emb_s, kv_s = acc[0], acc[1]
        mean = (emb_s - kv_s) / self.share / acc[2]
        if self.value == "mean":
            return mean
        emb_s *= min(1.0, acc[4] / acc[5]) if acc[5] > 0 else 0.0
        kv_s *= min(1.0, acc[6] / acc[7]) if acc[7] > 0 else 0.0
        tail = (emb_s - kv_s) / self.share / acc[2]
        return tail

    @classmethod
    def check_value(cls, value: str) -> None:
        """ValueError naming a `value` that is not one of `VALUES`."""
        if value not in cls.VALUES:
            raise ValueError(f"value must be 'mean' or 'tail', got {value!r}")

    @staticmethod
    def open(epoch: int) -> list:
        """A sample's sums, empty, from EMB refresh `epoch` on: [EMB s, KV s, completed, refresh
        epoch, tail fetch s, fetch s, tail recompute s, recompute s]."""
        return [0.0, 0.0, 0, epoch, 0.0, 0.0, 0.0, 0.0]
