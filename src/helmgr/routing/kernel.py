"""The HELM router's inner loop, compiled (numba): price a request on each candidate node.

A decision tests a few dozen item ids against each candidate's resident bitmap and evaluates the
cost model a handful of times. In numpy that is six or more calls on tiny arrays (~2 µs each on a
2-core CI box); compiled, the whole loop is about one microsecond. The arithmetic is the cost
model's (helmgr.core.costs): `tests/test_helm_router.py` checks that a node the router knows exactly
is priced at exactly what `Node.serve` charges.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from helmgr.routing.residency import BLOCKED, CHUNK_S, HISTORY_MISS, REFILL_UNTIL

# the router's vector: CostModel folded, the router's switches, and two slots the kernel keeps
# (the next unused random draw, the last decision's least-wait node)
LINEAR, ATTENTION, LOOKUP, LAUNCH, MISS, PCIE_LATENCY, USE_EMB, MEAN_MISS, D, SAMPLE, POS, MEMO = range(12)
# the waste weight: fixed (ADAPT = 0: WASTE), or from the router's load estimate (ADAPT = 1: RHO,
# RATE = requests per node-second, capped at WASTE)
WASTE, ADAPT, RHO, RATE = range(12, 16)
# how many nodes are up (the router keeps it): with no more than d up, every up node is a candidate
N_UP = 16
# the node that runs out of work first in the router's books (the router keeps it; -1: none up)
SOONEST = 17
# 1: a placement's waste counts its misses' link seconds; 0: its compute seconds only (a pipelined
# node's link works while its compute engine does: a miss delays later requests only where the
# link binds)
LINK_WASTE = 18
# a new session's home: its segment's node(s) (SEGMENTS: how many segments the workload names; 0
# or 1: no homes), preferred over the other candidates by HOME_SLACK of completion (seconds, or a
# share of the request's service at home: HOME_RELATIVE)
SEGMENTS, HOME_SLACK = 19, 20
# 1: the slack shrinks as the cluster fills, HOME_SLACK x (1 - rho); 0: fixed
HOME_BY_LOAD = 21
# 1: HOME_SLACK is a share of the request's own service at home; 0: seconds
HOME_RELATIVE = 22
# the nodes' EMB caches track one item id in 2**EMB_SHIFT (memory/emb.py): an id's bit is that of
# row id >> EMB_SHIFT, a tracked id of nearby popularity rank (the synthetic workload numbers
# items by rank), a proxy for ids the caches do not track
EMB_SHIFT = 23
# 1: the nodes' links fetch a batch's rows while the batch before it computes (the pipelined
# engine): a request taken at `now` computes at max(now + its link seconds, when the node runs out
# of work), and the node's books move to its completion; 0: its rows are fetched after the work
# before it, in series
OVERLAP = 24
N_CONSTS = 25                # the vector's length
DRAWS = 1                   # draws a decision takes beside its d samples: the tie-break
# columns of the router's per-node array
FREE, UP = range(2)


def constants(cost, use_emb: bool, d: int, sample: int, waste: float | None, waste_cap: float,
              link_waste: bool = True, segments: int = 0, home_slack: float = 0.0,
              home_by_load: bool = False, home_relative: bool = False, emb_shift: int = 0,
              overlap: bool = False) -> np.ndarray:
    c = np.zeros(N_CONSTS)
    c[LINEAR] = cost.layers * cost.linear_flops / cost.flops          # s per token-layer of linear work
    c[ATTENTION] = cost.layers * cost.attention_flops / cost.flops    # s per (query, key) pair
    c[LOOKUP] = cost.row_bytes / cost.hbm_bw                          # s per resident row read
    c[LAUNCH] = cost.launch_overhead_s
    c[MISS] = cost.host_lookup_s + cost.row_bytes / cost.pcie_bw      # s per missed row (gather + copy)
    c[PCIE_LATENCY] = cost.pcie_latency_s
    c[USE_EMB] = 1.0 if use_emb else 0.0
    c[D], c[SAMPLE] = d, sample
    c[WASTE], c[ADAPT] = (waste_cap, 1.0) if waste is None else (waste, 0.0)
    c[LINK_WASTE] = 1.0 if link_waste else 0.0
    c[SEGMENTS], c[HOME_SLACK], c[HOME_BY_LOAD] = segments, home_slack, 1.0 if home_by_load else 0.0
    c[HOME_RELATIVE] = 1.0 if home_relative else 0.0
    c[EMB_SHIFT] = emb_shift
    c[OVERLAP] = 1.0 if overlap else 0.0
    return c


@njit(cache=True, nogil=True)
def _resident(bits, i, s):
    """1 if node i's bitmap has row s (an item id >> EMB_SHIFT) resident, else 0."""
    return (bits[i, s >> 3] >> (s & 7)) & 1


@njit(cache=True, nogil=True)
def _add(cands, k, i, up):
    """Append node i to cands[:k] if it is up and not there yet; the new k."""
    if up[i] <= 0:
        return k
    for j in range(k):
        if cands[j] == i:
            return k
    cands[k] = i
    return k + 1


@njit(cache=True, nogil=True, inline="always")
def home_node(user, segment, n_nodes, c):
    """The node a new session of `user` in `segment` is sent to by preference (-1: none): with no
    more nodes than segments, segment mod n, so each node is home to about S / n segments; with
    more, each segment has n // S home nodes (segment + S k), the user's id choosing among them.
    None without segments (fewer than two, or the request names none) or without the EMB term,
    whose caches the homes specialize."""
    n_seg = np.int64(c[SEGMENTS])
    if segment < 0 or n_seg < 2 or c[HOME_SLACK] <= 0 or c[USE_EMB] <= 0:
        return -1
    if n_nodes <= n_seg:
        return segment % n_nodes
    return segment % n_seg + n_seg * (user % (n_nodes // n_seg))


@njit(cache=True, nogil=True, inline="always")
def _candidates(hn0, hn1, memo, soonest, home, draws, pos, d, up, n_up):
    """The nodes to price: holders hn0/hn1, the last decision's least-wait node `memo`, the node
    that frees up first (`soonest`: what a full scan's least-wait pick would find), the session's
    `home` and d drawn nodes (down ones left out, each once); every up node when d could miss
    some. Returns (candidates, how many, the draws used: 0 when every node is a candidate)."""
    k = 0
    n = len(up)
    if d >= n or d >= n_up:
        cands = np.empty(n, np.int64)
        for i in range(n):
            if up[i] > 0:
                cands[k] = i
                k += 1
        return cands, k, 0
    cands = np.empty(d + 5, np.int64)
    for i in (hn0, hn1, memo, soonest, home):
        if i >= 0:
            k = _add(cands, k, i, up)
    for r in range(d):
        k = _add(cands, k, np.int64(draws[pos + r] * n), up)
    return cands, k, d


@njit(cache=True, nogil=True, inline="always")
def _service(i, cached, prefix_len, new_ids, n_cand, samp, w, now, bits, node, c):
    """Node i's predicted service for the request, holding `cached` prefix tokens: the tokens it
    lacks are recomputed (their rows missing at its history miss rate), new-token ids miss where
    its bitmap says so, the candidates at the rate of the sample `samp` (each standing for `w`).
    Returns (service, the part of it its misses spend on the link)."""
    n_new = len(new_ids)
    tokens = prefix_len - cached + n_new
    pairs = tokens * cached + tokens * (tokens + 1) / 2 + n_cand * (cached + tokens + 1)
    svc = c[LINEAR] * (tokens + n_cand) + c[ATTENTION] * pairs + c[LAUNCH] + c[LOOKUP] * (tokens + n_cand)
    if c[USE_EMB] > 0:
        misses = (prefix_len - cached) * node[i, HISTORY_MISS]
        sh = np.int64(c[EMB_SHIFT])
        for s in new_ids:
            misses += 1 - _resident(bits, i, s >> sh)
        h = 0
        for s in samp:
            h += _resident(bits, i, s >> sh)
        misses += (len(samp) - h) * w
    else:
        misses = (prefix_len - cached + n_new + n_cand) * c[MEAN_MISS]
    link = 0.0
    if misses > 0:
        link = misses * c[MISS] + c[PCIE_LATENCY]
        svc += link
        if node[i, REFILL_UNTIL] > now:
            link += node[i, CHUNK_S]
            svc += node[i, CHUNK_S]
    return svc, link


@njit(cache=True, nogil=True, inline="always")
def _pick(now, starts, ends, svcs, works, k, least, home_j, draw, c):
    """The candidate with the least completion + the work its placement wastes (its `works` beyond
    the cheapest candidate's), weighted by how many later requests it delays — those that arrive
    before the node is idle again, (rho + rate x backlog) / (1 - rho); candidate `home_j` (-1:
    none) less the home slack. Exact ties go to `draw`."""
    ties = np.empty(k, np.int64)
    n_ties = 0
    best_t = np.inf
    rho = min(c[RHO], 0.95)
    for j in range(k):
        weight = c[WASTE]
        if c[ADAPT] > 0:
            weight = min(weight, (rho + c[RATE] * (starts[j] - now)) / (1.0 - rho))
        t = ends[j] + weight * (works[j] - least)
        if j == home_j:
            slack = c[HOME_SLACK] * svcs[j] if c[HOME_RELATIVE] > 0 else c[HOME_SLACK]
            t -= slack * (1.0 - rho) if c[HOME_BY_LOAD] > 0 else slack
        if t < best_t - 1e-12:
            best_t = t
            ties[0] = j
            n_ties = 1
        elif t <= best_t + 1e-12:
            ties[n_ties] = j
            n_ties += 1
    return ties[0] if n_ties == 1 else ties[min(np.int64(draw * n_ties), n_ties - 1)]


@njit(cache=True, nogil=True)
def decide(now, prefix_len, new_ids, cand_ids, hn0, ht0, hn1, ht1, user, segment, draws, bits, node, mine, c):
    """One routing decision over the candidates of `_candidates` (draws from c[POS] on), each
    priced at predicted completion = max(now, when the node runs out of work, when a sync refill
    releases it) + `_service` (OVERLAP: its rows fetched from when the node can take it, behind
    the work before it); `_pick` chooses, one more draw breaking exact ties. A request whose
    user holds no prefix anywhere (a new session) also prices its segment's home node, preferred
    by HOME_SLACK. Returns (node, its predicted service; OVERLAP: its completion less when the
    node runs out of work, what the books add), or (-1, 0) when no candidate is up; advances
    c[POS], sets c[MEMO]."""
    up = mine[:, UP]
    free = mine[:, FREE]
    pos = np.int64(c[POS])
    c[POS] = pos + np.int64(c[D]) + DRAWS
    home = home_node(user, segment, len(up), c) if hn0 < 0 else -1
    cands, k, d = _candidates(hn0, hn1, np.int64(c[MEMO]), np.int64(c[SOONEST]), home, draws, pos, np.int64(c[D]),
                              up, c[N_UP])
    if k == 0:
        return -1, 0.0
    n_cand = len(cand_ids)
    samp = cand_ids[::max(1, n_cand // np.int64(c[SAMPLE]))]
    w = n_cand / len(samp) if len(samp) > 0 else 0.0
    svcs = np.empty(k)
    works = np.empty(k)           # what the placement costs later requests: service, less idle-link time
    starts = np.empty(k)
    ends = np.empty(k)            # predicted completion
    memo_j, memo_t = 0, np.inf
    least = np.inf
    home_j = -1
    for j in range(k):
        i = cands[j]
        if i == home:
            home_j = j
        cached = min(ht0 if i == hn0 else (ht1 if i == hn1 else 0), prefix_len)
        svcs[j], link = _service(i, cached, prefix_len, new_ids, n_cand, samp, w, now, bits, node, c)
        works[j] = svcs[j] - (1.0 - c[LINK_WASTE]) * link
        take = max(now, node[i, BLOCKED])
        starts[j] = max(take, free[i])
        ends[j] = (max(starts[j], take + link) + svcs[j] - link) if c[OVERLAP] > 0 else starts[j] + svcs[j]
        if starts[j] < memo_t:
            memo_j, memo_t = j, starts[j]
        least = min(least, works[j])
    pick = _pick(now, starts, ends, svcs, works, k, least, home_j, draws[pos + d], c)
    c[MEMO] = cands[memo_j]
    if c[OVERLAP] > 0:             # what it adds to the node's books: they move to its completion
        return cands[pick], ends[pick] - max(now, free[cands[pick]])
    return cands[pick], svcs[pick]
