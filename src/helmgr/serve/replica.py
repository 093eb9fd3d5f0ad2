"""The backend deployment: one replica per node, each a `ServeNode` (runtime, pool, local
controller, reporter).

A replica warms up in its constructor (`ServeNode.warm_up`: first model calls, the controller's
kernels), so Ray marks it running only once the first requests no longer pay for that. Requests
go through a `Worker` (`helmgr.serve.worker`): one at a time, the lowest band of a class table
first (`band`, from the ingress), cheapest predicted first within it, and one
that cannot finish by its deadline is answered
`{"late": why}` without being served. The controller ticks every `window_s` on an asyncio task,
ahead of the queue; `record_routing_stats` hands Ray the residency report that the HELM router
reads. The ingress sends what is left of a request's deadline (`budget_s`), not a time: the
replica turns it into a deadline on its own clock, so clocks that differ between hosts cut
nothing early or late."""
from __future__ import annotations

import asyncio
import time

from ray import serve

from helmgr.serve.config import ServeConfig
from helmgr.serve.node import ServeNode
from helmgr.serve.worker import Worker


class Backend:
    def __init__(self, cfg: dict):
        import torch

        torch.set_num_threads(1)          # one node, one core: torch's default threads fight each other
        self.cfg = ServeConfig.from_dict(cfg)
        self.node = ServeNode(self.cfg)
        self.node.warm_up()
        self.worker = Worker(self.node)
        self.name = serve.get_replica_context().replica_id.unique_id
        self.ticker: asyncio.Task | None = None

    def _start_ticker(self) -> None:
        if self.ticker is None and self.cfg.controller:
            self.ticker = asyncio.get_running_loop().create_task(self._tick_forever())

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.window_s)
            await self.worker.alone(lambda: self.node.tick(self.worker.gate.waiting))

    async def __call__(self, *, user_id: int, prefix_len: int, new_items: list[int], candidates: list[int],
                       budget_s: float | None = None, warmup: bool = False, band: int = 0) -> dict:
        self._start_ticker()
        deadline = time.time() + (self.cfg.deadline_s if budget_s is None else budget_s)
        return await self.worker.serve(user_id, prefix_len, new_items, candidates, deadline, warmup,
                                       band) | {"node": self.name}

    async def record_routing_stats(self) -> dict:
        self._start_ticker()
        return await self.worker.alone(self.node.report)


def backend_deployment(cfg: ServeConfig):
    """`Backend` as a deployment with the HELM router and the config's replicas and resources."""
    from ray.serve.config import RequestRouterConfig

    from helmgr.serve.router import HelmRequestRouter

    actor = {"num_cpus": cfg.replica_cpus} | ({"num_gpus": 1} if cfg.device == "cuda" else {})
    return serve.deployment(Backend, num_replicas=cfg.replicas, max_ongoing_requests=cfg.max_ongoing,
                            ray_actor_options=actor, request_router_config=RequestRouterConfig(
                                request_router_class=HelmRequestRouter, request_router_kwargs=cfg.to_dict(),
                                request_routing_stats_period_s=cfg.stats_period_s,
                                request_routing_stats_timeout_s=max(5.0, 4 * cfg.stats_period_s)))
