"""One node's request path on real tensors, behind the simulated `Node`'s interface.

`NodeRuntime.serve` does for real what `Node.serve` models: look up the user's prefix K/V in
the paged KV cache, look up the rows of the positions to compute and of the candidates in the
device EMB cache (misses gathered from the host table), run the model over the computed
positions only (`extend` after a hit, the whole history on a miss), store the prefix again and
score the candidates. `serve_batch` does the same for a batch the way `Node.serve_batch` models
it: one lookup, one batched forward and one batched scoring for all its requests (jagged: each
request's real tokens, nothing padded; `real/model.py`). Its `ratio`, `resize`, `stats` (a `NodeStats`), `cost`, `config` and
`check_integrity` are the simulated node's, so memory policies, the controller and routers plug
in unchanged. The wall clock is passed in; on CUDA each part ends with a synchronize so that
the parts it reports are the device's time, not the launch queue's.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch

from helmgr.core.costs import CostModel, ServiceBreakdown
from helmgr.core.profiles import ModelProfile, NodeProfile, load_model
from helmgr.core.records import History, NodeConfig, NodeStats
from helmgr.core.window import NodeCounters
from helmgr.memory.pool import ResizePlan
from helmgr.real.emb import DeviceEmbCache
from helmgr.real.kv import PagedKVCache, PrefixKV
from helmgr.real.model import HSTUModel, shrink
from helmgr.real.pool import DevicePool

FP32 = 4
PAGE_MIB = 1 / 16     # 64 KiB pages: a cached prefix is read and written whole pages at a time,
                      # so small pages keep that copy close to the prefix's own bytes
MIN_POOL_PAGES = 4    # a pool smaller than this many pages is refused (serve, calibrate)


def runtime_model(preset: str = "small", factor: int = 16, candidates: int | None = None) -> ModelProfile:
    """The model the runtime runs: a preset with widths divided by `factor`, in fp32 (K/V and
    embedding rows), so that its `row_bytes` and `kv_bytes_per_token` are the runtime's;
    `candidates` overrides the preset's candidates per request."""
    p = shrink(load_model(preset), factor)
    return replace(p, name=f"{p.name}-fp32", dtype_bytes=FP32, emb_dtype_bytes=FP32,
                   candidates=candidates or p.candidates)


class RealService(NamedTuple):
    """One request served for real: a `core.backend.Served`, with the measured phases added."""

    start: float
    end: float
    kv_tokens: int          # prefix positions taken from the KV cache
    ids: int                # rows looked up (computed positions + candidates)
    misses: int             # looked-up ids whose row was not resident (with repeats)
    unfilled_misses: int    # always 0: the runtime refills lazily and does not tell these apart
    fetch_s: float          # the EMB lookup, hits and misses (measured)
    recompute_s: float      # the prefill/extend pass when it recomputed prefix positions (measured)
    rows_fetched: int       # distinct rows gathered from the host table and copied in
    emb_s: float            # EMB lookup
    kv_s: float             # reading the cached prefix out of the pool and writing it back
    compute_s: float        # prefill / extend
    score_s: float          # candidate scoring
    scores: torch.Tensor    # one per candidate

    @property
    def tokens(self) -> int:
        """Positions computed: recomputed prefix + new tokens."""
        return self.ids - len(self.scores)

    @property
    def service_s(self) -> float:
        return self.end - self.start


class RealRequest(NamedTuple):
    """One request of a batch: as `NodeRuntime.serve`'s arguments."""

    user: int
    prefix_len: int
    new_ids: np.ndarray
    cand_ids: np.ndarray


class RealBatch(NamedTuple):
    """A batch served for real: one `RealService` per request, in order (start and end are the
    batch's, and so are its phase times: every request waited for all of them; its KV hit, ids,
    misses, rows fetched and scores are its own), and the batch's measured phases."""

    services: list[RealService]
    emb_s: float            # the batch's one EMB lookup
    kv_s: float             # its prefixes read out of the pool and written back
    compute_s: float        # the batched extend
    score_s: float          # the batched scoring
    rows_fetched: int       # distinct rows the lookup gathered from the host table

    @property
    def service_s(self) -> float:
        return self.services[0].service_s


class NodeRuntime:
    """A node's pool (`budget_bytes`, which need not be `profile.pool_budget_bytes`), EMB cache,
    KV cache and model on `device`, over a host table of `n_items` rows: a trained `checkpoint`'s
    (`real.checkpoint`, its table memory-mapped) or else seeded random weights and rows. Refill
    is lazy (rows enter on demand) and there is no host KV tier. The simulated node's
    `ratio`, `resize`, `refresh`, `stats`, `cost`, `config`, `check_integrity` and the caches'
    shadows (`emb.track_shadow`, `kv.track_ghosts`: adapter v2's signal) are here; its access
    logs are not."""

    def __init__(self, profile: NodeProfile, budget_bytes: int, device: str | torch.device = "cpu", seed: int = 0,
                 n_items: int = 100_000, config: NodeConfig = NodeConfig(),
                 clock: Callable[[], float] = time.perf_counter, checkpoint=None):
        model = profile.model
        if model.dtype_bytes != FP32 or model.emb_dtype_bytes != FP32:
            raise ValueError(f"the runtime runs fp32: model {model.name!r} has dtype_bytes={model.dtype_bytes}, "
                             f"emb_dtype_bytes={model.emb_dtype_bytes} (use runtime_model())")
        if config.refill != "lazy" or config.host_kv_gib:
            raise ValueError(f"the runtime supports lazy refill and no host KV tier, got refill={config.refill!r}, "
                             f"host_kv_gib={config.host_kv_gib}")
        self.profile, self.config, self.clock = profile, config, clock
        self.device = torch.device(device)
        self.cost = CostModel.from_profile(profile)
        if checkpoint is None:
            self.model = HSTUModel(model, torch.Generator().manual_seed(seed)).to(self.device).eval()
            table = torch.randn(n_items, self.model.in_dim, generator=torch.Generator().manual_seed(seed + 1))
        else:
            shape = ("layers", "heads", "d_qk", "d_v", "d_model", "features_per_token", "emb_dim")
            bad = next((f for f in shape if getattr(checkpoint.model.profile, f) != getattr(model, f)), None)
            if bad or checkpoint.n_items != n_items:
                raise ValueError(f"the checkpoint's model {checkpoint.model.profile.name!r} with {checkpoint.n_items} "
                                 f"items is not the node's {model.name!r} with {n_items}")
            self.model, table = checkpoint.model.to(self.device).eval(), checkpoint.table
        self.pool = DevicePool(budget_bytes, profile.page_bytes, model.row_bytes, self.device,
                               config.ratio, config.r_min, config.r_max)
        self.emb = DeviceEmbCache(self.pool, table, config.emb_policy, config.emb_decay)
        self.kv = PagedKVCache(self.pool, self.model.layout, config.kv_tail_first)
        self.stats = NodeStats()
        self.pool_budget_bytes = self.pool.total_pages * self.pool.page_bytes

    # -- memory (the simulated Node's interface) ------------------------------------------
    @property
    def ratio(self) -> float:
        return self.pool.ratio

    def resize(self, ratio: float, now: float = 0.0) -> tuple[ResizePlan, None]:
        """Set the EMB share; both caches follow at once. Refill is lazy: no wake-up is asked."""
        move = self.pool.resize(ratio)
        self.kv.on_resize(move.kv_pages)
        self.emb.on_resize(move.emb_slots)
        return move.plan, None

    def refresh(self, now: float) -> None:
        """The simulated node re-ranks its EMB cache here; the device cache admits on every
        lookup instead, so only its shadow is re-ranked, and there is no refill to wake."""
        self.emb.refresh()
        return None

    @property
    def refresh_epoch(self) -> int:
        """`refresh` calls so far (the simulated node's EMB refreshes)."""
        return self.emb.refreshes

    def counters(self) -> NodeCounters:
        """Running totals, for windows. There is no link model here: the H2D busy time is the
        measured fetch time (host gathers + copies)."""
        return self.stats.counters(self.stats.emb_wait_s, self.emb.shadow_hits)

    def check_integrity(self) -> None:
        self.pool.check_integrity()
        self.emb.check_integrity()
        self.kv.check_integrity()

    # -- serving --------------------------------------------------------------------------
    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return self.clock()

    def _cached_prefix(self, user: int, tokens: int) -> PrefixKV:
        if tokens == 0:
            return self.model.layout.empty(self.device)
        got = self.kv.get(user)
        return PrefixKV(tuple(k[:tokens] for k in got.k), tuple(v[:tokens] for v in got.v))

    def serve(self, now: float, user: int, prefix_len: int, new_ids: np.ndarray, cand_ids: np.ndarray,
              history: History) -> RealService:
        """Serve one request; `start` is `now`, `end` is `now` plus the measured service time.

        `new_ids` must be `history(user, prefix_len, prefix_len + len(new_ids))` (the workload's
        contract, as for `Node.serve`)."""
        t0 = self._now()
        cached, computed = self._plan(user, prefix_len, new_ids, history)
        tokens = len(computed)
        ids = torch.from_numpy(np.concatenate([computed, cand_ids]).astype(np.int64, copy=False))
        resident = self.emb.is_resident(ids)
        hits_before = self.emb.hits
        rows, fetched = self.emb.lookup(ids)
        t1 = self._now()
        past = self._cached_prefix(user, cached)
        t2 = self._now()
        _, full = self.model.extend(rows[:tokens], past)
        t3 = self._now()
        self.kv.put(user, full.k, full.v)
        t4 = self._now()
        scores = self.model.score(full, rows[tokens:])
        t5 = self._now()
        hits = self.emb.hits - hits_before
        token_hits = int(resident[:tokens].sum())
        recompute = t3 - t2 if cached < prefix_len else 0.0
        self._count(prefix_len, cached, ids.numel(), hits, tokens, token_hits, t5 - t0, t1 - t0, recompute)
        return RealService(now, now + (t5 - t0), cached, ids.numel(), ids.numel() - hits, 0, t1 - t0, recompute,
                           fetched, t1 - t0, (t2 - t1) + (t4 - t3), t3 - t2, t5 - t4, scores)

    def _plan(self, user: int, prefix_len: int, new_ids: np.ndarray, history: History) -> tuple[int, np.ndarray]:
        """The prefix positions the KV cache holds for `user`, and the item ids of the positions
        to compute: the new tokens after a hit, the rest of the history and them otherwise."""
        cached = min(self.kv.peek(user), prefix_len)
        end = prefix_len + len(new_ids)
        if cached < prefix_len:               # recomputed: what the ghost queue would have saved, before
            shadow = min(self.kv.ghost_tokens(user), prefix_len) - cached    # caching it takes the user out
            if shadow > 0:
                self.stats.kv_shadow_tokens += shadow
        return cached, new_ids if cached == prefix_len else history(user, cached, end)

    def serve_batch(self, now: float, batch: Sequence[RealRequest], history: History) -> RealBatch:
        """Serve `batch` together: every request's computed positions and
        candidates looked up at once, each request's cached prefix read, one `extend_batch` over
        all of them, every prefix stored again, one `score_batch`. Each request ends when the batch
        does; its scores equal what `serve` gives it alone."""
        t0 = self._now()
        plans = [self._plan(r.user, r.prefix_len, r.new_ids, history) for r in batch]
        tokens = [len(c) for _, c in plans]
        counts = [len(r.cand_ids) for r in batch]
        ids = torch.from_numpy(np.concatenate([c for _, c in plans] + [r.cand_ids for r in batch]).astype(np.int64))
        resident = self.emb.is_resident(ids)
        rows, fetched = self.emb.lookup(ids)
        t1 = self._now()
        past = [self._cached_prefix(r.user, cached) for r, (cached, _) in zip(batch, plans)]
        t2 = self._now()
        full = self.model.extend_batch(rows[:sum(tokens)], tokens, past)
        t3 = self._now()
        for b, r in enumerate(batch):
            self.kv.put(r.user, *full.request(b))
        t4 = self._now()
        scores = self.model.score_batch(full, rows[sum(tokens):], counts)
        t5 = self._now()
        per_request = zip(batch, plans, scores, self._segments(ids, resident, tokens, counts))
        services, total = [], sum(tokens)
        for r, (cached, _), sc, (n_ids, n_hits, token_hits, n_fetched) in per_request:
            recompute = (t3 - t2) * (n_ids - len(sc)) / total if cached < r.prefix_len else 0.0
            self._count(r.prefix_len, cached, n_ids, n_hits, n_ids - len(sc), token_hits, (t5 - t0) / len(batch),
                        t1 - t0, recompute)
            services.append(RealService(now, now + (t5 - t0), cached, n_ids, n_ids - n_hits, 0, t1 - t0, recompute,
                                        n_fetched, t1 - t0, (t2 - t1) + (t4 - t3), t3 - t2, t5 - t4, sc))
        return RealBatch(services, t1 - t0, (t2 - t1) + (t4 - t3), t3 - t2, t5 - t4, fetched)

    @staticmethod
    def _segments(ids: torch.Tensor, resident: torch.Tensor, tokens: list[int], counts: list[int]):
        """Per request of a batch whose `ids` are every request's computed positions, then every
        request's candidates: (ids, resident ids, resident computed positions, distinct absent ids)."""
        n = sum(tokens)
        tok_ids, cand_ids = ids[:n].split(tokens), ids[n:].split(counts)
        tok_res, cand_res = resident[:n].split(tokens), resident[n:].split(counts)
        for ti, ci, tr, cr in zip(tok_ids, cand_ids, tok_res, cand_res):
            absent = torch.cat([ti[~tr.cpu()], ci[~cr.cpu()]])
            hits = int(tr.sum()) + int(cr.sum())
            yield len(ti) + len(ci), hits, int(tr.sum()), int(torch.unique(absent).numel())

    def _count(self, prefix_len: int, cached: int, ids: int, hits: int, tokens: int, token_hits: int,
               busy_s: float, emb_s: float, recompute_s: float) -> None:
        s = self.stats
        s.count(prefix_len, cached, ids, ids - hits, tokens, tokens - token_hits, busy_s)
        s.cold_requests += cached == 0 < prefix_len
        s.emb_wait_s += emb_s
        s.recompute_s += recompute_s

    # -- what the cost model predicts for what the runtime saw ----------------------------
    def prediction(self, service: RealService, prefix_len: int) -> ServiceBreakdown:
        return predicted(self.cost, service, prefix_len)


def predicted(cost: CostModel, service: RealService, prefix_len: int) -> ServiceBreakdown:
    """The cost model's service of a request on an idle node, with the KV hit and the rows
    fetched that the runtime saw when it served it."""
    new_tokens = service.tokens - (prefix_len - service.kv_tokens)
    return cost.breakdown(prefix_len, service.kv_tokens, new_tokens, len(service.scores), service.rows_fetched)


class BatchPrediction(NamedTuple):
    """The cost model's service of a batch on an idle node, as `Node.serve_batch` prices it."""

    fetch_s: float          # the batch's misses gathered on the host, then one copy
    lookup_s: float         # the batch's resident-row reads
    compute_s: float        # `CostModel.batch_compute_s`: the curve's rate for its rows, launches once, per-request costs
    rows: int               # computed positions + candidates of the batch
    flops: float

    @property
    def total_s(self) -> float:
        return self.fetch_s + self.lookup_s + self.compute_s


def predicted_batch(cost: CostModel, batch: RealBatch) -> BatchPrediction:
    """What the simulator's batched node predicts for a batch the runtime served, with each
    request's KV hit and the rows the batch fetched as the runtime saw them (`Node.serve_batch`,
    idle link)."""
    fetched = batch.rows_fetched
    flops = sum(cost.request_flops(s.tokens, s.kv_tokens, len(s.scores)) for s in batch.services)
    rows = sum(s.ids for s in batch.services)      # computed positions + candidates: every row is looked up
    return BatchPrediction(cost.miss_s(fetched), cost.lookup_s(rows),
                           cost.batch_compute_s(flops, rows, len(batch.services)), rows, flops)
