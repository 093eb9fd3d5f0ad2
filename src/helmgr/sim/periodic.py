"""What the cluster does on its own clock (`Cluster` is one): metrics windows closed and shown to
the policy, controller ticks that ask it for a ratio, EMB refreshes, and the resizes and refill
steps they start."""
from __future__ import annotations

from helmgr.sim.events import REFILL, REFRESH, TICK, WINDOW


class Periodic:
    """The cluster's periodic events and node resizes: the methods read the cluster's slots,
    policy, recorder, windows and reporters, and push onto its heap."""

    # -- periodic events --------------------------------------------------------------------
    def window(self) -> None:
        """Close a metrics window: record it, and show each up node's window to the policy."""
        now, span = self.now, self.cfg.window_s
        queues, loads = [self.queue_len(i) for i in range(len(self.slots))], []
        for i, s in enumerate(self.slots):
            w = self.windows.close(i, s.node, now, span, queues[i])
            loads.append(max(w.busy_s, w.h2d_busy_s) / span if self.up[i] else float("nan"))
            if self.up[i]:
                self.policy.observe(i, w, s.node)
        self.rec.window(now, queues, loads)
        if not self.stop_periodic:
            self.push(now + span, WINDOW)

    def tick(self) -> None:
        now = self.now
        for i, s in enumerate(self.slots):
            if self.up[i]:
                ratio = self.policy.decide(i, s.node, now)
                if ratio is not None:
                    self.set_ratio(i, ratio)
        if not self.stop_periodic:
            self.push(now + self.cfg.tick_s, TICK)

    def refresh(self) -> None:
        for i, s in enumerate(self.slots):
            if self.up[i]:
                self._schedule_refill(i, s.node.refresh(self.now))
                if self.reporters is not None:
                    self.report(i, emb=True)
        if not self.stop_periodic:
            self.push(self.now + self.cfg.refresh_s, REFRESH)

    # -- memory ---------------------------------------------------------------------------
    def set_ratio(self, i: int, ratio: float) -> None:
        """Resize node i's pool now (if that moves a page) and start its refill."""
        if self.engine is not None:
            self.engine.set_ratio(i, ratio, self._set_ratio)
        else:
            self._set_ratio(i, ratio)

    def _set_ratio(self, i: int, ratio: float) -> None:
        node = self.slots[i].node
        if node.pool.pages_for(ratio) != node.pool.emb_pages:
            _, wake = node.resize(ratio, self.now)
            self._schedule_refill(i, wake)
            self.rec.ratio_change(self.now, i, node.ratio)
            if self.reporters is not None:
                self.report(i, emb=True)

    def _schedule_refill(self, n: int, wake: float | None) -> None:
        if wake is not None and self.slots[n].refill_at is None:
            self.slots[n].refill_at = wake
            self.push(wake, REFILL, n)
