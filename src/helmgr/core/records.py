"""Typed records that cross the layers: a node's configuration, one request's service, a node's
running counters."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from helmgr.core.window import NodeCounters

# history(user, start, stop) -> item ids of the user's history positions [start, stop)
History = Callable[[int, int, int], np.ndarray]


@dataclass(frozen=True, slots=True)
class NodeConfig:
    ratio: float = 0.5
    r_min: float = 0.05
    r_max: float = 0.95
    refill: str = "lazy"
    refill_share: float = 0.25
    emb_policy: str = "lfu"
    emb_decay: float = 0.99          # per refresh: with 1-s refreshes, a ~100-s memory (docs/node.md)
    kv_tail_first: bool = False
    host_kv_gib: float = 0.0
    emb_sample: int = 1               # EMB caches track one item id in this many (memory/emb.py)


class Service(NamedTuple):
    """One request's service on a node."""

    start: float
    end: float
    kv_tokens: int          # prefix positions not recomputed (HBM hit + host onload)
    ids: int                # rows looked up
    misses: int             # rows fetched over PCIe
    unfilled_misses: int    # of which on rows a resize/refresh left unfilled
    fetch_s: float          # host gathers + H2D copies before compute, link queueing included
    recompute_s: float      # prefix positions recomputed
    launch: float           # when its compute began (its batch's launch; one served alone: when its rows were in)


class NodeStats:
    __slots__ = ("requests", "cold_requests", "prefix_tokens", "kv_hit_tokens", "onload_tokens", "ids", "misses",
                 "unfilled_misses", "kv_shadow_tokens", "token_ids", "token_misses", "busy_s", "refill_blocked_s",
                 "emb_wait_s", "recompute_s")

    def __init__(self):
        self.requests = self.cold_requests = self.prefix_tokens = self.kv_hit_tokens = self.onload_tokens = 0
        self.ids = self.misses = self.unfilled_misses = self.kv_shadow_tokens = 0
        self.token_ids = self.token_misses = 0     # rows of computed tokens (not candidates) and their misses
        self.busy_s = self.refill_blocked_s = 0.0
        self.emb_wait_s = 0.0       # host gathers + H2D copies (queueing included) before compute
        self.recompute_s = 0.0      # prefix positions recomputed (FLOPs time)

    def count(self, prefix_len: int, cached: int, ids: int, misses: int, tokens: int, token_misses: int,
              busy_s: float, onload: int = 0, unfilled: int = 0) -> None:
        """One request served: its prefix and how much of it was cached, the rows it looked up and
        missed (all, and those of computed tokens), its busy time."""
        self.requests += 1
        self.prefix_tokens += prefix_len
        self.kv_hit_tokens += cached
        self.onload_tokens += onload
        self.ids += ids
        self.misses += misses
        self.token_ids += tokens
        self.token_misses += token_misses
        self.unfilled_misses += unfilled
        self.busy_s += busy_s

    def counters(self, h2d_busy_s: float, emb_shadow_hits: int = 0) -> NodeCounters:
        """The totals a window is the difference of; the H2D busy time and shadow hits come from
        the backend, which owns the link and the cache."""
        return NodeCounters(self.busy_s, self.ids, self.misses, self.prefix_tokens,
                            self.kv_hit_tokens + self.onload_tokens, self.cold_requests, self.emb_wait_s,
                            self.recompute_s, h2d_busy_s, emb_shadow_hits, self.kv_shadow_tokens)

    @property
    def emb_hit_rate(self) -> float:
        return 1.0 - self.misses / self.ids if self.ids else 0.0

    @property
    def kv_hit_rate(self) -> float:
        """Share of prefix positions served from cache (HBM or host), token-weighted."""
        return (self.kv_hit_tokens + self.onload_tokens) / self.prefix_tokens if self.prefix_tokens else 0.0


@dataclass(slots=True)
class Request:
    """One request in the simulator, from its arrival to its completion."""

    rid: int
    t: float                 # arrival, simulated seconds
    user: int
    prefix_len: int          # history positions before this request's new actions
    items: np.ndarray        # the new actions' item ids (the next positions of the user's history)
    cands: np.ndarray        # the candidates' item ids
    burst: int               # 1 if the workload generated it inside a burst
    rerouted: int = 0        # 1 once a node failure sent it to another node
    segment: int = -1        # the user's interest segment (-1: unknown)
    tenant: int = -1         # its tenant in the run's class table (-1: none)

    @property
    def tokens(self) -> int:
        """Positions of context the request leaves behind: its prefix and its new actions."""
        return self.prefix_len + len(self.items)

    @property
    def batch_tokens(self) -> int:
        """What the request holds of a batch's token budget: its context and its candidates."""
        return self.prefix_len + len(self.items) + len(self.cands)
