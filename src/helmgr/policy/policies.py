"""Memory policies: what sets each node's EMB:KV ratio. The baselines live here (a fixed split,
and three cache managers from the literature); HELM's policy and its ablations in `helm.py`; the
registry maps each name to its class.
"""
from __future__ import annotations

import numpy as np

from helmgr.core.errors import HelmInputError
from helmgr.memory.mrc import miss_ratio_curve, shards_sample, stack_distances
from helmgr.policy.base import MemoryPolicy, Scheduled, Static
from helmgr.policy.helm import HelmBase, HelmBaseAdapter, HelmPolicy
from helmgr.policy.marginal import shadow_prices, track_shadows


class Adaptive(MemoryPolicy):
    """A shared-memory cache manager after Cliffhanger (Cidon et al., NSDI 2016) and Memshare
    (Cidon et al., ATC 2017): each cache keeps a shadow queue of the data just outside it — for
    EMB the `shadow_share` of the pool's bytes in rows ranked just below capacity, for KV the
    most recently evicted prefixes of the same size — and counts the hits it would have had.
    Every `interval_s` the memory credit moves `step` of the pool toward the cache whose shadow
    saved more time per byte, if it saved `margin` times more. A hit is valued in time saved
    (an EMB row fetch; a prefix token's recompute), so that the two caches' hits compare."""

    name = "adaptive"

    def __init__(self, step: float = 0.02, interval_s: float = 2.0, shadow_share: float = 0.05, margin: float = 1.2):
        self.step, self.interval_s, self.shadow_share, self.margin = step, interval_s, shadow_share, margin
        self.state: dict[int, dict] = {}

    def attach(self, index, node):
        track_shadows(node, self.shadow_share)
        self.state[index] = {"emb": 0, "kv": 0, "tokens": 0, "prefix": 0, "elapsed": 0.0, "target": None}

    def observe(self, index, w, node):
        st = self.state[index]
        st["emb"] += w.emb_shadow_hits
        st["kv"] += w.kv_shadow_tokens
        st["prefix"] += w.kv_prefix_tokens
        st["tokens"] += w.completed
        st["elapsed"] += w.span_s
        if st["elapsed"] < self.interval_s:
            return
        row_s, token_s = shadow_prices(node.cost, st["prefix"] // max(1, st["tokens"]))
        emb_gain, kv_gain = st["emb"] * row_s, st["kv"] * token_s      # same shadow bytes on both sides
        if emb_gain > self.margin * kv_gain:
            st["target"] = min(node.ratio + self.step, 1.0)
        elif kv_gain > self.margin * emb_gain:
            st["target"] = max(node.ratio - self.step, 0.0)
        st.update(emb=0, kv=0, tokens=0, prefix=0, elapsed=0.0)

    def decide(self, index, node, now):
        target = self.state[index]["target"]
        self.state[index]["target"] = None
        return target


class LatencyDriven(MemoryPolicy):
    """After RobinHood (Berger et al., OSDI 2018): every window, look at the requests in the
    node's latency tail (at or above its P99) and move `step` of the pool toward the cache whose
    misses cost those requests more time — EMB fetches (host gather + H2D, queueing included)
    or prefix recomputes (KV misses)."""

    name = "latency-driven"

    def __init__(self, step: float = 0.02, margin: float = 1.2):
        self.step, self.margin = step, margin
        self.target: dict[int, float | None] = {}

    def observe(self, index, w, node):
        if w.tail_fetch_s > self.margin * w.tail_recompute_s:
            self.target[index] = min(node.ratio + self.step, 1.0)
        elif w.tail_recompute_s > self.margin * w.tail_fetch_s:
            self.target[index] = max(node.ratio - self.step, 0.0)

    def decide(self, index, node, now):
        return self.target.pop(index, None)


class Independent(MemoryPolicy):
    """Each cache sized for itself, the way TorchRec's planner sizes an embedding cache and a KV
    manager sizes its pool, without regard to the other: every `interval_s` each cache's
    miss-ratio curve is built from its own recent accesses — EMB rows by SHARDS sampling at
    `emb_rate`, KV prefixes (byte-weighted) exactly — and each asks for the smallest capacity
    whose miss ratio is within `tolerance` of what the whole pool would give it. The pool is
    split in proportion to the two requests."""

    name = "independent"

    def __init__(self, interval_s: float = 5.0, emb_rate: float = 0.005, tolerance: float = 0.02,
                 points: int = 64):
        self.interval_s, self.emb_rate, self.tolerance, self.points = interval_s, emb_rate, tolerance, points
        self.state: dict[int, dict] = {}

    def attach(self, index, node):
        st = {"emb": [], "n_emb": 0, "elapsed": 0.0, "target": None}
        self.state[index] = st

        def log(ids, st=st):
            st["n_emb"] += len(ids)
            st["emb"].append(ids[shards_sample(ids, self.emb_rate)])
        node.emb.access_log = log
        node.kv_log = []

    def _need(self, curve: np.ndarray, sizes: np.ndarray) -> float:
        """Smallest size whose miss ratio is within tolerance of the full pool's."""
        ok = np.flatnonzero(curve <= curve[-1] + self.tolerance)
        return float(sizes[ok[0]])

    def observe(self, index, w, node):
        st = self.state[index]
        st["elapsed"] += w.span_s
        if st["elapsed"] < self.interval_s:
            return
        budget = node.profile.pool_budget_bytes
        sizes = np.linspace(0, budget, self.points + 1)
        emb_need = kv_need = 0.0
        if st["emb"]:
            sampled = np.concatenate(st["emb"])
            d = stack_distances(sampled) / self.emb_rate * node.emb.row_bytes
            misses = len(d) - np.searchsorted(np.sort(d), sizes, side="left")
            emb_need = self._need(np.clip(misses / (self.emb_rate * st["n_emb"]), 0, 1), sizes)
        if node.kv_log:
            users, tokens = (np.asarray(x) for x in zip(*node.kv_log))
            d = stack_distances(users, tokens * node.kv.bytes_per_token)
            kv_need = self._need(miss_ratio_curve(d, sizes), sizes)
        if emb_need + kv_need > 0:
            st["target"] = emb_need / (emb_need + kv_need)
        st.update(emb=[], n_emb=0, elapsed=0.0)
        node.kv_log = []

    def decide(self, index, node, now):
        target = self.state[index]["target"]
        self.state[index]["target"] = None
        return target


PRODUCT = ("helm",)                                          # full HELM: the three tiers
ABLATIONS = ("helm-base", "helm-base+adapter")                # HELM with tiers off, to measure each tier
POLICIES = {"static": Static, "adaptive": Adaptive, "latency-driven": LatencyDriven, "independent": Independent,
            "helm": HelmPolicy, "helm-base": HelmBase, "helm-base+adapter": HelmBaseAdapter}


def make_policy(name: str) -> MemoryPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise HelmInputError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None
