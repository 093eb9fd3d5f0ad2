"""Residency reports between a serving replica and the routers (SPEC 7 and 9).

Replica side, `Reporter` turns its runtime's state into one small JSON-able dict, which Ray Serve
pulls with `record_routing_stats` and broadcasts to every router of the deployment:
- `kv_first`, `kv_events`: the last `RECENT` KV events `(user, tokens now cached; 0 = gone)`,
  numbered from `kv_first`. A router applies the ones newer than what it holds, so reports it
  never saw (Ray keeps only the latest) lose nothing unless more than `RECENT` events passed;
- `emb_version`, `emb_bits`: the resident rows as a packed little-endian bitmap over item ids,
  base64; the version moves only when the rows or the miss rate changed, so an idle replica's
  report stays equal and Ray broadcasts nothing;
- `history_miss`: miss rate of computed-token rows since the last new version (-1: none);
- `ratio`, `requests`: for metrics and logs.

Router side, `apply_report` feeds it to the simulator's `ResidencyIndex` as a `KVBatch` and an
`EmbSummary`: the same index and scoring code as the simulated cluster.
"""
from __future__ import annotations

import base64
from collections import deque

import numpy as np

from helmgr.real.emb import EMPTY
from helmgr.sim.residency import EmbSummary, KVBatch, ResidencyIndex


class Reporter:
    RECENT = 4096

    def __init__(self, runtime):
        self.runtime = runtime
        runtime.kv.events = []
        self.kv_version = 0
        self.recent: deque[tuple[int, int]] = deque(maxlen=self.RECENT)
        self.emb_version = 0
        self._bits = b""
        self._tokens = (0, 0)
        self._miss = -1.0

    def report(self) -> dict:
        rt = self.runtime
        events, rt.kv.events = rt.kv.events, []
        self.recent.extend(events)
        self.kv_version += len(events)
        bits = np.packbits((rt.emb.slot_of != EMPTY).cpu().numpy(), bitorder="little").tobytes()
        s = rt.stats
        ids, misses = s.token_ids - self._tokens[0], s.token_misses - self._tokens[1]
        if bits != self._bits or ids:
            self.emb_version += 1
            self._bits, self._tokens = bits, (s.token_ids, s.token_misses)
            self._miss = misses / ids if ids else -1.0
        return {"kv_first": self.kv_version - len(self.recent) + 1, "kv_events": [list(e) for e in self.recent],
                "emb_version": self.emb_version, "emb_bits": base64.b64encode(self._bits).decode("ascii"),
                "history_miss": self._miss, "ratio": round(rt.ratio, 6), "requests": s.requests}


def apply_report(index: ResidencyIndex, node: int, stats: dict) -> bool:
    """Apply one replica's report to the index; False if it was malformed (then nothing of it is
    applied). An empty dict (no report yet) is fine."""
    if not stats:
        return True
    try:
        events = [(int(u), int(t)) for u, t in stats["kv_events"]]
        first, version = int(stats["kv_first"]), int(stats["emb_version"])
        miss = float(stats["history_miss"])
        bits = None
        if version > index.emb_version[node]:
            bits = np.frombuffer(base64.b64decode(stats["emb_bits"]), np.uint8)
            if len(bits) != index.bits.shape[1]:
                return False
    except (KeyError, TypeError, ValueError):
        return False
    if events and first + len(events) - 1 > index.kv_version[node]:    # re-sent reports: nothing new
        index.apply_kv(KVBatch(node, first, events))
    if bits is not None:
        index.apply_summary(EmbSummary(node, version, bits, miss, 0.0, 0.0, 0.0))
    return True
