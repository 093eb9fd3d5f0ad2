"""Which runs the compiled engine takes and how (`unsupported`, `ghost_mode`, `router_mode`), and
how its numba typed lists cross a copy or a pickle (`_plain` / `_typed`)."""
from __future__ import annotations

from numba.typed import List

from helmgr.memory.refill import BackgroundRefill
from helmgr.sim.engine_layout import (EXTERNAL, GHOSTS_ALL, GHOSTS_OFF, GHOSTS_OWN, HELM, LEAST_LOADED, PREFIX_AWARE,
                                      ROUND_ROBIN, plain_list, typed_list)
from helmgr.sim.engine_routes import PA_SHIFT


def unsupported(cluster) -> str | None:
    """Why this run cannot take the compiled path (None: it can)."""
    cfg, wl = cluster.cfg, cluster.workload
    if cfg.faults:
        return "node faults"
    if cfg.central_queue:
        return "a central queue"
    if cfg.bypass_caches:
        return "bypassed caches"
    if cfg.host_kv_gib > 0:
        return "a host KV tier"
    if isinstance(cluster.nodes[0].refill, BackgroundRefill):     # (a stream: background, recovery)
        return f"{cfg.refill} refill"
    if wl.n_items >= 1 << 31:
        return f"{wl.n_items} items (the engine records row ids as int32)"
    if not hasattr(wl.history, "locate"):
        return f"a history ({type(wl.history).__name__}) without a compiled locator"
    for s in cluster.slots:
        node = s.node
        if node.emb.access_log is not None or node.kv_log is not None:
            return f"policy {cluster.policy.name!r} watches access logs"
    if ghost_mode(cluster.nodes) is None:
        return "KV ghost queues on some nodes only, or shared among some"
    return None


def ghost_mode(nodes) -> int | None:
    """Whose KV ghost queues a node's recomputed prefix credits (`Node._account`): none
    (GHOSTS_OFF), its own (GHOSTS_OWN) or every node's (GHOSTS_ALL: the cluster's nodes are each
    other's `ghost_peers`, as policies.track_shadows makes them); None for any other arrangement."""
    if not any(node.kv.ghosts for node in nodes):
        return GHOSTS_OFF
    if not all(node.kv.ghosts for node in nodes):
        return None
    if all(node.ghost_peers is None for node in nodes):
        return GHOSTS_OWN
    peers = nodes[0].ghost_peers
    if (peers is not None and len(peers) == len(nodes) and all(a is b for a, b in zip(peers, nodes))
            and all(node.ghost_peers is peers for node in nodes)):
        return GHOSTS_ALL
    return None


ROUTER_VERBS = ("route", "route_request", "dispatched", "completed")
INDEX_VERBS = ("apply_kv", "apply_events", "expect")


def router_mode(router, index) -> int:
    """How the engine routes: in compiled code for the routers it compiles (as they are: a router
    or index whose verbs were replaced on the instance routes from Python), else from Python."""
    from helmgr.routing.helm import Helm
    from helmgr.routing.routers import LeastLoaded, PrefixAware, RoundRobin
    patched = any(v in vars(router) for v in ROUTER_VERBS)
    if patched or (index is not None and any(v in vars(index) for v in INDEX_VERBS)):
        return EXTERNAL
    if type(router) is LeastLoaded:
        return LEAST_LOADED
    if type(router) is RoundRobin:
        return ROUND_ROBIN
    if type(router) is PrefixAware and len(router.load) < 1 << PA_SHIFT:
        return PREFIX_AWARE
    if isinstance(router, Helm) and router.emb_term and type(router).route_request is Helm.route_request:
        return HELM                     # (helm-kv / helm-load price misses at a numpy mean: Python)
    return EXTERNAL


class _Plain(list):
    """A numba typed list, as a Python list (what copies and pickles can carry)."""


def _plain(v):
    if isinstance(v, List):
        return _Plain(plain_list(v))
    if isinstance(v, tuple):
        return tuple(_plain(x) for x in v)
    return v


def _typed(v):
    if isinstance(v, _Plain):
        return typed_list(v)
    if isinstance(v, tuple):
        return tuple(_typed(x) for x in v)
    return v
