"""Figures per SLO class and per tenant, each against its class's target, and the fairness between
tenants (docs/tenancy.md). The run's requests get their tenants from the class table
(`ClassTable.assign`, recorded by request id as they arrive), so every policy and router of one
seed sees the same tenants."""
from __future__ import annotations

import numpy as np
from numba import njit

from helmgr.core.classes import ClassTable
from helmgr.sim.bursts import burst_windows
from helmgr.sim.metrics import NAN, Recorder, window_stats

# What a kept result's class figures mean: an evaluation's units with a class table carry it in
# their keys (experiments/evaluate.py), so a change of definition here reruns them. 2: Jain's index
# over normalised service, demand from each window's start; a moved request's gap from the fault.
FIGURES_REVISION = 2

_NO_REQUEST = "no request of it completed after the warm-up"
GROUP_NULLS = {"p50_ms": _NO_REQUEST, "p99_ms": _NO_REQUEST, "slo_attainment": _NO_REQUEST,
               "window_slo_satisfaction": "no window after the warm-up had a completed request of it",
               "burst_window_slo_satisfaction": "no window of a burst after the warm-up had a completed request of it",
               "kv_hit_rate": "no request of it with a history prefix completed after the warm-up",
               "emb_hit_rate": "no EMB lookup of it after the warm-up",
               "band_share_backlogged": "its band never waited after the warm-up"}


def group_figures(requests: int, arrival: np.ndarray, latency: np.ndarray, slo_ms: float, duration: float,
                  window_s: float, warmup_s: float, shed: int = 0, prefix: np.ndarray | None = None,
                  kv: np.ndarray | None = None, bursts=(), ids: np.ndarray | None = None,
                  misses: np.ndarray | None = None) -> dict:
    """One class's or tenant's figures from its completed requests, against its target `slo_ms`;
    like the run's own, latency figures cover the arrivals after `warmup_s`. With the requests'
    `prefix` and cached `kv` tokens, also its KV hit rate (cached / prefix tokens); with their
    EMB rows looked up (`ids`) and `misses`, its EMB hit rate (1 - misses / ids); with the
    workload's `bursts`, also its window SLO satisfaction over the windows a burst overlaps."""
    keep = arrival >= warmup_s
    lat, slo_s = latency[keep], slo_ms * 1e-3
    span = max(duration - warmup_s, 1e-9)
    pct = np.percentile(lat, [50, 99]) * 1e3 if len(lat) else np.full(2, NAN)
    starts, p99, counts, _ = window_stats(arrival, latency, window_s, duration)
    busy = (counts > 0) & (starts >= warmup_s - 1e-9)
    ok = lat <= slo_s
    out = {"slo_ms": slo_ms, "requests": requests, "completed": len(arrival), "shed": shed,
           "p50_ms": float(pct[0]), "p99_ms": float(pct[1]),
           "slo_attainment": float(ok.mean()) if len(lat) else NAN,
           "window_slo_satisfaction": float(np.mean(p99[busy] <= slo_s)) if busy.any() else NAN,
           "goodput_rps": float(ok.sum()) / span}
    if len(bursts):
        in_burst = np.zeros(len(p99), bool)
        for b in bursts:
            k0, k1 = burst_windows(b, window_s, len(p99))
            in_burst[k0:k1] = True
        hit = busy & in_burst
        out["burst_window_slo_satisfaction"] = float(np.mean(p99[hit] <= slo_s)) if hit.any() else NAN
    if prefix is not None:
        p = prefix[keep].sum()
        out["kv_hit_rate"] = float(kv[keep].sum() / p) if p else NAN
    if ids is not None:
        n = ids[keep].sum()
        out["emb_hit_rate"] = float(1.0 - misses[keep].sum() / n) if n else NAN
    nulls = {k: why for k, why in GROUP_NULLS.items() if k in out and not np.isfinite(out[k])}
    return out | ({"nulls": nulls} if nulls else {})


def completed(rec: Recorder) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The completed requests' tenants, arrivals and latencies, in completion order (as the
    recorder's other per-request columns)."""
    arrival = np.asarray(rec.arrival)
    return np.asarray(rec.tenant, np.int64)[np.asarray(rec.rid)], arrival, np.asarray(rec.end) - arrival


def jain(x: np.ndarray) -> float:
    """Jain's index (sum x)^2 / (n sum x^2): 1 when every value is equal, 1/n when one holds all."""
    x = np.asarray(x, float)
    return float(x.sum() ** 2 / (len(x) * (x * x).sum())) if len(x) and (x * x).sum() > 0 else NAN


def fair_shares(capacity: np.ndarray, demand: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Weighted max-min fair shares, per column (a window): `capacity[w]` split over the rows (the
    tenants of one band) by `weight`, none given more than its `demand[:, w]` — the water level at
    which every tenant either has all it asked or its weight's share of what is left. `capacity`
    must not exceed a column's total demand."""
    share = np.zeros(demand.shape)
    open_ = demand > 0
    left = capacity.astype(float)
    while True:                                 # each pass gives at least one tenant all it asked
        wsum = (weight[:, None] * open_).sum(axis=0)
        level = np.divide(left, wsum, out=np.zeros_like(left), where=wsum > 0)
        full = open_ & (demand <= level * weight[:, None])         # asked no more than the level: all of it
        if not full.any():
            return share + np.where(open_, level * weight[:, None], 0.0)
        share += np.where(full, demand, 0.0)
        left -= np.where(full, demand, 0.0).sum(axis=0)
        open_ &= ~full


def normalised_service(tenant: np.ndarray, arrival: np.ndarray, served: np.ndarray, work: np.ndarray,
                       band: np.ndarray, weight: np.ndarray, window_s: float, from_s: float,
                       to_s: float) -> np.ndarray:
    """Per tenant, the work it was served over the work that was its fair share (Jain's normalised
    allocation; NaN for a tenant that asked for none). In each window from `from_s` to `to_s`, a
    band's service (the `work` of its tenants' requests `served` in it) is what its tenants share:
    each tenant's fair share is its weighted max-min share of it (`fair_shares`), its demand the
    work it had waiting at the window's start plus the work that arrived in the window and was
    served in it (work arriving in a window and served in a later one is demand from the next
    window's start: within a window it may have arrived after the band's service was given).
    Bands are served strictly, so a band is fair to its tenants or not; what the lower bands get
    is their minimum share's measure (`band_share_backlogged`)."""
    edges = np.append(np.arange(from_s, to_s, window_s), to_s)
    n_t, n_w = len(band), len(edges) - 1
    waiting, got, same = np.zeros((n_t, n_w)), np.zeros((n_t, n_w)), np.zeros((n_t, n_w))
    for j in range(n_t):
        m = tenant == j
        w, a, s = work[m], arrival[m], served[m]
        into = np.searchsorted(edges, a, side="right") - 1      # a request's window (-1: before, n_w: after)
        out = np.searchsorted(edges, s, side="right") - 1
        before = np.concatenate([[0.0], np.cumsum(np.bincount(np.clip(into + 1, 0, n_w + 1), w, n_w + 2))])
        gone = np.concatenate([[0.0], np.cumsum(np.bincount(np.clip(out + 1, 0, n_w + 1), w, n_w + 2))])
        waiting[j] = before[1:n_w + 1] - gone[1:n_w + 1]          # arrived before window k, not served before it
        inside = (out >= 0) & (out < n_w)
        got[j] = np.bincount(out[inside], w[inside], n_w)
        both = inside & (into == out)
        same[j] = np.bincount(out[both], w[both], n_w)
    demand = waiting + same
    fair = np.zeros_like(got)
    for b in np.unique(band):
        rows = band == b
        fair[rows] = fair_shares(got[rows].sum(axis=0), demand[rows], weight[rows])
    total, owed = got.sum(axis=1), fair.sum(axis=1)
    return np.divide(total, owed, out=np.full(n_t, NAN), where=owed > 0)


def max_service_gap(arrival: np.ndarray, start: np.ndarray, node: np.ndarray, tenant: np.ndarray,
                    band: np.ndarray, n_nodes: int, from_s: float) -> float:
    """The largest service gap between backlogged tenants of one band: the longest a tenant, with
    a request queued at a node, went unserved there after another tenant of its band was served
    (from that service to its own next one; seconds after `from_s`). A tenant is backlogged at a
    node from a request's arrival to its start (taken from the queue) while it has any queued.
    Requests started at one instant (one batch) overtake none of each other, nor a request that
    arrived at that instant. 0 where no tenant was ever overtaken in its band; NaN where no
    request started after `from_s`. What deficit round robin bounds and FCFS does not. A request a
    node fault routed again is queued at its new node from the fault (`arrival` is then that time)."""
    t = np.concatenate([arrival, start])
    kind = np.repeat(np.array([0, 1], np.int64), len(arrival))
    order = np.argsort(t, kind="stable")
    return _gap(t[order], kind[order], np.tile(node, 2)[order], np.tile(tenant, 2)[order], band, n_nodes, from_s)


@njit(cache=True, nogil=True)
def _gap(t, kind, node, tenant, band, n_nodes, from_s):
    """Events (kind 0: an arrival, 1: a start) in time order, one instant at a time: the starts'
    gaps, then the band mates queued before the instant and not served at it are overtaken, then
    the queues move."""
    n_t = band.shape[0]
    queued = np.zeros((n_nodes, n_t), np.int64)
    started = np.zeros((n_nodes, n_t), np.int64)      # starts at the current instant
    overtaken = np.full((n_nodes, n_t), np.inf)      # when another of its band was first served since its last
    gap, measured = 0.0, False
    e, m = 0, t.shape[0]
    while e < m:
        x, f = t[e], e
        while f < m and t[f] == x:
            f += 1
        for k in range(e, f):
            if kind[k] == 1:
                n, j = node[k], tenant[k]
                if x > from_s:
                    measured = True
                    if overtaken[n, j] < x:
                        gap = max(gap, x - max(overtaken[n, j], from_s))
                started[n, j] += 1
        for k in range(e, f):
            if kind[k] == 1:
                n, j = node[k], tenant[k]
                for g in range(n_t):
                    if started[n, g] == 0 and band[g] == band[j] and queued[n, g] > 0 and overtaken[n, g] == np.inf:
                        overtaken[n, g] = x
        for k in range(e, f):
            n, j = node[k], tenant[k]
            if kind[k] == 0:
                queued[n, j] += 1
            else:
                queued[n, j] -= 1
                overtaken[n, j] = np.inf
                started[n, j] = 0
        e = f
    return gap if measured else np.nan


def class_figures(rec: Recorder, table: ClassTable, duration: float, window_s: float, warmup_s: float,
                  bursts=(), band_share: dict[str, float] | None = None) -> dict:
    """`classes` and `tenants` (name -> figures) and `fairness`: Jain's index over the tenants'
    normalised service (`normalised_service`, each tenant's own in its figures) and over their SLO
    attainment (the share of each one's requests answered within its class's target), and the
    largest service gap between backlogged tenants of one band (`max_service_gap`). With the
    workload's `bursts`, each group's figures also hold its window SLO satisfaction in them; with
    the queues' `band_share` (sim/tenancy.py `band_shares`), each class its band's."""
    tenant_all = np.asarray(rec.tenant, np.int64)
    tenant, arrival, latency = completed(rec)
    per_tenant = np.bincount(tenant_all, minlength=len(table.tenants))
    shed = np.bincount(tenant_all[np.asarray(rec.shed)], minlength=len(table.tenants))
    out = groups(table, tenant, arrival, latency, per_tenant, shed, duration, window_s, warmup_s,
                 np.asarray(rec.prefix, np.int64), np.asarray(rec.kv_tokens, np.int64), bursts,
                 np.asarray(rec.ids, float), np.asarray(rec.misses, float))
    for name, share in (band_share or {}).items():
        group = out["classes"][name]
        group["band_share_backlogged"] = share
        if not np.isfinite(share):
            group["nulls"] = group.get("nulls", {}) | {"band_share_backlogged": GROUP_NULLS["band_share_backlogged"]}
    band = table.tenant_band
    gap, why = NAN, "no band has two tenants"
    if len(set(band.tolist())) < len(band):
        gap, why = max_service_gap(queued(rec, arrival), np.asarray(rec.start), np.asarray(rec.node, np.int64),
                                   tenant, band, rec.n_nodes, warmup_s), "no request started after the warm-up"
    service = normalised_service(tenant, arrival, np.asarray(rec.start), np.asarray(rec.ids, float), band,
                                 table.tenant_weight, window_s, warmup_s, duration)
    with_service(out["tenants"], service)
    return {"shed": len(rec.shed)} | out | {"fairness": fairness(out["tenants"], service, gap, why, after_warmup=True)}


def queued(rec: Recorder, arrival: np.ndarray) -> np.ndarray:
    """When each completed request joined the queue of the node that served it: its arrival, or
    for one a node fault routed again, the fault (`Recorder.requeued`)."""
    if not rec.requeued:
        return arrival
    rid = np.asarray(rec.rid)
    order = np.argsort(rid)
    moved = np.fromiter(rec.requeued, np.int64)
    at = np.searchsorted(rid[order], moved)
    done = at < len(rid)
    done[done] = rid[order][at[done]] == moved[done]         # (one still waiting at the end is not there)
    out = arrival.copy()
    out[order[at[done]]] = np.fromiter(rec.requeued.values(), float)[done]
    return out


NO_SERVICE = "none of its work was waiting or served in the windows measured"


def with_service(tenants: dict, service: np.ndarray) -> None:
    """Each tenant's figures gain its `normalised_service` (null where it asked for no work)."""
    for f, x in zip(tenants.values(), service.tolist()):
        f["normalised_service"] = x
        if not np.isfinite(x):
            f["nulls"] = f.get("nulls", {}) | {"normalised_service": NO_SERVICE}


def groups(table: ClassTable, tenant: np.ndarray, arrival: np.ndarray, latency: np.ndarray, requests: np.ndarray,
           shed: np.ndarray, duration: float, window_s: float, warmup_s: float, prefix: np.ndarray,
           kv: np.ndarray, bursts=(), ids: np.ndarray | None = None, misses: np.ndarray | None = None) -> dict:
    """`classes` and `tenants`, each group's figures (`group_figures`) from the completed
    requests (their tenants, arrivals, latencies, prefix and cached tokens, EMB rows looked up
    and missed) and each tenant's count of requests and of refusals."""
    cls_of = table.tenant_class

    def figures(mask: np.ndarray, of: np.ndarray, slo_ms: float) -> dict:
        return group_figures(int(requests[of].sum()), arrival[mask], latency[mask], slo_ms, duration, window_s,
                             warmup_s, int(shed[of].sum()), prefix[mask], kv[mask], bursts,
                             None if ids is None else ids[mask], None if misses is None else misses[mask])

    classes = {c.name: figures(cls_of[tenant] == k, cls_of == k, c.slo_ms) for k, c in enumerate(table.classes)}
    tenants = {t.name: {"class": t.slo_class} | figures(tenant == j, np.arange(len(cls_of)) == j,
                                                        table.classes[cls_of[j]].slo_ms)
               for j, t in enumerate(table.tenants)}
    return {"classes": classes, "tenants": tenants}


def fairness(tenants: dict, service: np.ndarray, max_gap_s: float, no_gap: str, after_warmup: bool) -> dict:
    """`fairness`: Jain's index over the tenants' normalised `service` (`normalised_service`) and
    over their SLO attainment, and the largest service gap (NaN: `no_gap` says why)."""
    attained = np.array([f["slo_attainment"] for f in tenants.values()])
    attained = attained[np.isfinite(attained)]
    out = {"jain": jain(service[np.isfinite(service)]), "jain_attainment": jain(attained), "max_gap_s": max_gap_s}
    after = " after the warm-up" if after_warmup else ""
    nulls = {}
    if not np.isfinite(out["jain"]):
        nulls["jain"] = "no tenant had a request served" + after
    if not np.isfinite(out["jain_attainment"]):
        nulls["jain_attainment"] = ("no tenant had a request answered within its target" if len(attained) else
                                    "no tenant had a request completed" + after)
    if not np.isfinite(max_gap_s):
        nulls["max_gap_s"] = no_gap
    return out | ({"nulls": nulls} if nulls else {})


def client_figures(table: ClassTable, tenant: np.ndarray, status: np.ndarray, arrival: np.ndarray,
                   latency: np.ndarray, prefix: np.ndarray, kv: np.ndarray, window_s: float,
                   ids: np.ndarray | None = None, emb_hit: np.ndarray | None = None) -> dict:
    """`classes`, `tenants` and `fairness` as a client measures them (serving's load generator):
    per request sent, its tenant, HTTP status (200 answered, 429 refused), arrival and latency (s),
    prefix and cached tokens, with the EMB rows it looked up (`ids`) and its replica's EMB hit
    rate (`emb_hit`); every request counted (no warm-up). A client does not see the
    replicas' queues, so the service gap is null."""
    ok = status == 200
    out = groups(table, tenant[ok], arrival[ok], latency[ok], np.bincount(tenant, minlength=len(table.tenants)),
                 np.bincount(tenant[status == 429], minlength=len(table.tenants)),
                 float((arrival + latency).max()) if len(arrival) else 0.0, window_s, 0.0, prefix[ok], kv[ok],
                 ids=None if ids is None else ids[ok].astype(float),
                 misses=None if ids is None else (ids * (1.0 - emb_hit))[ok])
    end = arrival + latency
    service = normalised_service(tenant[ok], arrival[ok], end[ok], np.ones(int(ok.sum())) if ids is None else
                                 ids[ok].astype(float), table.tenant_band, table.tenant_weight, window_s, 0.0,
                                 float(end[ok].max()) if ok.any() else 0.0)
    with_service(out["tenants"], service)
    return out | {"fairness": fairness(out["tenants"], service, NAN, "a client does not see the replicas' queues",
                                       after_warmup=False)}


def class_window_p99(rec: Recorder, table: ClassTable, duration: float, window_s: float) -> dict:
    """Per class, its P99 per window (by arrival) in ms, NaN where it had no request: what the
    per-class plot draws. `{name: (window starts, P99s, target)}`."""
    tenant, arrival, latency = completed(rec)
    cls = table.tenant_class[tenant]
    out = {}
    for k, c in enumerate(table.classes):
        m = cls == k
        starts, p99, _, _ = window_stats(arrival[m], latency[m], window_s, duration)
        out[c.name] = (starts, p99 * 1e3, c.slo_ms)
    return out
