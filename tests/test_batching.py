"""Batched service and the two engines, against timelines worked out by hand.

The tiny profile (tests/conftest.py): 100 TFLOP/s peak, launches 10 x 5 us, rows of 64 B, a link of
10 GB/s with 10 us per copy. A request of 100 new tokens and no prefix or candidates costs
2 layers x (640 x 100 + 32 x 5,050) = 451,200 FLOPs and, with every row missing, one copy of
6,400 B = 10.64 us; two such requests in a batch, one copy of 12,800 B = 11.28 us.
"""
import numpy as np
import pytest

from helmgr.core.costs import CostModel
from helmgr.core.profiles import NodeProfile
from helmgr.core.records import NodeConfig, Request
from helmgr.policy.policies import make_policy
from helmgr.routing.routers import make_router
from helmgr.sim.cluster import Cluster
from helmgr.sim.config import SimConfig
from helmgr.sim.node import Node
from helmgr.workload.chunk import RequestChunk
from tests.conftest import tiny_hardware, tiny_model

TOKENS, FLOPS, COPY, COPY2 = 100, 451_200, 10e-6 + 6400 / 10e9, 10e-6 + 12_800 / 10e9
HOST = 100 * 1e-12                        # 100 rows' host gather at 0.001 ns a row


def profile(**hw) -> NodeProfile:
    base = dict(hbm_gib=0.515625, batch_efficiency=0.5, batch_half_rows=200.0, host_lookup_ns=1e-3)
    return NodeProfile(tiny_hardware(**(base | hw)), tiny_model(), page_mib=1 / 16)


def test_batch_efficiency_curve_by_hand():
    c = CostModel.from_profile(profile())
    assert c.batch_rate(200) == pytest.approx(1e14 * 0.5 * 200 / 400)          # half the plateau
    assert c.batch_rate(600) == pytest.approx(1e14 * 0.5 * 0.75)
    assert c.batch_compute_s(FLOPS, 100) == pytest.approx(FLOPS / (5e13 / 3) + 50e-6)
    # two requests in one batch: one launch, a better rate, less than twice one request's time
    one, two = c.batch_compute_s(FLOPS, 100), c.batch_compute_s(2 * FLOPS, 200)
    assert two == pytest.approx(2 * FLOPS / 2.5e13 + 50e-6) and two < 2 * one
    # each request beyond the first adds its fixed cost; one request alone pays none of it
    per_request = CostModel.from_profile(profile(batch_request_us=20.0))
    assert per_request.batch_compute_s(2 * FLOPS, 200, 2) == pytest.approx(two + 20e-6)
    assert per_request.batch_compute_s(FLOPS, 100, 1) == pytest.approx(one)
    flat = CostModel.from_profile(profile(batch_half_rows=0.0))
    assert flat.batch_rate(1) == flat.batch_rate(10_000) == pytest.approx(5e13)
    with pytest.raises(ValueError):
        c.batch_rate(0)


def requests(n: int, first_user: int = 0) -> list[Request]:
    ids = np.arange(150_000, 150_000 + TOKENS, dtype=np.int64)    # beyond the cache's 131,072 rows: always missed
    return [Request(i, 0.0, first_user + i, 0, ids, ids[:0], 0) for i in range(n)]


def test_serve_batch_waits_for_rows_and_compute_engine():
    node = Node(profile(), 200_000, NodeConfig(ratio=0.5))
    hist = lambda u, a, b: np.arange(a, b)
    services, launch = node.serve_batch(0.0, requests(2), hist, compute_free=0.0)
    ready = 2 * HOST + COPY2             # both requests' rows gathered, then one copy
    compute = 200 * 64 / 1e12 + 2 * FLOPS / 2.5e13 + 50e-6
    assert launch == pytest.approx(ready)
    assert [s.end for s in services] == pytest.approx([ready + compute] * 2)   # the batch ends together
    assert [s.fetch_s for s in services] == pytest.approx([ready] * 2)
    assert node.stats.busy_s == pytest.approx(compute)               # the compute engine's time
    assert node.link.busy_s == pytest.approx(COPY2)
    # the next batch, taken at that launch: its copy runs during the compute, which it then waits for
    services2, launch2 = node.serve_batch(launch, requests(2, 10), hist, compute_free=services[-1].end)
    assert launch2 == pytest.approx(ready + compute)                 # compute-bound: waits for the engine
    assert services2[0].fetch_s == pytest.approx(2 * HOST + COPY2)
    # 20 us of fixed cost for each request beyond a batch's first: the pair computes 20 us longer
    node = Node(profile(batch_request_us=20.0), 200_000, NodeConfig(ratio=0.5))
    services, _ = node.serve_batch(0.0, requests(2), hist, compute_free=0.0)
    assert services[0].end == pytest.approx(ready + compute + 20e-6)


class FixedWorkload:
    """Every request arrives at t = 0: a node saturated from the start. The first request finds
    the node idle and is served alone (no batching delay); the rest queue and go in pairs."""

    name, duration_s, prior, bursts = "fixed", 1.0, None, []

    def __init__(self, n: int):
        self.n, self.n_items, self.n_segments = n, 200_000, 0
        self.history = lambda u, a, b: np.arange(a, b)

    def first_second_lookups(self):
        return 0.0, 0, 0.0

    def chunks(self, chunk_s: float = 1.0):
        n, ids = self.n, np.arange(150_000, 150_000 + TOKENS, dtype=np.int64)
        yield RequestChunk(t=np.zeros(n), user=np.arange(n), prefix_len=np.zeros(n, np.int32),
                           new_tokens=np.full(n, TOKENS, np.int32), item_ids=np.tile(ids, n),
                           item_offsets=np.arange(n + 1, dtype=np.int64) * TOKENS,
                           cand_ids=np.zeros(0, np.int64), cand_offsets=np.zeros(n + 1, np.int64),
                           burst=np.zeros(n, np.int8), segment=np.full(n, -1, np.int64))


def completions(engine: str, pairs: int, **hw) -> list[float]:
    cfg = SimConfig(nodes=1, engine=engine, max_batch=2, router="least-loaded", warmup_s=0.0)
    cluster = Cluster(cfg, FixedWorkload(1 + 2 * pairs), profile(**hw), make_router("least-loaded"),
                      make_policy("static"))
    cluster.run()
    return sorted(set(cluster.rec.end))


@pytest.mark.parametrize("latency_us", [10.0, 100.0])      # compute-bound, then link-bound
def test_saturated_node_runs_at_its_busier_engine(latency_us):
    copy, copy2 = latency_us * 1e-6 + 6400 / 10e9, latency_us * 1e-6 + 12_800 / 10e9
    fetch1, compute1 = HOST + copy, 100 * 64 / 1e12 + FLOPS / (5e13 / 3) + 50e-6     # the lone first request
    fetch, compute = 2 * HOST + copy2, 200 * 64 / 1e12 + 2 * FLOPS / 2.5e13 + 50e-6  # a pair: one copy, 86.1 us of compute
    assert (compute > fetch) == (latency_us == 10.0)
    pairs = 6
    # one server: each batch fetches, then computes
    batched = completions("batched", pairs, pcie_latency_us=latency_us)
    assert batched == pytest.approx([fetch1 + compute1 + k * (fetch + compute) for k in range(pairs + 1)])
    # two engines: a batch is taken when the one before starts computing, fetches on the idle link,
    # and computes once its rows are in and the compute engine is free
    launch, ends = fetch1, [fetch1 + compute1]
    for _ in range(pairs):
        launch = max(launch + fetch, ends[-1])
        ends.append(launch + compute)
    piped = completions("pipelined", pairs, pcie_latency_us=latency_us)
    assert piped == pytest.approx(ends)
    # the saturated throughput: one pair per period of the busier engine, not of the sum
    assert (piped[-1] - piped[1]) / (pairs - 1) == pytest.approx(max(fetch, compute))
    assert (batched[-1] - batched[1]) / (pairs - 1) == pytest.approx(fetch + compute)
