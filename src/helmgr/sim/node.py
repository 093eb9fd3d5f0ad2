"""One GPU node: the pool and its two caches, the H2D link, the refill mode and the cost model.

`Node.serve` is the whole per-request model (docs/node.md): look up the user's prefix in the KV cache
(and host tier), look up the rows of the tokens to compute and of the candidates in the EMB
cache, queue the misses (and any KV onload) on the link, then compute. It returns when the
request completes; queueing in front of the node belongs to the simulator.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from helmgr.core.costs import CostModel
from helmgr.core.records import History, NodeConfig, NodeStats, Service
from helmgr.core.window import NodeCounters
from helmgr.memory.emb import EmbCache
from helmgr.memory.kv import KVCache
from helmgr.memory.link import EMB_MISS, KV_ONLOAD, H2DLink
from helmgr.memory.pool import HBMPool, ResizePlan
from helmgr.memory.refill import make_refill
from helmgr.core.profiles import GIB, NodeProfile

class _Lookup(NamedTuple):
    """What a request found in the caches."""

    cached: int            # prefix positions in HBM
    onload: int            # ... and onloaded from the host tier
    computed_from: int     # first position computed (cached + onload)
    tokens: int            # positions computed
    ids: int               # rows looked up (computed tokens + candidates)
    hits: int              # ... resident
    token_hits: int        # ... of which rows of computed tokens
    unfilled: int          # misses on wanted-but-unfilled rows


class Node:
    def __init__(self, profile: NodeProfile, n_items: int, config: NodeConfig = NodeConfig(), node_id: int = 0):
        self.id = node_id
        self.profile = profile
        self.config = config
        self.cost = CostModel.from_profile(profile)
        model, hw = profile.model, profile.hardware
        budget = profile.pool_budget_bytes
        shift = config.emb_sample.bit_length() - 1          # (a power of two: SimConfig checks)
        tracked_bytes = model.row_bytes << shift            # a tracked row stands for 2**shift rows
        self.emb = EmbCache(-(-n_items >> shift), tracked_bytes, config.emb_policy,
                            band_rows=max(1024, budget // tracked_bytes // 64), decay=config.emb_decay,
                            sample_shift=shift)
        self.kv = KVCache(model.kv_bytes_per_token, profile.page_bytes, tail_first=config.kv_tail_first,
                          host_capacity_bytes=int(config.host_kv_gib * GIB))
        self.pool = HBMPool(budget, profile.page_bytes, self.emb, self.kv, config.ratio, config.r_min, config.r_max)
        self.link = H2DLink(hw.pcie_bw, hw.pcie_latency_s)
        self.refill = make_refill(config.refill, config.refill_share)
        self.blocked_until = 0.0
        self.stats = NodeStats()
        self.kv_log: list[tuple[int, int]] | None = None   # (user, prefix tokens) per request, when on
        self.kv_group: list[int] | None = None             # per tenant, its KV group (sim/tenancy.py)
        self.ghost_peers: list | None = None     # nodes whose KV ghosts this node's recomputes credit (None: itself)

    # -- memory ---------------------------------------------------------------------------
    @property
    def ratio(self) -> float:
        return self.pool.ratio

    def resize(self, ratio: float, now: float) -> tuple[ResizePlan, float | None]:
        """Set the EMB share; returns the plan and when the refill mode wants its next step."""
        plan = self.pool.resize(ratio)
        wake = self.refill.on_grow(self, now) if self.emb.unfilled_rows else None
        return plan, wake

    @property
    def pool_budget_bytes(self) -> int:
        """The pool's budget (what a shadow's share is of)."""
        return self.profile.pool_budget_bytes

    @property
    def refresh_epoch(self) -> int:
        """EMB refreshes so far."""
        return self.emb.epoch

    def refresh(self, now: float) -> float | None:
        """Re-rank the EMB cache from recent accesses; returns the refill mode's next step."""
        self.emb.refresh()
        return self.refill.on_grow(self, now) if self.emb.unfilled_rows else None

    def refill_step(self, now: float) -> float | None:
        return self.refill.on_step(self, now)

    def block_until(self, t: float, now: float) -> None:
        """A synchronous refill holds the node until `t`."""
        if t > self.blocked_until:
            self.stats.refill_blocked_s += t - max(now, self.blocked_until)
            self.blocked_until = t

    # -- serving --------------------------------------------------------------------------
    def _lookup(self, user: int, prefix_len: int, new_ids: np.ndarray, cand_ids: np.ndarray,
                history: History) -> _Lookup:
        """The caches' part of a request: its cached prefix (HBM, then the host tier if onloading
        beats recomputing), the rows of the tokens it computes and of its candidates."""
        cost, emb, kv = self.cost, self.emb, self.kv
        cached = min(kv.lookup(user), prefix_len)
        onload = 0
        if cached < prefix_len and kv.host is not None:
            extra = min(kv.host_lookup(user), prefix_len) - cached
            if extra > 0 and cost.kv_onload_s(extra) < cost.recompute_s(extra, cached) + cost.lookup_s(extra):
                onload = extra
        computed_from = cached + onload
        # the tokens to compute are history positions [computed_from, prefix_len + n_new): the new
        # tokens are the next positions of the user's history (the workload's contract)
        computed = new_ids if computed_from == prefix_len else history(user, computed_from, prefix_len + len(new_ids))
        hits, unfilled = emb.lookup(cand_ids)
        token_hits, u = emb.lookup(computed)
        tokens = len(computed)
        ids = len(cand_ids) + tokens
        return _Lookup(cached, onload, computed_from, tokens, ids, hits + token_hits, token_hits, unfilled + u)

    def _account(self, user: int, prefix_len: int, n_new: int, lk: _Lookup, busy_s: float, fetch_s: float,
                 flops_per_s: float, group: int = 0) -> float:
        """A served request's counters, and its prefix cached; returns its recompute seconds."""
        s, kv = self.stats, self.kv
        recompute = 0.0
        if lk.computed_from < prefix_len:
            recompute = self.cost.prefix_flops(prefix_len - lk.computed_from, lk.computed_from) / flops_per_s
            s.recompute_s += recompute
            if lk.computed_from == 0:
                s.cold_requests += 1
            if kv.ghosts:                      # before the insert below takes the user out of it
                for peer in self.ghost_peers or (self,):
                    shadow = min(peer.kv.ghost_tokens(user), prefix_len) - lk.computed_from
                    if shadow > 0:
                        peer.stats.kv_shadow_tokens += shadow
        kv.insert(user, prefix_len + n_new, group)
        if self.kv_log is not None:
            self.kv_log.append((user, prefix_len + n_new))
        s.emb_wait_s += fetch_s
        s.count(prefix_len, lk.cached, lk.ids, lk.ids - lk.hits, lk.tokens, lk.tokens - lk.token_hits, busy_s,
                lk.onload, lk.unfilled)
        return recompute

    def _fetch(self, t: float, misses: int, onload: int) -> float:
        """Gather `misses` rows on the host from `t`, then queue their copy and a KV onload of
        `onload` positions on the link; returns when they are resident."""
        cost = self.cost
        ready = t + cost.host_s(misses)
        if misses:
            ready = self.link.transfer(ready, misses * cost.row_bytes, EMB_MISS)
        if onload:
            ready = self.link.transfer(ready, cost.kv_bytes(onload), KV_ONLOAD)
        return ready

    def serve(self, now: float, user: int, prefix_len: int, new_ids: np.ndarray, cand_ids: np.ndarray,
              history: History) -> Service:
        """Serve one request starting at `now` (or when a sync refill releases the node): the
        request alone (the node contract's `serve`, `core.backend.NodeBackend`; the simulator serves
        batches, `serve_batch`) — its rows fetched, then its compute at the flat per-request efficiency.

        `new_ids` must be `history(user, prefix_len, prefix_len + len(new_ids))`: a request's new
        tokens are the next positions of its user's history."""
        start = now if now >= self.blocked_until else self.blocked_until
        cost = self.cost
        lk = self._lookup(user, prefix_len, new_ids, cand_ids, history)
        ready = self._fetch(start, lk.ids - lk.hits, lk.onload)
        end = ready + cost.lookup_s(lk.ids) + cost.compute_s(lk.tokens, lk.computed_from, len(cand_ids))
        recompute = self._account(user, prefix_len, len(new_ids), lk, end - start, ready - start, cost.flops)
        return Service(start, end, lk.computed_from, lk.ids, lk.ids - lk.hits, lk.unfilled, ready - start, recompute,
                       ready)

    def serve_batch(self, now: float, batch: list, history: History, compute_free: float) -> tuple[list[Service], float]:
        """Serve `batch` (Requests) as one batch taken at `now`: every request's lookups at once;
        the batch's misses gathered on the host (one request's rows after another's) and copied
        in as one transfer, its KV onloads as another (one lookup for the whole batch, as the real
        path does it); then one compute for the whole batch — once every row is resident and the
        compute engine is free (`compute_free`) — at the batch-efficiency curve's rate for the
        batch's rows, launches paid once and each further request's fixed cost. Every request
        completes at the batch's end.

        Returns the requests' services and when the compute started (the two-engine pipeline
        takes its next batch then)."""
        start = now if now >= self.blocked_until else self.blocked_until
        cost = self.cost
        looks = [self._lookup(req.user, req.prefix_len, req.items, req.cands, history) for req in batch]
        ready = self._fetch(start, sum(lk.ids - lk.hits for lk in looks), sum(lk.onload for lk in looks))
        flops = sum(cost.request_flops(lk.tokens, lk.computed_from, len(req.cands)) for req, lk in zip(batch, looks))
        rows = sum(lk.ids for lk in looks)       # rows in flight = rows looked up: computed tokens + candidates
        launch = ready if ready > compute_free else compute_free
        compute = cost.lookup_s(rows) + cost.batch_compute_s(flops, rows, len(batch))
        end = launch + compute
        rate = cost.batch_rate(rows)
        out = []
        share = compute / len(batch)
        groups = self.kv_group
        for req, lk in zip(batch, looks):
            recompute = self._account(req.user, req.prefix_len, len(req.items), lk, share, ready - start, rate,
                                      groups[req.tenant] if groups is not None else 0)
            out.append(Service(start, end, lk.computed_from, lk.ids, lk.ids - lk.hits, lk.unfilled, ready - start,
                               recompute, launch))
        return out, launch

    def counters(self) -> NodeCounters:
        """Running totals, for windows: the link's busy time and the EMB shadow's hits included
        (sampled, each tracked row's hit stands for 2**shift)."""
        return self.stats.counters(self.link.busy_s, self.emb.shadow_hits << self.emb.sample_shift)

    def check_integrity(self) -> None:
        self.pool.check_integrity()
