"""Node failures in the simulated cluster: a node goes down at a given time — its
queued and in-service requests are routed again, none lost — and may come back cold."""
from __future__ import annotations

from collections import deque

from helmgr.routing.residency import ResidencyReporter
from helmgr.sim.tenancy import node_queue


class Faults:
    """The cluster's failure handling (`Cluster` is one): what happens to the queues, the router,
    the policy and the residency index when a node goes down or comes back."""

    def node_down(self, n: int) -> None:
        """Node n fails: its queued and in-service requests are routed again (counted)."""
        if not self.up[n]:
            return
        slot = self.slots[n]
        self.up[n] = False
        stranded = [req for served, _ in slot.inflight for req, _ in served] + list(slot.queue)
        slot.gen += 1
        slot.queue = node_queue(self.cfg, self, slot.queue)
        slot.inflight, slot.busy, slot.refill_at = deque(), False, None
        slot.compute_free = 0.0
        self.router.node_down(n)
        self.rec.ratio_change(self.now, n, None)
        for req in stranded:
            req.rerouted = 1
            self.rec.requeued[req.rid] = self.now
        self.rerouted += len(stranded)
        if self.cfg.central_queue:
            self.shared.extendleft(reversed(stranded))
            self._start_idle()
        else:
            for req in stranded:
                self.arrive(req)

    def _start_idle(self) -> None:
        for i, s in enumerate(self.slots):
            if self.up[i] and not s.busy and self.shared:
                self.start(i, [self.shared.popleft()])

    def node_up(self, n: int) -> None:
        if self.up[n]:
            return
        slot = self.slots[n]
        self.retired.append(slot.node)
        slot.node = self._fresh_node(n)     # HBM state is gone: cold KV, EMB reloaded warm
        self.windows.restart(n, slot.node)
        self.policy.attach(n, slot.node)
        self.up[n] = True
        self.router.node_up(n)
        if self.reporters is not None:
            self.reporters[n] = ResidencyReporter(n, slot.node, after=self.reporters[n])
            self.report(n, emb=True)
        self.rec.ratio_change(self.now, n, slot.node.ratio)
        if self.cfg.central_queue:
            self._start_idle()
