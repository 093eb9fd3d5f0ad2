"""The simulated node and the real runtime under one request sequence: their caches count the
same (EMB misses, KV hits, KV ghost credits), so the shipped controller, fed each one's windows
through the same code (`core.window.node_window`, `policy.marginal.MarginalSampler`), sees the
same statistics and adapter v2 samples and decides the same.

Time is the one thing the two do not share: the simulator models it, the runtime measures it on
this machine. So both windows take their seconds (busy, fetch, recompute, link, latencies) from
the simulated node, and every count from their own caches. The pages hold a whole number of
tokens and each request brings one page of them, so the runtime's whole-page KV holds exactly the
users the simulator's byte-sized one does; the EMB region holds the whole catalogue, so after the
first refresh the simulated cache, too, takes in every row on its first miss. The ratio is
not moved (a resize's victims differ: the runtime gives up the slots and pages at the region's
edge, the simulator the coldest rows and least recent users)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from helmgr.controller import Controller  # noqa: E402
from helmgr.core.records import NodeConfig  # noqa: E402
from helmgr.core.window import WindowStats, node_window  # noqa: E402
from helmgr.policy.marginal import MarginalSampler  # noqa: E402
from helmgr.real.runtime import NodeRuntime  # noqa: E402
from helmgr.serve.config import ServeConfig  # noqa: E402
from helmgr.sim.node import Node  # noqa: E402

N_ITEMS, USERS, NEW, WINDOWS, PER_WINDOW = 2000, 40, 64, 12, 10
TIME_FIELDS = ("busy_s", "emb_wait_s", "recompute_s", "h2d_busy_s")


def profile():
    p = ServeConfig(pool_mib=3, n_items=N_ITEMS, candidates=16).node_profile()
    p = replace(p, page_mib=p.model.kv_bytes_per_token * NEW / 2**20)     # a page: NEW tokens
    assert p.pool_budget_bytes % p.page_bytes == 0
    return p


def requests(seed: int):
    """(user, prefix_len, new ids, candidates) per window: users drawn by a Zipf law, each request
    one page of new items; a user past four pages starts again from nothing. Histories take the
    lower half of the catalogue, candidates the upper: a row that is both a candidate and a
    computed position is counted once as a miss by the runtime's one lookup and once as a hit by
    the simulator's two (candidates first)."""
    rng = np.random.default_rng(seed)
    items = rng.zipf(1.3, 50_000) % (N_ITEMS // 2)
    hist = {u: items[rng.integers(0, len(items), 4 * NEW)].astype(np.int64) for u in range(USERS)}
    length = dict.fromkeys(hist, 0)
    for _ in range(WINDOWS):
        batch = []
        for _ in range(PER_WINDOW):
            u = int(rng.zipf(1.3) % USERS)
            p = length[u] if length[u] < 4 * NEW else 0
            length[u] = p + NEW
            batch.append((u, p, hist[u][p:p + NEW], N_ITEMS // 2 + items[rng.integers(0, len(items), 16)]))
        yield batch, hist


def test_the_simulated_and_real_nodes_give_the_controller_the_same_windows_and_decisions():
    prof = profile()
    sim = Node(prof, N_ITEMS, NodeConfig(ratio=0.5))
    real = NodeRuntime(prof, prof.pool_budget_bytes, "cpu", seed=0, n_items=N_ITEMS, config=NodeConfig(ratio=0.5))
    nodes = {"sim": sim, "real": real}
    samplers = {k: MarginalSampler(0.05, "tail") for k in nodes}
    ctls = {k: Controller.default() for k in nodes}
    for k, node in nodes.items():
        samplers[k].attach(0, node)
    before = {k: node.counters() for k, node in nodes.items()}
    seen = {"emb_misses": 0, "kv_hit_tokens": 0, "kv_shadow_tokens": 0, "samples": 0}
    decisions = []
    for w, (batch, hist) in enumerate(requests(3)):
        t = float(w)
        lat, fetch, recompute = [], [], []
        for user, p, new, cands in batch:
            history = lambda u, a, b: hist[u][a:b]               # noqa: E731
            s = sim.serve(t, user, p, new, cands, history)
            r = real.serve(t, user, p, new, cands, history)
            assert r.kv_tokens == s.kv_tokens and r.ids == s.ids
            lat.append(s.end - s.start)
            fetch.append(s.fetch_s)
            recompute.append(s.recompute_s)
        d = {k: node.counters().since(before[k]) for k, node in nodes.items()}
        before = {k: node.counters() for k, node in nodes.items()}
        if w == 0:                 # the first window fills the caches, and its refresh makes every row the
            for node in nodes.values():     # simulator's EMB wants: not compared
                node.refresh(1.0)
            continue
        assert d["real"]._replace(**{f: 0 for f in TIME_FIELDS}) == d["sim"]._replace(**{f: 0 for f in TIME_FIELDS})
        d["real"] = d["real"]._replace(**{f: getattr(d["sim"], f) for f in TIME_FIELDS})
        out = {}
        for k, node in nodes.items():
            win = node_window(0, t + 1.0, 1.0, node.ratio, len(batch), lat, 0, d[k], (fetch, recompute))
            sample = samplers[k].sample(0, win, node)
            stats = WindowStats.from_window(win, prof.model.slo_s)
            out[k] = stats, sample, ctls[k].step(stats, sample)
            if w % 2 == 0:                         # an EMB refresh every other window, as the simulator's
                node.refresh(t + 1.0)
        assert out["real"] == out["sim"]
        decisions.append(out["sim"][2])
        seen["emb_misses"] += d["sim"].emb_misses
        seen["kv_hit_tokens"] += d["sim"].kv_hit_tokens
        seen["kv_shadow_tokens"] += d["sim"].kv_shadow_tokens
        seen["samples"] += out["sim"][1] is not None
    assert all(v > 0 for v in seen.values()), seen          # every signal was exercised
    assert ctls["real"].adapter.updates == ctls["sim"].adapter.updates == seen["samples"]
    assert len(set(decisions)) > 1                          # the controller moved
