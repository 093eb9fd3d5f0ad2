"""Residency reports between a serving replica and the routers.

Replica side, `Reporter` turns its runtime's state into one small JSON-able dict, which Ray Serve
pulls with `record_routing_stats` and broadcasts to every router of the deployment:
- `kv_first`, `kv_events`: the last `RECENT` KV events `(user, tokens now cached; 0 = gone)`,
  numbered from `kv_first`. A router applies the ones newer than what it holds, so reports it
  never saw (Ray keeps only the latest) lose nothing unless more than `RECENT` events passed;
- `emb_version`, `emb_first`, `emb_delta`, `emb_bits`: the resident rows. The version moves
  only when the rows or the miss rate changed. `emb_delta` holds the changes of versions
  `emb_first`..`emb_version` (per version: the rows that came and went, int32 ids, base64), at
  most `FULL_EVERY` versions and half the bitmap's size; `emb_bits`, the whole packed little-endian bitmap over item ids
  (base64), comes every `FULL_EVERY`-th version, with a change too large for the delta ring,
  and whenever nothing changed since the last report (so a router that missed too much, or
  joined late, catches up at the latest once the replica is idle; an idle replica's report then
  stays equal and Ray broadcasts nothing). A busy replica sends its churn, not its whole cache;
- `history_miss`: miss rate of computed-token rows, over at least the last
  `HISTORY_MIN_IDS` lookups (`helmgr.routing.residency.history_miss_rate`; -1: none yet);
- `ratio`, `requests`: for metrics and logs.

Router side, `helmgr.routing.report.apply_report` reads it into the same `ResidencyIndex` the
simulated cluster feeds.
"""
from __future__ import annotations

import base64
from collections import deque

import numpy as np

from helmgr.real.emb import EMPTY
from helmgr.routing.report import b64_ids
from helmgr.routing.residency import history_miss_rate


class Reporter:
    RECENT = 4096              # KV events kept for routers that missed reports
    FULL_EVERY = 16            # a whole EMB bitmap at least every this many versions

    def __init__(self, runtime):
        self.runtime = runtime
        runtime.kv.events = []
        self.kv_version = 0
        self.recent: deque[tuple[int, int]] = deque(maxlen=self.RECENT)
        self.emb_version = 0
        self._resident = np.zeros(runtime.emb.n_items, bool)
        # EMB row changes kept: at 32 bits an id, at most half the bitmap's size
        self.emb_recent = max(1, runtime.emb.n_items // 64)
        self._changes: deque[tuple[int, str, str, int]] = deque()   # (version, added, removed, rows)
        self._rows = 0
        self._full = True          # the next report carries the bitmap
        self._tokens = (0, 0)
        self._miss = -1.0

    def report(self) -> dict:
        rt = self.runtime
        events, rt.kv.events = rt.kv.events, []
        self.recent.extend(events)
        self.kv_version += len(events)
        resident = (rt.emb.slot_of != EMPTY).cpu().numpy()
        s = rt.stats
        ids, misses = s.token_ids - self._tokens[0], s.token_misses - self._tokens[1]
        changed = resident != self._resident
        if changed.any() or ids:
            self.emb_version += 1
            added, removed = np.flatnonzero(changed & resident), np.flatnonzero(changed & ~resident)
            rows = len(added) + len(removed)
            if rows > self.emb_recent:               # cheaper as a bitmap: restart the ring after it
                self._changes.clear()
                self._rows, self._full = 0, True
            else:
                self._changes.append((self.emb_version, b64_ids(added), b64_ids(removed), rows))
                self._rows += rows
                while self._rows > self.emb_recent or len(self._changes) > self.FULL_EVERY:
                    self._rows -= self._changes.popleft()[3]
                self._full = self.emb_version % self.FULL_EVERY == 0
            self._resident, self._tokens = resident, (s.token_ids, s.token_misses)
            self._miss = history_miss_rate(misses, ids, self._miss)
        else:
            self._full = True                        # idle: settle on a report a late router can use
        first = self._changes[0][0] if self._changes else self.emb_version + 1
        bits = np.packbits(self._resident, bitorder="little").tobytes() if self._full else b""
        return {"kv_first": self.kv_version - len(self.recent) + 1, "kv_events": [list(e) for e in self.recent],
                "emb_version": self.emb_version, "emb_first": first,
                "emb_delta": [[v, a, r] for v, a, r, _ in self._changes],
                "emb_bits": base64.b64encode(bits).decode("ascii"),
                "history_miss": self._miss, "ratio": round(rt.ratio, 6), "requests": s.requests}
