"""The backend deployment: one replica per node, each a `ServeNode` (runtime, pool, local
controller, reporter). Requests are served one at a time (one lock around the runtime; the
work runs in a thread so the replica's event loop stays free for Ray's calls); the controller
ticks every `window_s` on an asyncio task; `record_routing_stats` hands Ray the residency report
that the HELM router reads."""
from __future__ import annotations

import asyncio
import time

import numpy as np
from ray import serve

from helmgr.serve.config import ServeConfig
from helmgr.serve.node import ServeNode


class Backend:
    def __init__(self, cfg: dict):
        import torch

        torch.set_num_threads(1)          # one node, one core: torch's default threads fight each other
        self.cfg = ServeConfig.from_dict(cfg)
        self.node = ServeNode(self.cfg)
        self.name = serve.get_replica_context().replica_id.unique_id
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.ticker: asyncio.Task | None = None

    def _start_ticker(self) -> None:
        if self.ticker is None and self.cfg.controller:
            self.ticker = asyncio.get_running_loop().create_task(self._tick_forever())

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.window_s)
            async with self.lock:
                self.node.tick(self.waiting)

    async def __call__(self, *, user_id: int, prefix_len: int, new_items: list[int], candidates: list[int]) -> dict:
        self._start_ticker()
        t0 = time.perf_counter()
        self.waiting += 1
        try:
            await self.lock.acquire()
        finally:
            self.waiting -= 1
        try:
            out = await asyncio.to_thread(self.node.serve, user_id, prefix_len, np.asarray(new_items, np.int64),
                                          np.asarray(candidates, np.int64))
            self.node.finished(time.perf_counter() - t0)
        finally:
            self.lock.release()
        return out | {"node": self.name, "replica_ms": (time.perf_counter() - t0) * 1e3}

    async def record_routing_stats(self) -> dict:
        self._start_ticker()
        async with self.lock:
            return self.node.report()


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
