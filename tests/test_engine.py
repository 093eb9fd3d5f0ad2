"""The compiled per-request path (sim/engine.py) against the Python path: the same summary, field
for field, on small runs of every engine, router family, policy family and regime it compiles."""
from __future__ import annotations

import math

import numpy as np
import pytest

from helmgr.core.classes import load_table
from helmgr.core.errors import HelmInputError
from helmgr.sim import SimConfig, simulate
from helmgr.sim.config import FaultSpec
from helmgr.sim.engine_layout import INFN
from helmgr.workload import default_config, synthetic_workload

WALL_CLOCK = {"wall_s", "sim_path", "sim_path_reason"}
CONTROLLER_WALL_CLOCK = {"decision_us_p50", "decision_us_p99"}


def comparable(summary: dict) -> dict:
    out = {k: v for k, v in summary.items() if k not in WALL_CLOCK}
    if "controller" in out:
        out["controller"] = {k: v for k, v in out["controller"].items() if k not in CONTROLLER_WALL_CLOCK}
    return out


def same(a, b) -> bool:
    """Equal, NaN equal to NaN (a figure with nothing to measure)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def both(cfg: SimConfig, regime: str = "steady", rps: float = 240.0, duration: float = 8.0, seed: int = 1):
    runs = {}
    for path in ("python", "compiled"):
        w = synthetic_workload(default_config(regime, rps=rps, duration_s=duration), seed)
        runs[path] = simulate(SimConfig(**{**cfg_fields(cfg), "path": path}), w)
    return runs["python"], runs["compiled"]


def cfg_fields(cfg: SimConfig) -> dict:
    return {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}


def assert_same(py, co):
    assert py.summary["sim_path"] == "python" and co.summary["sim_path"] == "compiled"
    a, b = comparable(py.summary), comparable(co.summary)
    diff = {k: (a[k], b.get(k)) for k in a if not same(a[k], b.get(k))}
    assert not diff and a.keys() == b.keys()
    assert py.series.timeline == co.series.timeline


@pytest.mark.parametrize("engine", ["batched", "pipelined"])
@pytest.mark.parametrize("router", ["least-loaded", "round-robin", "helm", "prefix-aware"])
def test_compiled_path_equals_python_path(engine, router):
    cfg = SimConfig(nodes=4, engine=engine, router=router, seed=3, warmup_s=2.0)
    assert_same(*both(cfg))


def test_compiled_path_equals_python_path_with_a_per_request_batch_cost(tmp_path):
    """A calibrated profile's batch_request_us (40 us here; 0 in the GPU presets) reaches both
    paths alike, and keeps the compute engines busier."""
    from importlib import resources
    preset = resources.files("helmgr.core.profiles").joinpath("hardware", "a100-80g.toml").read_text()
    path = tmp_path / "per-request.toml"
    path.write_text(preset.replace("batch_request_us = 0.0", "batch_request_us = 40.0"))
    py, co = both(SimConfig(nodes=4, router="prefix-aware", seed=3, warmup_s=2.0, hardware=str(path)), rps=1200.0)
    assert_same(py, co)
    plain = both(SimConfig(nodes=4, router="prefix-aware", seed=3, warmup_s=2.0), rps=1200.0)[1]
    assert co.summary["utilization"] > plain.summary["utilization"]      # the compute engines work longer


@pytest.mark.parametrize("regime", ["burst", "trend"])
def test_compiled_path_equals_python_path_with_the_helm_controller(regime):
    """Full HELM: the controller's three tiers decide on the windows both paths make."""
    cfg = SimConfig(nodes=4, router="helm", policy="helm", seed=2, warmup_s=2.0, ratio=0.3)
    py, co = both(cfg, regime, rps=300.0, duration=12.0)
    assert len(py.series.timeline) > 4                 # the controller resized the pools during the run
    assert_same(py, co)


@pytest.mark.parametrize("policy,router,ghosts", [("helm", "helm", "all"), ("adaptive", "least-loaded", "own")])
def test_compiled_path_equals_python_path_with_shadow_queues(policy, router, ghosts):
    """Policies that watch shadows: full HELM (adapter v2: every node's KV ghosts credited by a
    prefix recomputed anywhere, EMB rows just below the cut) and `adaptive` (each node its own).
    The windows' shadow counts are what the policies decide on, so equal timelines need them
    equal; they are also compared directly."""
    from helmgr.sim.engine_modes import ghost_mode
    from helmgr.sim.engine_layout import GHOSTS_ALL, GHOSTS_OWN
    cfg = SimConfig(nodes=4, router=router, policy=policy, seed=2, warmup_s=2.0,
                                 ratio=0.95)
    py, co = both(cfg, "burst", rps=300.0, duration=12.0)
    assert ghost_mode(co.cluster.nodes) == {"all": GHOSTS_ALL, "own": GHOSTS_OWN}[ghosts]
    shadows = [[(n.stats.kv_shadow_tokens, n.emb.shadow_hits) for n in r.cluster.nodes] for r in (py, co)]
    assert shadows[0] == shadows[1] and sum(k for k, _ in shadows[0]) > 0 and sum(e for _, e in shadows[0]) > 0
    assert [list(n.kv.ghost.items()) for n in py.cluster.nodes] == [list(n.kv.ghost.items()) for n in co.cluster.nodes]
    assert_same(py, co)


@pytest.mark.parametrize("router,policy", [("helm", "static"), ("least-loaded", "helm")])
def test_compiled_path_equals_python_path_with_sampled_emb(router, policy):
    """EMB caches tracking one id in 4: both paths check, record and scale the same sampled ids
    (and the controller's resizes move the same sampled rows)."""
    cfg = SimConfig(nodes=3, router=router, policy=policy, seed=5, warmup_s=2.0, ratio=0.4,
                                 emb_sample=4)
    py, co = both(cfg, "burst", rps=300.0, duration=10.0)
    assert py.cluster.nodes[0].emb.n_items == 2_000_000 // 4
    assert 0.3 < py.summary["emb_hit_rate"] < 0.99
    assert_same(py, co)


def test_compiled_path_under_overload_and_tail_first_kv():
    cfg = SimConfig(nodes=2, router="least-loaded", kv_tail_first=True, seed=1, warmup_s=1.0,
                                 ratio=0.8, max_batch=2)
    py, co = both(cfg, rps=4000.0, duration=4.0)
    assert py.summary["max_queue"] > 10                # queues built up (and were carried across chunks)
    assert_same(py, co)


@pytest.mark.parametrize("tenancy,router", [(t, r) for t in ("strict", "quota", "pools", "helm")
                                             for r in ("helm", "least-loaded")] + [("helm", "helm-kv")])
def test_compiled_path_equals_python_path_under_a_class_table(tenancy, router):
    """Each class-aware tenancy (queues by band and tenant, KV by class or quota, pools, the
    refusals of sheddable requests predicted late: by the compiled HELM router, or by helm-kv
    from Python) on 4 nodes at twice their capacity."""
    cfg = SimConfig(nodes=4, router=router, seed=3, warmup_s=1.0, classes=load_table("surfaces"), tenancy=tenancy)
    py, co = both(cfg, "burst", rps=3000.0, duration=4.0)
    s = py.summary
    assert s["max_queue"] > 50 and s["completed"] + s["shed"] == s["requests"]
    assert (s["shed"] > 0) == (tenancy == "helm" and router.startswith("helm"))
    shares = [c.get("band_share_backlogged") for c in s["classes"].values()]      # (in the summaries compared)
    assert all(0 < x <= 1 for x in shares) if tenancy in ("strict", "helm") else shares == [None] * 3
    assert s["fairness"]["max_gap_s"] > 0                                         # (compared too)
    assert_same(py, co)
    assert np.asarray(py.cluster.rec.shed).tolist() == np.asarray(co.cluster.rec.shed).tolist()


def test_unsupported_configurations_take_the_python_path_and_say_why():
    w = synthetic_workload(default_config("steady", rps=100.0, duration_s=4.0), 1)
    r = simulate(SimConfig(nodes=2, faults=(FaultSpec(1, 1.0, 2.0),), warmup_s=0.0), w)
    assert r.summary["sim_path"] == "python" and r.summary["sim_path_reason"] == "node faults"
    with pytest.raises(HelmInputError, match="--sim-path compiled cannot run this configuration: node faults"):
        simulate(SimConfig(nodes=2, faults=(FaultSpec(1, 1.0, 2.0),), path="compiled"), w)
    with pytest.raises(HelmInputError, match="unknown simulator path 'fast'"):
        simulate(SimConfig(nodes=2, path="fast"), w)


@pytest.mark.parametrize("sample", [1, 4])
def test_compiled_path_equals_python_path_on_a_widened_trace(tmp_path, sample):
    """At 1 id in 4 the clones' item ranges start at 0, 90, 180 and 270: clones 0 and 2 read the
    history's index of tracked ids (`history_index`), clones 1 and 3 walk every id."""
    from tests.test_trace_widen import write_log
    from helmgr.workload import trace_workload
    path = tmp_path / "log.inter"
    write_log(path)
    runs = {}
    for p in ("python", "compiled"):
        w = trace_workload(str(path), "inter", duration_s=30.0, seed=2, candidates=64, clone_users=4,
                           overlays=("widen",))
        runs[p] = simulate(SimConfig(nodes=3, router="helm", seed=2, warmup_s=2.0, ratio=0.2, path=p,
                                                  emb_sample=sample), w)
    assert w.history.n_items == 90 and w.history.clones == 4
    assert runs["python"].summary["requests"] > 100
    assert_same(runs["python"], runs["compiled"])


def test_the_history_index_lists_each_runs_tracked_rows():
    from helmgr.sim.engine_node import history_index
    pool = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 13])
    same, counts, rows = history_index(pool, 2)                  # tracked: 0, 4, 8, 12 (rows 0, 1, 2, 3)
    assert same is pool and rows.tolist() == [0, 1, 2, 3]
    assert counts.tolist() == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 4, 4]
    assert rows[counts[3]:counts[10]].tolist() == [1, 2, 3]     # positions 3..9 hold 4, 8 and 12
    _, counts, rows = history_index(pool, 0)                     # whole caches walk the pool itself
    assert len(rows) == 0


def test_a_policy_that_repeats_its_ratio_costs_no_sync(monkeypatch):
    """A policy may answer every tick with the ratio the node already has (`Scheduled` does):
    that moves no page, so the compiled path neither syncs nor rebuilds the node's bitmaps for
    it, and still equals the Python path where the schedule does move pages."""
    import helmgr.sim.engine as engine
    from helmgr.policy.base import Scheduled
    calls = []
    real = engine.build_bits
    monkeypatch.setattr(engine, "build_bits", lambda *a: (calls.append(1), real(*a))[1])
    cfg = SimConfig(nodes=3, router="helm", seed=4, warmup_s=1.0, ratio=0.6, policy="scheduled")
    runs = {}
    for path in ("python", "compiled"):
        w = synthetic_workload(default_config("burst", rps=300.0, duration_s=6.0), 4)
        calls.clear()
        runs[path] = simulate(SimConfig(**{**cfg_fields(cfg), "path": path}),
                              w, policy=Scheduled([(0.0, 0.6), (2.0, 0.8), (4.0, 0.7)]))
    # 3 nodes: built at the start, after each of the 3 refreshes (2, 4, 6 s) and after each of the
    # 2 moves; the 600 ticks that repeat a ratio rebuild nothing
    assert len(calls) == 3 * (1 + 3 + 2)
    assert len(runs["python"].series.timeline) > 3
    assert_same(runs["python"], runs["compiled"])


@pytest.mark.parametrize("n", [1, 63, 64, 1000, 4096 + 37])
def test_bitmaps_hold_each_rows_state(n):
    """build_bits against a slow reference: bit x of `res` is set iff row x is resident, of `unf`
    iff it is unfilled; stale bits of a reused bitmap are cleared."""
    from helmgr.memory.emb_kernels import RESIDENT, UNFILLED
    from helmgr.sim.engine_node import build_bits
    state = np.random.default_rng(n).integers(0, 3, n).astype(np.uint8)
    words = (n + 63) // 64
    res, unf = np.full(words, ~np.uint64(0)), np.full(words, ~np.uint64(0))
    build_bits(state, res, unf)
    bits = lambda words: np.unpackbits(words.view(np.uint8), bitorder="little")[:n]   # noqa: E731
    np.testing.assert_array_equal(bits(res), state == RESIDENT)
    np.testing.assert_array_equal(bits(unf), state == UNFILLED)
    pad = words * 64 - n
    if pad:
        assert np.unpackbits(res.view(np.uint8), bitorder="little")[n:].sum() == 0


@pytest.mark.parametrize("tenancy", ["blind", "helm"])
def test_a_cluster_on_the_compiled_path_forks_and_pickles_mid_run(tenancy):
    """Cluster.fork and a pickle (cloudpickle: what Ray sends to a worker) of a cluster on the
    compiled path, taken mid-run with requests in flight, replay a block exactly as the original
    (under `helm` with a class table: its class queues and KV groups copied too)."""
    cloudpickle = pytest.importorskip("cloudpickle")
    from helmgr.core.profiles import node_profile
    from helmgr.experiments.phase_oracle import replay_p99
    from helmgr.experiments.phase_oracle import Start
    w = synthetic_workload(default_config("burst", rps=300, duration_s=8, n_items=50_000, n_clusters=8), 1)
    classes = load_table("surfaces") if tenancy == "helm" else None
    cfg = SimConfig(nodes=3, router="helm", seed=1, classes=classes, tenancy=tenancy).validate(8)
    c = Start(cfg, w, node_profile(cfg.hardware, cfg.model)).build(0.5)
    chunks = list(w.chunks(1.0))
    for chunk in chunks[:4]:
        c.feed(chunk)                        # (the last arrival is just in: in service)
    assert c.path == "compiled" and sum(c.queue_len(i) for i in range(3)) + int(c.engine.I[:, INFN].sum()) > 0
    first = replay_p99(c, chunks[4:6], 0.7, 4.0)
    copy = cloudpickle.loads(cloudpickle.dumps(c))
    assert copy.engine is not c.engine and copy.engine.c is copy
    assert replay_p99(copy, chunks[4:6], 0.7, 4.0) == first == replay_p99(c, chunks[4:6], 0.7, 4.0)
    assert np.isfinite(first)


FRESH_PROCESS_RUN = """
from numba.core.registry import CPUDispatcher
from numba.typed import typedlist
from helmgr.sim import SimConfig
from helmgr.sim.cluster import Cluster
from helmgr.core.profiles import node_profile
from helmgr.experiments.phase_oracle import Start
from helmgr.workload import default_config, synthetic_workload
w = synthetic_workload(default_config("burst", rps=300, duration_s=3, n_items=50_000, n_clusters=8), 1)
cfg = SimConfig(nodes=2, router="helm", seed=1).validate(3)
c = Start(cfg, w, node_profile(cfg.hardware, cfg.model)).build(0.5)
chunks = list(w.chunks(1.0))
c.feed(chunks[0])
copy = c.fork()
for chunk in chunks[1:]:
    c.feed(chunk)
    copy.feed(chunk)
c.finish()
assert c.path == "compiled" and c.rec.requests > 100
print(sum(len(d.overloads) for d in vars(typedlist).values() if isinstance(d, CPUDispatcher)))
"""


def test_a_compiled_run_compiles_none_of_the_typed_lists_methods():
    """numba compiles numba.typed.List's own methods again in every process (about 3 s of a run's
    start); the engine builds, reads and copies its lists through cached kernels
    (engine_layout.typed_list, at, put, plain_list) instead. A fresh process runs, forks and
    finishes a HELM run on the compiled path and has compiled none of them."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", FRESH_PROCESS_RUN], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "0"
