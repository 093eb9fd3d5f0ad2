"""The HELM router as a Ray Serve custom request router (Ray Serve >= 2.48, alpha API).

It sits on the backend deployment, so it runs in each process that holds a handle to it (the
ingress replicas), one instance per handle. It reads the request's plain kwargs (`user_id`,
`prefix_len`, `new_items`, `candidates`), asks `HelmRouting` (the simulator's `Helm` router over
replica-reported residency) for an order, and returns it as singleton ranks, so Ray tries the
replicas strictly in that order. Nothing here makes a remote call per request: residency comes
with Ray's replica-set broadcasts (`routing_stats`), load is counted at accept and completion.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np
from ray.serve.request_router import PendingRequest, ReplicaID, ReplicaResult, RequestRouter, RunningReplica

from helmgr.serve.config import ServeConfig
from helmgr.serve.routing import HelmRouting


class HelmRequestRouter(RequestRouter):
    def initialize_state(self, **cfg) -> None:
        self.helm_state = HelmRouting(ServeConfig.from_dict(cfg))

    def update_replicas(self, replicas: List[RunningReplica]) -> None:
        super().update_replicas(replicas)
        state = getattr(self, "helm_state", None)
        if state is not None:
            state.sync([(r.replica_id, r.routing_stats or {}) for r in replicas])

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {r.replica_id: r for r in candidate_replicas}
        kw, request_id = {}, None
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True      # else a full pass spins hot
            kw, request_id = pending_request.kwargs, pending_request.metadata.internal_request_id
        user = kw.get("user_id")
        new, cands = kw.get("new_items"), kw.get("candidates")
        order = self.helm_state.rank(
            list(by_id), request_id, None if user is None else int(user), int(kw.get("prefix_len", 0)),
            None if new is None else np.asarray(new, np.int64), None if cands is None else np.asarray(cands, np.int64))
        return [[by_id[r]] for r in order]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: ReplicaResult) -> None:
        kw = pending_request.kwargs
        user = kw.get("user_id")
        tokens = int(kw.get("prefix_len", 0)) + len(kw.get("new_items", ()))
        self.helm_state.routed(replica_id, pending_request.metadata.internal_request_id,
                               None if user is None else int(user), tokens)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self.helm_state.completed(replica_id, internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.helm_state.drop(replica_id)
