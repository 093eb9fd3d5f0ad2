"""The HTTP ingress: `POST /v1/recommend`, `GET /healthz`, `GET /metrics`,
`GET /v1/config`.

The ingress resolves a request's prefix length — the body's `prefix_len` if given; else, with
a history store, the user's length in it; else where this ingress last left the user (its
previous prefix + new items), else the synthetic user's base history length, users outside the
synthetic population (`user_id >= n_users`) cold: prefix 0 — and calls the backend with plain
kwargs, which the HELM router reads. A backend replica
that dies under a request is retried on another one (up to `TRIES` times).

Bounded work: the body is read up to `max_body_bytes` (413 past it, before it is read
whole) and parsed strictly (`helmgr.serve.body`: non-finite numbers and malformed fields are 422
naming the field, never echoing the input); `RequestLimits` refuses (422) item ids outside the
table, a prefix past `max_prefix` and a request whose worst-case predicted service is above
`max_cost_ms`. Every request gets a deadline (`deadline_ms` from its arrival): the backend does
not start it when it cannot finish by then, and one whose model work ends past it appends nothing
and is answered late; the client gets 504 either way. The replica alone decides whether a request
counts, so a 504 never leaves an append behind: the ingress waits `HOP_GRACE_S` past the deadline
for the replica's word (its answer's way back), and cuts the call only then (a replica that does
not answer). A history
store that cannot be reached, at the ingress (the prefix) or at the replica (a KV miss's history,
the append), is a 503 naming it; nothing was appended, so the request can be sent again.

Readiness: `/healthz` answers 503 until the ingress has sent warm-up requests through its
handle (the router's first decisions and its compiled kernel, the replica set it learns) and
every backend replica answered one; the replicas warm themselves before Ray starts them.

Classes (`ServeConfig.classes`, docs/tenancy.md): a request may name its `tenant` or its `class`
in the app's class table (422 for a name the table does not hold; a request naming neither is
served as before, labelled `none`). A request of a sheddable class gets its class's target as its
deadline: one its replica cannot serve by then is refused, 429 with the reason, and counted under
`helm_shed`. The replica is sent the class's band: its queue serves lower bands first, and its
KV cache keeps the user's prefix in that band.

Metrics are Prometheus text at `/metrics` from this ingress replica's own registry: requests by
node, KV hit and class, end-to-end latency histogram by class, errors, shed requests and retries,
and, per node, the hit rates, ratio and controller decisions the node last reported with a response. With more than one
ingress replica each scrape sees one replica's counts (run one, the default, or sum in Prometheus).
"""
# no `from __future__ import annotations` here: Serve rewrites the route signatures and FastAPI
# would then read the body model as a query parameter

import asyncio
import time
from collections import OrderedDict

import numpy as np
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from helmgr.history.store import StoreUnavailable
from helmgr.serve.body import BodyError, RecommendRequest, parse_body, read_body, request_class
from helmgr.serve.config import ServeConfig
from helmgr.serve.limits import RequestLimits
from helmgr.serve.turns import Turns
from helmgr.serve.warm import Warmup
from helmgr.workload.users import SyntheticUsers

TRIES = 3
HOP_GRACE_S = 1.0       # past a request's deadline, how long the ingress waits for its replica's answer
LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
BODY_SCHEMA = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": RecommendRequest.model_json_schema()}}}}


class Progress:
    """User -> the prefix length its next request will have. With a history store, the user's
    length in it (the replicas append what they serve); else the synthetic population's, advanced
    by what this ingress answered (bounded, least recently used out)."""

    def __init__(self, cfg: ServeConfig, size: int = 1 << 18):
        self.store = self.users = None
        if cfg.store:
            from helmgr.history import open_store
            self.store = open_store(cfg.history, cfg.redis)
        else:
            w = cfg.workload_config()
            self.users = SyntheticUsers(w.n_clusters, w.len_median, w.len_sigma, w.len_cap, cfg.seed)
        self.n_users, self.cap, self.size = cfg.n_users, cfg.max_prefix, size
        self.next: OrderedDict[int, int] = OrderedDict()

    def prefix(self, user: int, given: int | None) -> int:
        if self.store is not None:
            if given is None:
                self.store.refresh()                    # the replicas' appends
            return self.store.length(user) if given is None else given
        if user >= self.n_users:
            return 0
        if given is not None:
            return given
        got = self.next.get(user)
        return got if got is not None else int(self.users.base_len(np.array([user]))[0])

    def advance(self, user: int, prefix_len: int, new: int) -> None:
        if self.store is None and user < self.n_users:
            self.next[user] = min(prefix_len + new, self.cap)
            self.next.move_to_end(user)
            if len(self.next) > self.size:
                self.next.popitem(last=False)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("helm_requests", "Requests answered", ("node", "kv_hit", "class"), registry=r)
        self.latency = Histogram("helm_request_latency_seconds", "End-to-end latency at the ingress", ("class",),
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.shed = Counter("helm_shed", "Requests of a sheddable class refused (429)", ("class", "reason"),
                            registry=r)
        self.errors = Counter("helm_errors", "Requests that failed after retries", ("kind",), registry=r)
        self.new_users = Counter("helm_new_users", "Requests of users the history store held nothing for",
                                 registry=r)
        self.retries = Counter("helm_retries", "Backend calls retried after a replica failure", registry=r)
        self.emb_hit = Gauge("helm_emb_hit_rate", "Node's EMB hit rate since it started", ("node",), registry=r)
        self.kv_hit = Gauge("helm_kv_hit_rate", "Node's KV hit rate (tokens) since it started", ("node",), registry=r)
        self.ratio = Gauge("helm_ratio", "Node's EMB share of its pool", ("node",), registry=r)
        self.decisions = Gauge("helm_controller_decisions", "Windows the node's controller decided", ("node",),
                               registry=r)

    def answered(self, out: dict, latency_s: float, slo_class: str) -> None:
        node = out["node"]
        self.requests.labels(node, str(out["kv_tokens"] > 0).lower(), slo_class).inc()
        self.latency.labels(slo_class).observe(latency_s)
        self.emb_hit.labels(node).set(out["emb_hit_rate_total"])
        self.kv_hit.labels(node).set(out["kv_hit_rate_total"])
        self.ratio.labels(node).set(out["ratio"])
        self.decisions.labels(node).set(out["decisions"])


api = FastAPI(title="helmgr", description="HELM recommender serving: EMB/KV-aware routing over real caches")


class Deadline(Exception):
    """The request's deadline passed before the backend answered."""


UNCLASSED = "none"      # the class label of a request that names no tenant or class


@serve.ingress(api)
class Ingress:
    def __init__(self, backend, cfg: dict):
        self.backend, self.cfg = backend, ServeConfig.from_dict(cfg)
        self.progress = Progress(self.cfg)
        self.turns = Turns()
        self.limits = RequestLimits(self.cfg)
        self.metrics = Metrics()
        self.table = self.cfg.class_table()
        self.warmup, self.warming = Warmup(self.cfg.replicas), None

    def _warm(self) -> None:
        if self.warming is None:
            self.warming = asyncio.get_running_loop().create_task(self.warmup.run(self._warm_call))

    async def _warm_call(self, k: int) -> dict:
        """Warm-up request `k`: a user outside the population (served cold, prefix 0)."""
        cands = [i % self.cfg.n_items for i in range(self.cfg.candidates)]
        return await self.backend.remote(user_id=self.cfg.n_users + 1000 + k, prefix_len=0, new_items=[1, 2, 3, 4],
                                         candidates=cands, budget_s=60.0, warmup=True)

    @api.post("/v1/recommend", openapi_extra=BODY_SCHEMA)
    async def recommend(self, request: Request) -> dict:
        t0 = time.perf_counter()
        deadline = time.time() + self.cfg.deadline_s
        self._warm()
        try:
            req = parse_body(await read_body(request.stream(), request.headers.get("content-length"),
                                             self.cfg.max_body_bytes))
        except BodyError as exc:
            self.metrics.errors.labels(f"http_{exc.status}").inc()
            return JSONResponse({"detail": exc.detail}, status_code=exc.status)
        async with self.turns.of(req.user_id):        # a user's requests in order: each prefix counts the last
            try:
                k = request_class(self.table, req)
                sheddable = k is not None and self.table.classes[k].sheddable
                if sheddable:                          # its target is its deadline: refused rather than late
                    deadline = min(deadline, deadline - self.cfg.deadline_s + self.table.classes[k].slo_ms / 1e3)
                prefix_len = self.progress.prefix(req.user_id, req.prefix_len)
                self.limits.check(req, prefix_len)
                out, retries = await self._call(req, prefix_len, deadline, 0 if k is None else self.table.classes[k].band)
            except BodyError as exc:
                self.metrics.errors.labels(f"http_{exc.status}").inc()
                return JSONResponse({"detail": exc.detail}, status_code=exc.status)
            except Deadline as exc:
                if sheddable:
                    self.metrics.shed.labels(self.table.class_names[k], "late").inc()
                    return JSONResponse({"detail": [{"loc": [], "type": "shed", "msg": str(exc)}]}, status_code=429)
                self.metrics.errors.labels("deadline").inc()
                return JSONResponse({"detail": [{"loc": [], "type": "deadline", "msg": str(exc)}]}, status_code=504)
            except StoreUnavailable as exc:         # nothing was appended: the request can be sent again
                self.metrics.errors.labels("store_down").inc()
                return JSONResponse({"detail": [{"loc": [], "type": "store_down", "msg": str(exc)}]}, status_code=503)
            self.progress.advance(req.user_id, prefix_len, len(req.new_items))
        new_user = self.progress.store is not None and req.prefix_len is None and prefix_len == 0
        self.metrics.new_users.inc(new_user)
        latency = time.perf_counter() - t0
        slo_class = UNCLASSED if k is None else self.table.class_names[k]
        self.metrics.answered(out, latency, slo_class)
        return {"scores": out["scores"], "node": out["node"], "kv_hit": out["kv_tokens"] > 0,
                "kv_tokens": out["kv_tokens"], "prefix_len": prefix_len,
                "emb_hit_rate": 1.0 - out["misses"] / out["ids"], "latency_ms": latency * 1e3,
                "service_ms": out["service_ms"], "replica_ms": out["replica_ms"], "ratio": out["ratio"],
                "retries": retries, "appended": out["appended"], "new_user": new_user, "class": slo_class}

    async def _call(self, req: RecommendRequest, prefix_len: int, deadline: float, band: int = 0) -> tuple[dict, int]:
        budget = f"its deadline of {self.cfg.deadline_s * 1e3:.0f} ms"
        for attempt in range(TRIES):
            response = self.backend.remote(user_id=req.user_id, prefix_len=prefix_len, new_items=req.new_items,
                                           candidates=req.candidates, budget_s=max(deadline - time.time(), 0.0),
                                           band=band)
            try:
                async with asyncio.timeout(max(deadline - time.time(), 0.0) + HOP_GRACE_S):
                    out = await response
            except TimeoutError:
                response.cancel()                   # a queued request leaves its replica's queue
                raise Deadline(f"its replica did not answer within {budget} and {HOP_GRACE_S:g} s more") from None
            except (ActorDiedError, ActorUnavailableError, RayActorError) as exc:
                if attempt + 1 == TRIES:
                    self.metrics.errors.labels("replica_failed").inc()
                    raise HTTPException(503, f"backend replicas failed {TRIES} times: {type(exc).__name__}")
                self.metrics.retries.inc()
                await asyncio.sleep(0.05 * (attempt + 1))
                continue
            if "late" in out:
                raise Deadline(f"not served within {budget} by its replica: {out['late']}")
            if "store_down" in out:
                raise StoreUnavailable(out["store_down"])
            return out, attempt

    @api.get("/healthz")
    async def healthz(self):
        self._warm()
        status, body = self.warmup.health()
        return JSONResponse(body, status_code=status)

    @api.get("/v1/config")
    async def config(self) -> dict:
        """The app's sizes and seed (the load generator builds its workload over them); where its
        history store and checkpoint are stays private (a Redis URL may hold a password): only that it
        has them."""
        private = ("history", "redis", "checkpoint")
        return self.cfg.to_dict() | {k: "(set)" for k in private if getattr(self.cfg, k) is not None}

    @api.post("/v1/tails")
    async def tails(self, users: list[int], starts: list[int]) -> dict:
        """Each user's items in the app's store from position `starts[k]` on, in the order asked
        (a log's replay resumes past what the store holds: what it appended). 409 for an app
        without a store, 422 for lists of different lengths."""
        store = self.progress.store
        if store is None:
            raise HTTPException(409, "this app serves the synthetic population: it has no history store")
        if len(users) != len(starts):
            raise HTTPException(422, f"{len(users)} users and {len(starts)} starts")
        try:
            store.refresh()
            return {"tails": [store.items(u, s, store.length(u)).tolist() for u, s in zip(users, starts)]}
        except StoreUnavailable as exc:
            raise HTTPException(503, str(exc)) from None

    @api.get("/metrics", response_class=PlainTextResponse)
    async def metrics(self) -> str:
        return generate_latest(self.metrics.registry).decode()
