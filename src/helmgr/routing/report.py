"""The residency report's router side: a serving replica's report
(helmgr.serve.report.Reporter writes it) applied to a `ResidencyIndex` as a `KVBatch` and an
`EmbSummary` — the same index and scoring code as the simulated cluster."""
from __future__ import annotations

import base64

import numpy as np

from helmgr.routing.residency import EmbSummary, KVBatch, ResidencyIndex


def b64_ids(a: np.ndarray) -> str:
    """Item ids as base64 of little-endian int32 (the wire form of a report's row changes)."""
    return base64.b64encode(np.ascontiguousarray(a, "<i4").tobytes()).decode("ascii")


def _ids(text: str) -> np.ndarray:
    """`b64_ids` read back."""
    return np.frombuffer(base64.b64decode(text), "<i4").astype(np.int64)


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
        have = index.emb_version[node]
        if version > have:
            bits = np.frombuffer(base64.b64decode(stats["emb_bits"]), np.uint8)
            if not len(bits):                        # no bitmap: the changes since `have`, if kept
                bits = None
                if have + 1 >= int(stats.get("emb_first", version + 1)):
                    bits = index.bits[node].copy()
                    for v, added, removed in stats["emb_delta"]:
                        if int(v) > have:
                            _set(bits, _ids(added), True)
                            _set(bits, _ids(removed), False)
            elif len(bits) != index.bits.shape[1]:
                return False
    except (KeyError, TypeError, ValueError, IndexError):
        return False
    if events and first + len(events) - 1 > index.kv_version[node]:    # re-sent reports: nothing new
        index.apply_kv(KVBatch(node, first, events))
    if bits is not None:
        index.apply_summary(EmbSummary(node, version, bits, miss, 0.0, 0.0, 0.0))
    return True


def _set(bits: np.ndarray, ids: np.ndarray, on: bool) -> None:
    """Set (or clear) the rows `ids` in a packed little-endian bitmap."""
    if not len(ids):
        return
    masks = np.left_shift(1, ids & 7).astype(np.uint8)
    if on:
        np.bitwise_or.at(bits, ids >> 3, masks)
    else:
        np.bitwise_and.at(bits, ids >> 3, ~masks)
