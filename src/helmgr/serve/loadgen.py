"""Replay the synthetic workload against a serving app over HTTP and measure it.

Open loop: each request is sent at its arrival time in the workload (relative to the start),
at most `concurrency` at once; a request that waits for a free slot is late, and its latency
counts from its arrival time, as in the simulator (no coordinated omission). The workload is
built over the server's own sizes (`GET /v1/config`: item table, candidates, history lengths,
seed), so the replicas' synthetic histories are the client's. Bounded by `duration_s` of
arrivals and `max_requests`; requests still out `timeout_s` after the last arrival are errors.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import numpy as np

from helmgr.core.errors import HelmInputError
from helmgr.core.validate import check_numbers
from helmgr.serve.answers import Answer, by_class, summarize
from helmgr.serve.config import ServeConfig
from helmgr.workload import synthetic_workload
from helmgr.workload.replay import log_replay, store_replay_workload


@dataclass(frozen=True, slots=True)
class LoadConfig:
    url: str = "http://127.0.0.1:8000"
    workload: str = "steady"
    duration_s: float = 20.0
    rps: float = 20.0
    concurrency: int = 32
    max_requests: int = 100_000
    slo_ms: float = 50.0
    timeout_s: float = 30.0
    seed: int | None = None           # the request stream's seed (None: the app's, whose users it replays)
    trace: str | None = None          # replay this log's requests instead (an app serving a history store)
    trace_format: str = "inter"
    model: str | None = None          # with `trace`: the app's checkpoint, to check every answer's scores (verify.py)
    resume: bool = False              # with `trace`: skip the requests the app's store already holds (an earlier replay's)

    def validate(self) -> "LoadConfig":
        """Every number finite and > 0 (an infinite duration would never end the replay); the
        seed, when given, a seed."""
        check_numbers(self)
        return self


class Sent(NamedTuple):
    t: float                    # arrival time in the workload (s from the start)
    body: dict


APP_KEYS = ("replicas", "pool_mib", "model", "n_items", "seed")       # what every helmgr app's /v1/config names


def server_config(url: str, timeout_s: float = 10.0) -> ServeConfig:
    if not url.startswith(("http://", "https://")):
        raise HelmInputError(f"--url must start with http:// or https://, got {url!r}")
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/config", timeout=timeout_s) as r:
            body = r.read()
    except (OSError, ValueError, http.client.HTTPException) as exc:    # a URL urllib cannot parse, a bad port
        raise HelmInputError(f"--url {url!r}: cannot reach the app ({exc})") from None
    try:
        d = json.loads(body)
    except ValueError:
        d = None
    missing = [k for k in APP_KEYS if not isinstance(d, dict) or k not in d]     # (others: from_dict's defaults)
    if missing:
        raise HelmInputError(f"--url {url!r} does not answer as a helmgr app: its /v1/config is not a serving "
                             f"configuration (it lacks {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    return ServeConfig.from_dict(d)


def stream_seed(cfg: ServeConfig, load: LoadConfig) -> int:
    return cfg.seed if load.seed is None else load.seed


def trace_requests(cfg: ServeConfig, load: LoadConfig, log=None) -> Iterator[Sent]:
    """The log's requests (a user's interactions at one time form one), in the log's time order,
    sent at `rps` (exponential gaps, seeded) for `duration_s`: each user's items as its new items,
    `cfg.candidates` random candidates, no prefix (the app's store has it). `log`: the log, if
    already read."""
    log = trace_log(cfg, load) if log is None else log
    sent = log_replay(log, load.rps, load.duration_s, load.max_requests, stream_seed(cfg, load))
    rng = np.random.default_rng([stream_seed(cfg, load), 12])
    tenants = tenant_names(cfg.class_table(), sent.user, np.zeros(len(sent), bool), stream_seed(cfg, load))
    for k in range(len(sent)):
        body = {"user_id": int(sent.user[k]), "new_items": sent.new_items(k).tolist(),
                "candidates": rng.integers(0, cfg.n_items, cfg.candidates).tolist()}
        yield Sent(float(sent.t[k]), body if tenants is None else body | {"tenant": tenants[k]})


def tenant_names(table, user: np.ndarray, burst: np.ndarray, seed: int) -> list[str] | None:
    """With the app's class table, each request's tenant, drawn as the simulator draws it (a log's
    users mapped to tenants by their shares); None without one."""
    if table is None:
        return None
    names = table.tenant_names
    return [names[j] for j in table.assign(user, burst, seed)]


def trace_log(cfg: ServeConfig, load: LoadConfig):
    """The log `load.trace`, checked against the app's catalogue."""
    from helmgr.workload.trace import read_trace

    log = read_trace(load.trace, load.trace_format)
    if log.n_items > cfg.n_items:
        raise HelmInputError(f"--trace {load.trace!r} has {log.n_items} items, the app's catalogue {cfg.n_items}: "
                             f"serve a history store built from this log")
    return log


def requests(cfg: ServeConfig, load: LoadConfig) -> Iterator[Sent]:
    """The workload's requests in arrival order (by default the server's seed: its users and
    histories; another seed draws other arrivals and items over the same user population). With
    the app's class table, each names its tenant, drawn as the simulator draws it."""
    seed = stream_seed(cfg, load)
    w = synthetic_workload(replace(cfg.workload_config(load.rps, load.duration_s), regime=load.workload), seed)
    table, n = cfg.class_table(), 0
    for chunk in w.chunks():
        tenants = tenant_names(table, chunk.user, chunk.burst, seed)
        for i in range(len(chunk)):
            if n == load.max_requests:
                return
            body = {"user_id": int(chunk.user[i]), "prefix_len": int(chunk.prefix_len[i]),
                    "new_items": chunk.items(i).tolist(), "candidates": chunk.candidates(i).tolist()}
            yield Sent(float(chunk.t[i]), body if tenants is None else body | {"tenant": tenants[i]})
            n += 1


async def _send(session, url: str, sent: Sent, t0: float, slots: asyncio.Semaphore, timeout_s: float) -> Answer:
    import aiohttp

    async with slots:
        try:
            async with session.post(url, json=sent.body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                status, out = r.status, (await r.json() if r.status == 200 else {})
        except (aiohttp.ClientError, asyncio.TimeoutError):
            status, out = 0, {}
    latency = time.perf_counter() - t0 - sent.t
    b = sent.body
    if status != 200:
        return Answer(sent.t, latency, status, b.get("prefix_len", 0), 0, 0, 0.0, "", float("nan"))
    ids = out["prefix_len"] - out["kv_tokens"] + len(b["new_items"]) + len(b["candidates"])
    return Answer(sent.t, latency, status, out["prefix_len"], out["kv_tokens"], ids, out["emb_hit_rate"],
                  out["node"], out["ratio"], out["latency_ms"], out["replica_ms"], out["service_ms"], out["appended"],
                  tuple(out["scores"]), out.get("new_user", False))


async def replay(load: LoadConfig, reqs: list[Sent], on_answer: Callable[[], None] = lambda: None) -> list[Answer]:
    """Send `reqs` at their arrival times; the answers, in arrival order."""
    import aiohttp

    url = load.url.rstrip("/") + "/v1/recommend"
    slots = asyncio.Semaphore(load.concurrency)
    conn = aiohttp.TCPConnector(limit=load.concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.perf_counter()
        tasks = []
        for sent in reqs:
            delay = sent.t - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(_send(session, url, sent, t0, slots, load.timeout_s))
            task.add_done_callback(lambda _: on_answer())
            tasks.append(task)
        return list(await asyncio.gather(*tasks))


def simulated(cfg: ServeConfig, load: LoadConfig) -> dict:
    """The same requests (same arrivals, users and items) through the simulator: one node per
    replica with the router's cost profile (`cfg.hardware` and the runtime's model), the HELM
    router, the controller ticking every `window_s` as the replicas' do (static at `cfg.ratio`
    without one), no warm-up skipped (loadgen counts every request). What it leaves out is the
    serving path itself: HTTP, the ingress and the handle hop. A log's replay (`load.trace`)
    runs as `workload.replay` builds it: the store's histories, the same arrivals, users and new
    items, candidates drawn the same way. The controller is the app's: the shipped HELM, or its
    tiers around the app's `--base-policy` file (which must be readable here)."""
    from helmgr.sim import SimConfig, simulate

    seed = stream_seed(cfg, load)
    if load.trace is not None:
        log = trace_log(cfg, load)
        sent = log_replay(log, load.rps, load.duration_s, load.max_requests, seed)
        w = store_replay_workload(log, sent, cfg.n_items, cfg.candidates, seed, load.duration_s)
    else:
        w = synthetic_workload(replace(cfg.workload_config(load.rps, load.duration_s), regime=load.workload), seed)
    sim = SimConfig(nodes=cfg.replicas, hardware=cfg.hardware, policy="helm" if cfg.controller else "static",
                    ratio=cfg.ratio, router="helm", slo_ms=load.slo_ms, seed=cfg.seed, tick_s=cfg.window_s,
                    window_s=cfg.window_s, warmup_s=0.0)
    policy, base = None, sim_base_policy(cfg)
    if base != "shipped":
        from helmgr.policy.helm import HelmPolicy
        policy = HelmPolicy(path=base)
    return simulate(sim, w, policy=policy, profile=cfg.node_profile()).summary | {"base_policy": base}


def sim_base_policy(cfg: ServeConfig) -> str:
    """The base policy the simulated controller runs: "shipped", or the app's `--base-policy`
    file, which must be readable here (HelmInputError before any request is sent otherwise)."""
    if not cfg.controller or cfg.base_policy is None:
        return "shipped"
    if not Path(cfg.base_policy).is_file():
        raise HelmInputError(f"the app's base policy {cfg.base_policy!r} is not a file here: --sim needs it to "
                             "predict the app's controller (run loadgen where the app's files are)")
    return cfg.base_policy


def loadgen(load: LoadConfig, on_start: Callable[[int], None] = lambda n: None,
            on_answer: Callable[[], None] = lambda: None, cfg: ServeConfig | None = None) -> dict:
    """Replay the workload against the app; `cfg`: the app's config, if already fetched."""
    load.validate()
    cfg = cfg or server_config(load.url)
    if cfg.store and load.trace is None:
        raise HelmInputError(f"the app at {load.url} serves users from a history store; replay a log against it "
                             f"(--trace), not the synthetic workload's users, which it does not hold")
    if load.trace is not None and not cfg.store:
        raise HelmInputError(f"--trace: the app at {load.url} serves the synthetic population; serve a history "
                             f"store built from the log (helmgr serve --history DIR)")
    checkpoint = None
    if load.model is not None:
        if load.trace is None:
            raise HelmInputError("--model checks the scores of a log's replay: give the log (--trace)")
        from helmgr.real.checkpoint import load as load_checkpoint
        checkpoint = load_checkpoint(load.model)
        if checkpoint.n_items != cfg.n_items:
            raise HelmInputError(f"--model {load.model!r} has {checkpoint.n_items} items, the app's catalogue "
                                 f"{cfg.n_items}: give the checkpoint the app serves")
    if load.resume and load.trace is None:
        raise HelmInputError("--resume continues a log's replay: give the log (--trace)")
    log = trace_log(cfg, load) if load.trace is not None else None      # read once: requests, resume, check
    reqs = list(trace_requests(cfg, load, log) if log is not None else requests(cfg, load))
    skipped, already = 0, {}
    if load.resume:
        reqs, skipped, already = resume(reqs, store_tails(load.url, reqs, log_lengths(log)))
    on_start(len(reqs))
    t = time.perf_counter()
    answers = asyncio.run(replay(load, reqs, on_answer))
    out = {"url": load.url, "workload": load.workload, "rps": load.rps, "duration_s": load.duration_s,
           "concurrency": load.concurrency, "replicas": cfg.replicas} | summarize(answers, load.slo_ms,
                                                                                  time.perf_counter() - t)
    table = cfg.class_table()
    if table is not None:
        out |= by_class(table, reqs, answers, cfg.window_s)
    if load.resume:
        out["resumed_after"] = skipped
    if checkpoint is not None:
        from helmgr.serve.verify import check_scores
        out |= check_scores(reqs, answers, log, checkpoint, already)
    return out


def log_lengths(log) -> np.ndarray:
    """Each user's actions in the log (what a store built from it holds before any replay)."""
    return np.bincount(log.user, minlength=log.n_users)


def store_tails(url: str, sent: list[Sent], base: np.ndarray, timeout_s: float = 30.0) -> dict[int, list[int]]:
    """What the app's store holds past the log for every user `sent` names (POST /v1/tails)."""
    users = sorted({s.body["user_id"] for s in sent})
    body = {"users": users, "starts": [int(base[u]) if u < len(base) else 0 for u in users]}
    req = urllib.request.Request(url.rstrip("/") + "/v1/tails", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return dict(zip(users, json.loads(r.read())["tails"]))
    except OSError as exc:
        raise HelmInputError(f"--resume: cannot read what the app's store appended, from {url} ({exc})") from None


def resume(sent: list[Sent], tails: dict[int, list[int]]) -> tuple[list[Sent], int, dict[int, list[int]]]:
    """The replay `sent` past what the store appended (`tails`: each user's items past its log).
    A user's appended items are matched to its requests: at each point of its tail, the first of
    its requests not yet matched whose items come next (the app serves a user's requests in the
    order they reach it, which can differ from the order sent). The rest keep their order and
    gaps, the first sent at once. Returns (the rest, how many were dropped, the tails). A tail
    that no order of the replay's requests gives is not this replay's: an error."""
    mine: dict[int, list[int]] = {}
    for k, s in enumerate(sent):
        mine.setdefault(s.body["user_id"], []).append(k)
    done = set()
    for u, tail in tails.items():
        pos, left = 0, list(mine.get(u, []))
        while pos < len(tail):
            k = next((k for k in left if tail[pos:pos + len(sent[k].body["new_items"])] == sent[k].body["new_items"]),
                     None)
            if k is None:
                raise HelmInputError(f"--resume: user {u}'s history in the store, past the log, is not made of this "
                                     f"replay's requests (at its item {pos}): not this log's replay at this rate "
                                     f"and seed")
            left.remove(k)
            done.add(k)
            pos += len(sent[k].body["new_items"])
    rest = [s for k, s in enumerate(sent) if k not in done]
    t0 = rest[0].t if rest else 0.0
    return [s._replace(t=s.t - t0) for s in rest], len(done), {u: list(v) for u, v in tails.items()}
