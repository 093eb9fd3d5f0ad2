"""What the HELM router knows about each node: a residency index fed by node events.

Node side, a `ResidencyReporter` turns one node's state changes into versioned reports:
- **KV events** `(user, tokens now cached)` on every insert, eviction and trim, numbered per node
  and sent in batches (`KVBatch`);
- an **EMB summary** after every refresh and resize (`EmbSummary`): the node's resident rows as a
  packed bitmap over item ids (testing a request's ids against it is one gather), the miss rate of
  its recent history-row lookups (for the prefix rows a recompute would look up, which the router
  has no ids for), and its refill state.

Router side, a `ResidencyIndex` applies them. Reports may come late, out of order or not at all
(a remote replica's are sent over the network): a summary older than the one held is dropped, a
gap in KV event numbers is counted and the batch applied anyway. Wrong knowledge makes a worse
choice — a request sent to a node that no longer holds the prefix pays the recompute there —
never a broken one.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from helmgr.memory.emb import RESIDENT
from helmgr.memory.refill import BackgroundRefill

UNKNOWN_MISS = 0.5          # history-row miss rate assumed for a node that has not reported one
HISTORY_MIN_IDS = 32_768    # the lookups a reported history miss rate rests on, at the least
# columns of ResidencyIndex.node (one float64 row per node, read by the router's compiled kernel)
BLOCKED, REFILL_UNTIL, CHUNK_S, HISTORY_MISS = range(4)


def history_miss_rate(misses: int, ids: int, previous: float) -> float:
    """The history-row miss rate a node reports: `misses` of its `ids` computed-token row lookups
    since its last report, over at least HISTORY_MIN_IDS lookups — a smaller sample is topped up
    with the `previous` rate it reported. `previous` < 0 (none yet): the sample alone; no sample:
    `previous` again.

    A summary follows every resize as well as every refresh, so a sample can be a few ms of
    lookups: a resize 10 ms after a refresh reported 0.035 for a node whose rate was 0.33 (burst
    seed 1), the router sent that node the burst's cold prefixes for a second, and it served the
    window's slowest requests (P99 30 ms; docs/results/2026-12-02-history-miss.md). Rows of one
    request's history are correlated: over 32k lookups the rate still spreads ±0.05 on steady."""
    if ids <= 0:
        return previous
    if previous < 0 or ids >= HISTORY_MIN_IDS:
        return misses / ids
    return (misses + previous * (HISTORY_MIN_IDS - ids)) / HISTORY_MIN_IDS


class KVBatch(NamedTuple):
    node: int
    first: int                          # version of the first event; the rest follow by one
    events: list[tuple[int, int]]       # (user, tokens now cached); 0 = evicted


class EmbSummary(NamedTuple):
    node: int
    version: int
    bits: np.ndarray                    # packed little-endian bitmap over item ids, 1 = resident
    history_miss: float                 # miss rate of computed-token rows (history_miss_rate; < 0: none yet)
    blocked_until: float                # a sync refill holds the node until then
    refill_until: float                 # background refill traffic expected until then
    refill_chunk_s: float               # link time of one background chunk (what a miss may wait behind)


class ResidencyReporter:
    """Publishes one node's residency. Switches on the node's KV event log. A node that restarts
    gets a reporter that carries on its predecessor's version numbers."""

    def __init__(self, index: int, node, after: "ResidencyReporter | None" = None):
        self.index, self.node = index, node
        node.kv.events = []
        self.kv_version = after.kv_version if after else 0
        self.emb_version = after.emb_version if after else 0
        self._tokens = (node.stats.token_ids, node.stats.token_misses)
        self._miss = -1.0                 # no history miss rate yet (a restarted node's HBM is new)

    def kv_batch(self) -> KVBatch | None:
        """The KV events since the last batch, or None."""
        events = self.node.kv.events
        if not events:
            return None
        batch = KVBatch(self.index, self.kv_version + 1, events)
        self.kv_version += len(events)
        self.node.kv.events = []
        return batch

    def summary(self, now: float) -> EmbSummary:
        node = self.node
        s = node.stats
        ids, misses = s.token_ids - self._tokens[0], s.token_misses - self._tokens[1]
        self._tokens = (s.token_ids, s.token_misses)
        self._miss = history_miss_rate(misses, ids, self._miss)
        refill_until = chunk_s = 0.0
        if isinstance(node.refill, BackgroundRefill) and node.refill.active and node.emb.unfilled_rows:
            bw = node.link.bandwidth
            refill_until = now + node.emb.unfilled_rows * node.emb.row_bytes / (node.refill.share * bw)
            chunk_s = node.refill.chunk_bytes / bw
        self.emb_version += 1
        return EmbSummary(self.index, self.emb_version,
                          np.packbits(node.emb.state == RESIDENT, bitorder="little"),
                          self._miss, node.blocked_until, refill_until, chunk_s)


class ResidencyIndex:
    """The router's view: who holds which prefix, which rows each node has, each node's refill."""

    def __init__(self, n_nodes: int, n_items: int, sample_shift: int = 0):
        """`n_items` rows of the nodes' EMB caches, which track one item id in 2**sample_shift."""
        self.n_items, self.sample_shift = n_items, sample_shift
        self.holders: dict[int, dict[int, int]] = {}      # user -> {node: cached tokens}
        self.kv_version = [0] * n_nodes
        self.bits = np.zeros((n_nodes, (n_items + 7) // 8), np.uint8)   # nothing known: all misses
        self.emb_version = [0] * n_nodes
        self.node = np.zeros((n_nodes, 4))              # BLOCKED, REFILL_UNTIL, CHUNK_S, HISTORY_MISS
        self.node[:, HISTORY_MISS] = UNKNOWN_MISS
        self.gaps = 0                   # KV batches that skipped versions (lost events)
        self.stale = 0                  # reports dropped as older than what was held

    def apply_kv(self, batch: KVBatch) -> None:
        n, first, events = batch
        held = self.kv_version[n]
        last = first + len(events) - 1
        if last <= held:
            self.stale += 1
            return
        if first > held + 1:
            self.gaps += 1
        elif first <= held:                     # overlap: skip what was applied already
            events = events[held + 1 - first:]
        self.apply_events(n, events)
        self.kv_version[n] = last

    def apply_events(self, n: int, events) -> None:
        """Node n's KV events `(user, tokens now cached)`, in order, into `holders`."""
        holders = self.holders
        for user, tokens in events:
            if tokens:
                self.expect(n, user, tokens)
                continue
            where = holders.get(user)
            if where is not None:
                where.pop(n, None)
                if not where:
                    del holders[user]

    def expect(self, node: int, user: int, tokens: int) -> None:
        """`node` holds (or, from the router at dispatch: will hold) `tokens` of `user`'s prefix."""
        where = self.holders.get(user)
        if where is None:
            self.holders[user] = {node: tokens}
        else:
            where[node] = tokens

    def apply_summary(self, s: EmbSummary) -> None:
        n = s.node
        if s.version <= self.emb_version[n]:
            self.stale += 1
            return
        self.emb_version[n] = s.version
        self.bits[n] = s.bits
        row = self.node[n]
        row[BLOCKED], row[REFILL_UNTIL], row[CHUNK_S] = s.blocked_until, s.refill_until, s.refill_chunk_s
        if s.history_miss >= 0:
            row[HISTORY_MISS] = s.history_miss

    def forget(self, node: int) -> None:
        """Node `node` lost its HBM (it went down): nothing of it is known any more. Versions are
        kept, so late reports from before the failure are still recognized as stale."""
        for user in [u for u, where in self.holders.items() if node in where]:
            where = self.holders[user]
            del where[node]
            if not where:
                del self.holders[user]
        self.bits[node] = 0
        self.node[node] = (0.0, 0.0, 0.0, UNKNOWN_MISS)

    def reset(self, node: int) -> None:
        """A new reporter takes `node` (a serving replica joined): forget it and start its
        versions from 0, as the new reporter numbers its reports."""
        self.forget(node)
        self.kv_version[node] = self.emb_version[node] = 0

    def resident(self, node: int, ids: np.ndarray) -> np.ndarray:
        """0/1 per item id: whether `node` reported its row resident."""
        rows = ids >> self.sample_shift
        return (self.bits[node, rows >> 3] >> (rows & 7).astype(np.uint8)) & 1
