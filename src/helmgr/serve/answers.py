"""What a replay against the app measured: each request's answer as the load generator saw it,
and the figures over them — the run's summary, its latency split into parts, and with the app's
class table the figures per class and per tenant."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from helmgr.sim.class_metrics import client_figures


class Answer(NamedTuple):
    t: float
    latency_s: float            # from arrival to answer
    status: int                 # HTTP status; 0 = no answer (connection error, timeout)
    prefix_len: int
    kv_tokens: int
    ids: int                    # rows looked up: recomputed prefix + new items + candidates
    emb_hit_rate: float
    node: str
    ratio: float
    ingress_ms: float = math.nan    # in the ingress's handler: body, routing, the hop to the replica and back
    replica_ms: float = math.nan    # at the replica: its queue (the gate) and the service
    service_ms: float = math.nan    # the real path's service
    appended: bool = False          # its new items were added to the app's history store
    scores: tuple = ()              # one per candidate
    new_user: bool = False          # the app's store held nothing for the user: served cold (and created)


# A request's time, split: the client and HTTP (the wait for a slot, sending, the answer back, and
# Serve's proxy hop to the ingress on a cluster that keeps one), the ingress (body, prefix, routing,
# the handle's hop to a replica and back), the replica's queue, and the service. Each part's p50
# and p99 over the answered requests.
PARTS = ("http_ms", "ingress_ms", "queue_ms", "service_ms")


def split(answers: list) -> dict | None:
    """{"p50": {part: ms}, "p99": {...}} over `answers` (answered ones), None if there are none."""
    if not answers:
        return None
    a = np.array([(x.latency_s * 1e3 - x.ingress_ms, x.ingress_ms - x.replica_ms, x.replica_ms - x.service_ms,
                   x.service_ms) for x in answers])
    return {f"p{q}": dict(zip(PARTS, map(float, np.percentile(a, q, axis=0)))) for q in (50, 99)}


def summarize(answers: list[Answer], slo_ms: float, wall_s: float) -> dict:
    """The fields of a run's summary (docs/simulator.md#metrics) that a client can measure, plus
    errors, requests shed (429), answers by HTTP status and per-node counts. Strict JSON: what cannot be measured (no
    request completed) is `null`, with the reason in `nulls`."""
    ok = [a for a in answers if a.status == 200]
    lat = np.array([a.latency_s for a in ok]) * 1e3
    pct = [float(x) for x in np.percentile(lat, [50, 95, 99, 99.9])] if len(lat) else [None] * 4
    span = max((max(a.t + a.latency_s for a in answers) - min(a.t for a in answers)) if answers else 0.0, 1e-9)
    good = int((lat <= slo_ms).sum())
    prefix = sum(a.prefix_len for a in ok)
    ids = sum(a.ids for a in ok)
    nodes: dict[str, int] = {}
    for a in ok:
        nodes[a.node] = nodes.get(a.node, 0) + 1
    statuses: dict[str, int] = {}
    for a in answers:
        statuses[str(a.status)] = statuses.get(str(a.status), 0) + 1
    shed = statuses.get("429", 0)                     # a sheddable class's request refused: not an error
    out = {"requests": len(answers), "completed": len(ok), "shed": shed, "errors": len(answers) - len(ok) - shed,
           "p50_ms": pct[0], "p95_ms": pct[1], "p99_ms": pct[2], "p999_ms": pct[3],
           "slo_ms": slo_ms, "slo_attainment": good / len(answers) if answers else 0.0,
           "throughput_rps": len(ok) / span, "goodput_rps": good / span,
           "emb_hit_rate": sum(a.emb_hit_rate * a.ids for a in ok) / ids if ids else 0.0,
           "kv_hit_rate": sum(a.kv_tokens for a in ok) / prefix if prefix else 0.0,
           "mean_ratio": float(np.mean([a.ratio for a in ok])) if ok else None,
           "status_counts": dict(sorted(statuses.items())),
           "requests_per_node": dict(sorted(nodes.items())), "split_ms": split(ok),
           "appended": sum(a.appended for a in ok), "new_users": sum(a.new_user for a in ok), "wall_s": wall_s}
    if not ok:
        why = "no request was sent" if not answers else "no request completed"
        out["nulls"] = {k: why for k in ("p50_ms", "p95_ms", "p99_ms", "p999_ms", "mean_ratio", "split_ms")}
    return out


def by_class(table, sent: list, answers: list[Answer], window_s: float) -> dict:
    """`classes`, `tenants` and `fairness` over the requests that named a tenant (every request
    the load generator sends to an app with a class table)."""
    index = {name: j for j, name in enumerate(table.tenant_names)}
    named = [(index[s.body["tenant"]], a) for s, a in zip(sent, answers, strict=True) if s.body.get("tenant") in index]
    tenant = np.array([j for j, _ in named], np.int64)
    got = [a for _, a in named]
    return client_figures(table, tenant, np.array([a.status for a in got], np.int64), np.array([a.t for a in got]),
                          np.array([a.latency_s for a in got]), np.array([a.prefix_len for a in got], np.int64),
                          np.array([a.kv_tokens for a in got], np.int64), window_s,
                          np.array([a.ids for a in got], np.int64), np.array([a.emb_hit_rate for a in got]))
