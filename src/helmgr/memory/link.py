"""The node's host-to-device link: one FIFO server shared by EMB misses, KV onloads and refills
(docs/node.md) — its contention is what couples the two caches."""
from __future__ import annotations

EMB_MISS = "emb_miss"
KV_ONLOAD = "kv_onload"
REFILL = "refill"
CAUSES = (EMB_MISS, KV_ONLOAD, REFILL)


class H2DLink:
    """Transfers start when the link frees up, in the order they are asked for."""

    def __init__(self, bandwidth: float, latency_s: float):
        if bandwidth <= 0 or latency_s < 0:
            raise ValueError(f"link needs bandwidth > 0 and latency >= 0, got {bandwidth}, {latency_s}")
        self.bandwidth = bandwidth
        self.latency_s = latency_s
        self.busy_until = 0.0
        self.busy_s = 0.0
        self.bytes_by_cause = dict.fromkeys(CAUSES, 0)

    def transfer(self, now: float, nbytes: int, cause: str) -> float:
        """Queue a copy of `nbytes` at time `now`; return when it completes."""
        if nbytes <= 0:
            return now
        start = now if now > self.busy_until else self.busy_until
        duration = self.latency_s + nbytes / self.bandwidth
        self.busy_until = start + duration
        self.busy_s += duration
        self.bytes_by_cause[cause] += nbytes
        return self.busy_until

    def backlog_s(self, now: float) -> float:
        """Seconds of queued transfers still ahead of a copy asked for at `now`."""
        return max(0.0, self.busy_until - now)
