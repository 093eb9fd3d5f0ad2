"""One serving replica's state, without Ray: the real data path, its pool, its local
controller and its residency reporter. `helmgr.serve.replica.Backend` wraps one of these.

Histories: from a history store (`ServeConfig.history` or `.redis`, shared by every replica and
the ingress), or else the synthetic workload's users (same config and seed on every replica), so
`history(user, a, b)` gives any user's items at positions a..b, which is what a KV miss
recomputes. The request's own new items are what is computed for positions prefix_len.. (the
client's word wins there). With a store, a served request that continues the user's history
(prefix_len = its length) has its new items appended, durably, before it is answered, so the next
request's prefix includes them. A store that cannot be reached (`StoreUnavailable`) makes the
answer `{"store_down": why}`: nothing appended (a Redis append is one transaction), no scores.
Synthetic users outside the population have no history: the
ingress sends them with prefix_len 0.

The model and item table: a checkpoint's (`ServeConfig.checkpoint`, `helmgr model train`; the
table memory-mapped), or else seeded random ones (the same on every replica).

The controller is the shipped HELM (`Controller.default()`: base policy, adapter v2, recovery;
or the same tiers around `ServeConfig.base_policy`, a base trained with `helmgr train --trace`),
the one `--policy helm` runs in the simulator, fed by the same code: each tick closes a window
(`core.window.node_window`, each request's EMB fetch and recompute seconds with its latency), the
runtime's caches keep the simulator's shadows (`policy.marginal.MarginalSampler`, 5 % of the pool
on each side), and every `refresh_s` the EMB shadow is re-ranked, which closes adapter v2's
sample as a simulated EMB refresh does. One difference: a replica's KV ghosts credit only its own
recomputes (the simulator's nodes share theirs across the cluster), since replicas are separate
processes.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from helmgr.history.store import StoreUnavailable
from helmgr.core.window import WindowStats, node_window
from helmgr.policy.helm import HelmPolicy
from helmgr.policy.marginal import MarginalSampler
from helmgr.real.runtime import NodeRuntime
from helmgr.serve.config import ServeConfig
from helmgr.serve.report import Reporter
from helmgr.workload import synthetic_workload


def with_new(history, prefix_len: int, new_ids: np.ndarray):
    """`history`, except that positions from `prefix_len` on are the request's `new_ids`."""
    def ids(user: int, start: int, stop: int) -> np.ndarray:
        head = history(user, start, min(stop, prefix_len)) if start < prefix_len else new_ids[:0]
        return np.concatenate([head, new_ids[max(start - prefix_len, 0):stop - prefix_len]])
    return ids


class ServeNode:
    def __init__(self, cfg: ServeConfig, clock: Callable[[], float] = time.perf_counter):
        self.cfg, self.clock = cfg, clock
        ckpt = None
        if cfg.checkpoint is not None:
            from helmgr.real.checkpoint import load
            ckpt = load(cfg.checkpoint)
        self.runtime = NodeRuntime(cfg.node_profile(), cfg.budget_bytes, cfg.device, cfg.seed, cfg.n_items,
                                   cfg.node_config(), checkpoint=ckpt)
        self.store = None
        if cfg.store:
            from helmgr.history import open_store, reader
            self.store = open_store(cfg.history, cfg.redis)
            self.history = reader(self.store)
        else:
            workload = synthetic_workload(cfg.workload_config(), cfg.seed)
            self.history = workload.history
            if cfg.warm and workload.prior is not None:        # as the simulated nodes start
                ids, requests, _ = workload.first_second_lookups()
                self.runtime.emb.warm(workload.prior, ids / requests if requests else 1.0)
        table = cfg.class_table()
        if table is not None:                   # a class table: the KV cache evicts by band (docs/tenancy.md)
            self.runtime.kv.set_groups(table.band_floors)
        self.reporter = Reporter(self.runtime)
        self.ctl = self.sampler = None
        if cfg.controller:
            self.ctl = cfg.controller_now()
            self.sampler = MarginalSampler(HelmPolicy.shadow_share, HelmPolicy.value)
            self.sampler.attach(0, self.runtime)
        self.decisions = 0
        self._window = (clock(), self.runtime.counters())
        self._refreshed = self._window[0]
        self._latencies: list[float] = []
        self._parts: tuple[list[float], list[float]] = ([], [])     # their EMB fetch and recompute seconds
        self._last = (0.0, 0.0)                                     # the request being served's
        self._arrivals = 0
        self.slowdown = 1.0                 # measured service / the cost model's, smoothed (see predict_s)

    def predict_s(self, user: int, prefix_len: int, n_new: int, n_candidates: int) -> float:
        """This node's expected service for a request: the cost model with the KV prefix it holds
        for `user`, scaled by how far this machine's measured service has been from the model's."""
        cached = min(self.runtime.kv.peek(user), prefix_len)
        return self.slowdown * self._model_s(prefix_len, cached, n_new, n_candidates)

    def _model_s(self, prefix_len: int, cached: int, n_new: int, n_candidates: int) -> float:
        """The cost model's service with every row resident (what a queued request is priced at,
        before its misses are known; `slowdown` is learned against the same figure)."""
        return self.runtime.cost.breakdown(prefix_len, cached, n_new, n_candidates, 0).total_s

    def warm_up(self, rounds: int = 2) -> None:
        """First model calls before the node takes traffic, so the first real requests do not pay
        for them: a cold prefill, a KV-hit extension and scoring, for users outside the synthetic
        population (no real user's prefix is cached by it); then the controller's compiled kernels
        on a throwaway controller. The window restarts afterwards (the warm-up is not traffic)."""
        cands = np.arange(self.cfg.candidates, dtype=np.int64) % self.cfg.n_items
        new = np.arange(8, dtype=np.int64)
        new %= self.cfg.n_items
        for k in range(rounds):
            user = self.cfg.n_users + k
            self.serve(user, 0, new, cands, append=False)                       # a cold prefill, cached ...
            self.serve(user, len(new), (new + 8) % self.cfg.n_items, cands, append=False, forget=True)  # a hit, gone
        if self.cfg.controller:
            self.cfg.controller_now().step(self.window(), 0.0)
        self.report()
        self.window()
        self.slowdown = 1.0                 # the warm-up's first calls are not this machine's speed

    def serve(self, user: int, prefix_len: int, new_ids: np.ndarray, cand_ids: np.ndarray, append: bool = True,
              forget: bool = False, in_time: Callable[[], bool] | None = None, band: int = 0) -> dict:
        """Serve one request; with a store and `append`, append its new items if the request
        continues the user's history. `band`: its class's band, its prefix's KV group under a class
        table. `forget`: drop the user's K/V afterwards (a warm-up's, which
        a real user of that id must not find). `in_time()`, asked once the model is done and
        before the append: False when the request no longer counts (it finished past its deadline,
        or its caller gave up); then nothing is appended and the answer is `{"late": why}`, so a
        504 leaves the store as it was and the user's next request reads the same prefix."""
        self._arrivals += 1
        self._last = (0.0, 0.0)
        if self.runtime.kv.floors is not None:
            self.runtime.kv.set_group(user, band)
        try:
            s = self.runtime.serve(self.clock(), user, prefix_len, new_ids, cand_ids,
                                   with_new(self.history, prefix_len, new_ids))
            if forget:
                self.runtime.kv.drop(user)
            late = in_time is not None and not in_time()
            appended = (not late and self.store is not None and append
                        and self.store.append(user, new_ids, at=prefix_len) is not None)
        except StoreUnavailable as exc:     # a KV miss could not read the history, or the append failed whole
            return {"store_down": str(exc)}
        self._last = (s.fetch_s, s.recompute_s)
        model_s = self._model_s(prefix_len, s.kv_tokens, len(new_ids), len(cand_ids))
        if model_s > 0:
            self.slowdown += 0.2 * (min(max(s.service_s / model_s, 0.5), 10.0) - self.slowdown)
        if late:
            return {"late": "it finished past its deadline (nothing appended)"}
        st = self.runtime.stats
        return {"scores": s.scores.float().cpu().tolist(), "kv_tokens": s.kv_tokens, "ids": s.ids,
                "misses": s.misses, "service_ms": s.service_s * 1e3, "ratio": self.runtime.ratio, "appended": appended,
                "decisions": self.decisions, "emb_hit_rate_total": st.emb_hit_rate,
                "kv_hit_rate_total": st.kv_hit_rate}

    def finished(self, latency_s: float) -> None:
        """A request's latency at the replica (queueing included), for the controller's window
        (requests are served one at a time: this is the one `serve` finished last)."""
        self._latencies.append(latency_s)
        self._parts[0].append(self._last[0])
        self._parts[1].append(self._last[1])

    def tick(self, queue_len: int = 0) -> float:
        """End a window: step the controller (if any) with the window and adapter v2's sample (when
        an EMB refresh closed one), and resize to its ratio; re-rank the EMB shadow every
        `refresh_s`. Returns the ratio."""
        w = self._close(queue_len)
        stats = WindowStats.from_window(w, self.cfg.slo_ms / 1e3)
        if self.ctl is None:
            return self.runtime.ratio
        ratio = self.ctl.step(stats, self.sampler.sample(0, w, self.runtime))
        if w.t - self._refreshed >= self.cfg.refresh_s - 1e-9:
            self.runtime.refresh(w.t)
            self._refreshed = w.t
        self.decisions += 1
        if abs(ratio - self.runtime.ratio) > 1e-9:
            self.runtime.resize(ratio)
        return self.runtime.ratio

    def window(self, queue_len: int = 0) -> WindowStats:
        """Close the window that ends now: the controller's view of it."""
        return WindowStats.from_window(self._close(queue_len), self.cfg.slo_ms / 1e3)

    def _close(self, queue_len: int = 0):
        """Close the window that ends now (`core.window.NodeWindow`)."""
        t0, before = self._window
        now, counters = self.clock(), self.runtime.counters()
        w = node_window(0, now, now - t0, self.runtime.ratio, self._arrivals, self._latencies, queue_len,
                        counters.since(before), self._parts)
        self._window, self._latencies, self._parts, self._arrivals = (now, counters), [], ([], []), 0
        return w

    def report(self) -> dict:
        return self.reporter.report()
