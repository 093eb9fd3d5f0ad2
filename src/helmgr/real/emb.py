"""The device EMB cache (the simulator's EMB cache on real tensors): hot rows in the pool's EMB region, the full
table in host memory.

Bookkeeping lives on the device as two maps (`slot_of[item]`, `item_of[slot]`, `EMPTY` where
there is none), plus one score per item, so a lookup is a handful of tensor ops whatever the
batch size. The clock is the lookup count, never wall time: each `lookup` is one epoch. Scores
come from the simulated cache's eviction policies (`helmgr.memory.eviction`): decayed frequency
(LFU with aging, lazily aged so that a lookup costs O(batch)) or recency (LRU). The policy keeps
them in a host numpy array (`scores`); on the CPU the torch view shares its memory, on a GPU a
device copy follows each lookup's distinct ids. A missed row is admitted when its score beats
the lowest-scored resident row that this batch does not need (a free slot always loses,
`EvictionPolicy.admits`), as the simulator keeps the top rows by score.

The shadow (`track_shadow`, adapter v2's EMB side, as the simulated cache's): at each `refresh`
the `shadow_rows` best-scored rows not resident (ties with the last included; never a row that
was never seen), and `shadow_hits` counts the lookups' misses on them: the fetches a cache that
much larger would have saved. A lookup costs one more gather for it.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from helmgr.memory.eviction import make_eviction, top
from helmgr.memory.pool import SizeInfo
from helmgr.real.pool import DevicePool

EMPTY = -1


class Lookup(NamedTuple):
    rows: torch.Tensor   # (len(ids), row width), in the host table's dtype
    n_misses: int        # distinct ids fetched from the host table


class DeviceEmbCache:
    """Rows of `host_table` (n_items, width) cached in `pool`'s EMB region, one row per slot.

    Admission replaces the coldest slots: lowest (score, slot index), empty slots first. In a
    cache of more than 2 x POOL slots they come from a pool of the POOL coldest, kept between
    misses (see `_coldest`), instead of a scan of every slot per miss batch."""

    POOL = 4096

    def __init__(self, pool: DevicePool, host_table: torch.Tensor, policy: str = "lfu", decay: float = 0.99):
        self.policy = make_eviction(policy, decay, lazy=True)
        if host_table.dim() != 2 or host_table.device.type != "cpu":
            raise ValueError(f"host table must be a 2-D CPU tensor, got {tuple(host_table.shape)} "
                             f"on {host_table.device}")
        if host_table.shape[1] * host_table.element_size() != pool.row_bytes:
            raise ValueError(f"host rows are {host_table.shape[1] * host_table.element_size()} bytes, "
                             f"the pool's rows {pool.row_bytes}")
        self.pool = pool
        self.on_cuda = pool.device.type == "cuda"
        self.host = host_table.pin_memory() if self.on_cuda and not host_table.is_pinned() else host_table
        n_items, dev = host_table.shape[0], pool.device
        self.slot_of = torch.full((n_items,), EMPTY, dtype=torch.int64, device=dev)
        self.item_of = torch.full((pool.n_rows,), EMPTY, dtype=torch.int64, device=dev)
        self.scores = np.zeros(n_items, np.float32)            # the policy's, on the host
        self._mirrored = dev.type != "cpu"
        self._scores = torch.from_numpy(self.scores).to(dev)   # on the CPU: the same memory
        self.epoch = 0
        self.lookups = self.hits = self.misses = 0
        self.refreshes = 0                             # `refresh` calls: the shadow's re-rankings
        self.shadow_rows = self.shadow_hits = 0
        self._shadow: torch.Tensor | None = None       # per item: in the shadow
        self._staging = torch.empty(0, host_table.shape[1], dtype=host_table.dtype,
                                    pin_memory=self.on_cuda)
        self._copied: torch.cuda.Event | None = None   # the last H2D copy out of _staging
        self._pool: torch.Tensor | None = None          # admission's candidate slots, ascending
        self._pool_edge = (0.0, 0)                      # (score, slot) of the pool's hottest at its refill
        self._pool_rescales = 0

    @property
    def row_bytes(self) -> int:
        return self.pool.row_bytes

    @property
    def n_items(self) -> int:
        return self.slot_of.numel()

    def rows_view(self) -> torch.Tensor:
        """The pool's EMB rows, typed like the host table."""
        return self.pool.emb_rows().view(self.host.dtype)

    def is_resident(self, ids: torch.Tensor) -> torch.Tensor:
        return self.slot_of[ids.to(self.pool.device)] != EMPTY

    # -- the hot path ---------------------------------------------------------------------
    def lookup(self, ids: torch.Tensor) -> Lookup:
        """Rows for `ids` (any shape flattened, duplicates allowed). Hits come from the pool,
        misses from one host gather and one H2D copy; misses are then admitted."""
        ids = ids.reshape(-1).to(self.pool.device)
        if ids.numel() == 0:
            return Lookup(torch.empty(0, self.host.shape[1], dtype=self.host.dtype, device=self.pool.device), 0)
        lo, hi = torch.aminmax(ids)
        if lo < 0 or hi >= self.n_items:
            raise ValueError(f"item ids must be in [0, {self.n_items}), got range [{int(lo)}, {int(hi)}]")
        uniq, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
        self._touch(uniq, counts)
        slots = self.slot_of[uniq]
        hit = slots != EMPTY
        rows = torch.empty(len(uniq), self.host.shape[1], dtype=self.host.dtype, device=self.pool.device)
        rows[hit] = self.rows_view().index_select(0, slots[hit])
        miss_ids = uniq[~hit]
        if self._shadow is not None and miss_ids.numel():
            self.shadow_hits += int(self._shadow[miss_ids].sum())
        if miss_ids.numel():
            fetched = self._fetch(miss_ids)
            rows[~hit] = fetched
            self._admit(miss_ids, fetched, keep=slots[hit])
        n_misses = miss_ids.numel()
        self.lookups += ids.numel()
        self.hits += int(counts[hit].sum())
        self.misses += n_misses
        return Lookup(rows[inverse], n_misses)

    def _touch(self, uniq: torch.Tensor, counts: torch.Tensor) -> None:
        """One epoch: the policy scores the batch's distinct ids, then ages; a device copy of the
        scores follows (all of it after a rescale)."""
        ids = uniq.cpu().numpy()
        rescales = self.policy.rescales
        self.policy.touch(self.scores, ids, counts.cpu().numpy().astype(np.float32), self.epoch)
        self.policy.age(self.scores)
        self.epoch += 1
        if self._mirrored:
            if self.policy.rescales != rescales:
                self._scores.copy_(torch.from_numpy(self.scores))
            else:
                self._scores[uniq] = torch.from_numpy(self.scores[ids]).to(self._scores.device)

    def _fetch(self, miss_ids: torch.Tensor) -> torch.Tensor:
        """Host gather of the missed rows into a staging buffer, then one copy to the device
        (non-blocking from pinned memory on CUDA)."""
        host_ids = miss_ids.cpu()
        if not self.on_cuda:
            return self.host.index_select(0, host_ids)
        if self._copied is not None:
            self._copied.synchronize()          # the previous copy has left the staging buffer
        if len(self._staging) < len(host_ids):
            self._staging = torch.empty(2 * len(host_ids), self.host.shape[1], dtype=self.host.dtype,
                                        pin_memory=True)
        staged = self._staging[: len(host_ids)]
        torch.index_select(self.host, 0, host_ids, out=staged)
        fetched = staged.to(self.pool.device, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        return fetched

    def _admit(self, miss_ids: torch.Tensor, fetched: torch.Tensor, keep: torch.Tensor) -> None:
        """Pair the best-scored misses with the coldest slots (empty first, never a slot in
        `keep`) and admit each miss that scores higher than the row it replaces."""
        n_slots = self.item_of.numel()
        if n_slots == 0:
            return
        k = min(len(miss_ids), n_slots)
        victims, victim_prio = self._coldest(k, keep)
        miss_scores = self._scores[miss_ids]
        order = torch.argsort(miss_scores, descending=True, stable=True)[:k]
        admit = self.policy.admits(miss_scores[order], victim_prio)
        victims, order = victims[admit], order[admit]
        old = self.item_of[victims]
        self.slot_of[old[old != EMPTY]] = EMPTY
        self.item_of[victims] = miss_ids[order]
        self.slot_of[miss_ids[order]] = victims
        self.rows_view().index_copy_(0, victims, fetched[order])

    def _prio(self, slots: torch.Tensor) -> torch.Tensor:
        items = self.item_of[slots]
        return torch.where(items != EMPTY, self._scores[items.clamp(min=0)], float("-inf"))

    def _coldest(self, k: int, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The k slots of lowest (priority, slot index), none in `keep`, and their priorities,
        coldest first. Small caches (or large k): a selection over every slot. Large caches:
        the same answer from the pool of the POOL coldest slots found at the pool's last refill.
        A slot outside the pool was above the pool's edge then and still is: scores only grow
        (LFU's rare rescale drops the pool, as do resizes and `warm`), and a row is admitted only
        in place of one that scores lower, so a slot that changes hands outside the pool (a large
        batch's full sort) still scores above the edge. So the pool's entries still at or below
        the edge are the coldest of the whole cache; when fewer than k are, the pool is refilled
        (and if that is not enough, every slot is sorted)."""
        n = self.item_of.numel()
        if n <= 2 * self.POOL or k > self.POOL // 2:
            return self._coldest_of(torch.arange(n, device=self.item_of.device), k, keep)
        for _ in range(2):
            if self._pool is None or self.policy.rescales != self._pool_rescales:
                self._refill_pool()
            slots, prio = self._coldest_of(self._pool, k, keep)
            edge_prio, edge_slot = self._pool_edge
            last_prio, last_slot = float(prio[-1]), int(slots[-1])
            if last_prio < edge_prio or (last_prio == edge_prio and last_slot <= edge_slot):
                return slots, prio
            self._pool = None                   # used up (or `keep` covers most of it): refill
        return self._coldest_of(torch.arange(n, device=self.item_of.device), k, keep)

    def _coldest_of(self, cand: torch.Tensor, k: int, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The k coldest of `cand` (slot indices, ascending), ties to the lower slot: the k-th
        priority from a top-k, the slots below it and the first ones at it, a stable sort of those."""
        prio = self._prio(cand)
        kept = torch.zeros(self.item_of.numel(), dtype=torch.bool, device=cand.device)
        kept[keep] = True                       # (torch.isin here cost more than the sort)
        prio[kept[cand]] = float("inf")
        if k < len(cand):
            kth = torch.topk(prio, k, largest=False, sorted=False).values.max()
            below = torch.nonzero(prio < kth).flatten()
            at = torch.nonzero(prio == kth).flatten()[:k - len(below)]
            pick = torch.sort(torch.cat([below, at])).values
        else:
            pick = torch.arange(len(cand), device=cand.device)
        prio, order = torch.sort(prio[pick], stable=True)
        return cand[pick[order]], prio

    def _refill_pool(self) -> None:
        dev = self.item_of.device
        slots, prio = self._coldest_of(torch.arange(self.item_of.numel(), device=dev), self.POOL,
                                       torch.zeros(0, dtype=torch.int64, device=dev))
        self._pool = torch.sort(slots).values
        self._pool_edge = (float(prio[-1]), int(slots[-1]))
        self._pool_rescales = self.policy.rescales

    def warm(self, shares, per_lookup: float = 1.0) -> int:
        """Start from a popularity snapshot (the simulated node's `EmbCache.warm`): `shares`, one
        per item, become the scores that `per_lookup` ids a lookup would settle at under this
        policy's aging, and the empty slots take the highest-scored rows not yet resident (one
        gather and copy). Returns the rows loaded."""
        s = np.asarray(torch.as_tensor(shares, dtype=torch.float64).cpu()).reshape(-1)
        if s.size != self.n_items or not np.isfinite(s).all() or (s < 0).any():
            raise ValueError(f"warm needs {self.n_items} finite shares >= 0, got {s.size}")
        self.scores[:] = self.policy.settled(s, per_lookup)
        if self._mirrored:
            self._scores.copy_(torch.from_numpy(self.scores))
        self._pool = None
        empty = (self.item_of == EMPTY).nonzero().reshape(-1)
        free = (self.slot_of == EMPTY).cpu().numpy()
        hottest = top(np.where(free, self.scores, -np.inf), min(len(empty), int(free.sum())))
        ids = torch.from_numpy(hottest[self.scores[hottest] > 0]).to(self.pool.device)
        if len(ids):
            slots = empty[: len(ids)]
            self.rows_view().index_copy_(0, slots, self._fetch(ids))
            self.item_of[slots] = ids
            self.slot_of[ids] = slots
        return len(ids)

    # -- the shadow -----------------------------------------------------------------------
    def track_shadow(self, rows: int) -> None:
        """Count the misses on the `rows` best-scored rows not resident, ranked now and at each
        `refresh` (0: stop)."""
        self.shadow_rows = max(0, int(rows))
        self._shadow = None
        if self.shadow_rows:
            self._rank_shadow()

    def refresh(self) -> None:
        """Re-rank the shadow from the scores now (the simulated cache's refresh re-ranks its rows
        here; this one admits on every lookup, so only the shadow follows the refresh)."""
        self.refreshes += 1
        if self.shadow_rows:
            self._rank_shadow()

    def _rank_shadow(self) -> None:
        absent = (self.slot_of == EMPTY).cpu().numpy()
        scores = np.where(absent & (self.scores > 0), self.scores, -np.inf)
        k = min(self.shadow_rows, int(np.isfinite(scores).sum()))
        shadow = scores >= np.partition(scores, -k)[-k] if k else np.zeros(self.n_items, bool)   # ties with the k-th
        self._shadow = torch.from_numpy(shadow).to(self.pool.device)

    # -- resize ---------------------------------------------------------------------------
    def on_resize(self, covered: range) -> None:
        """Follow a pool resize: slots the pool took are dropped, new slots start empty."""
        n_old, n_new = self.item_of.numel(), self.pool.n_rows
        self._pool = None
        expected = range(min(n_old, n_new), max(n_old, n_new))
        if covered != expected:
            raise ValueError(f"EMB slots {covered} do not match the pool's move from {n_old} to {n_new} rows")
        if n_new < n_old:
            gone = self.item_of[n_new:]
            self.slot_of[gone[gone != EMPTY]] = EMPTY
            self.item_of = self.item_of[:n_new].clone()
        elif n_new > n_old:
            fresh = torch.full((n_new - n_old,), EMPTY, dtype=torch.int64, device=self.pool.device)
            self.item_of = torch.cat([self.item_of, fresh])

    # -- reporting ------------------------------------------------------------------------
    def size_info(self) -> SizeInfo:
        entries = int((self.item_of != EMPTY).sum())
        return SizeInfo(self.item_of.numel() * self.pool.row_bytes, entries * self.pool.row_bytes, entries)

    def check_integrity(self) -> None:
        """The two maps are inverse of each other and every slot is inside the EMB region."""
        assert self.item_of.numel() == self.pool.n_rows, (self.item_of.numel(), self.pool.n_rows)
        slots = torch.nonzero(self.item_of != EMPTY).flatten()
        items = self.item_of[slots]
        assert torch.equal(self.slot_of[items], slots), "item_of and slot_of disagree"
        assert int((self.slot_of != EMPTY).sum()) == len(slots), "an item maps to a slot that does not hold it"
