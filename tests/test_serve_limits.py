"""The server bounds its work (issue 23 item 5), without Ray: strict bodies, the body-size limit,
422s that do not echo the input, the cost cap, the replica's deadline-aware queue, readiness,
and loadgen's strict summary."""
import asyncio
import json
import math
import threading
import time

import numpy as np
import pytest

from helmgr.core.costs import CostModel
from helmgr.core.errors import HelmInputError
from helmgr.serve.body import MAX_ERRORS, BodyError, parse_body, read_body
from helmgr.serve.config import ServeConfig
from helmgr.serve.gate import Gate, Late
from helmgr.serve.limits import RequestLimits
from helmgr.serve.answers import Answer, summarize
from helmgr.serve.loadgen import LoadConfig
from helmgr.serve.warm import Warmup
from helmgr.serve.worker import Worker

CFG = ServeConfig(n_items=4096, candidates=8, pool_mib=4.0, shrink=32, len_median=40.0, len_cap=128, n_users=1000)


def refused(raw: bytes) -> BodyError:
    with pytest.raises(BodyError) as got:
        parse_body(raw)
    return got.value


@pytest.mark.parametrize("raw, loc", [
    (b'{"user_id": NaN, "new_items": [1], "candidates": [2]}', ["body", "user_id"]),
    (b'{"user_id": 3, "new_items": [1], "candidates": [2, Infinity]}', ["body", "candidates", 1]),
    (b'{"user_id": 3, "new_items": [-Infinity], "candidates": [2]}', ["body", "new_items", 0]),
    (b'{"user_id": 3, "new_items": [1], "candidates": [2], "prefix_len": 1e400}', ["body", "prefix_len"]),
    (b'{"user_id": 3, "new_items": [1], "candidates": [2], "extra": {"x": [NaN]}}', ["body", "extra", "x", 0]),
])
def test_non_finite_numbers_are_422_naming_the_field(raw, loc):
    err = refused(raw)
    assert err.status == 422 and err.detail[0]["loc"] == loc and err.detail[0]["type"] == "finite_number"
    json.dumps(err.detail, allow_nan=False)                  # the answer itself is strict JSON


def test_a_422_names_the_field_without_echoing_the_input():
    secret = "s3cr3t" * 1000
    big = {"user_id": 3, "new_items": [1], "candidates": [secret] * 4096}
    err = refused(json.dumps(big).encode())
    text = json.dumps(err.detail)
    assert err.status == 422 and "s3cr3t" not in text and len(text) < 4000
    assert [e["loc"] for e in err.detail[:2]] == [["body", "candidates", 0], ["body", "candidates", 1]]
    assert len(err.detail) == MAX_ERRORS + 1 and err.detail[-1]["msg"] == f"{4096 - MAX_ERRORS} more errors not shown"
    assert all(set(e) == {"loc", "type", "msg"} for e in err.detail)
    assert refused(b'{"user_id": 3, "new_items": [1], "candidates": [2], "colour": "' + secret.encode() + b'"}') \
        .detail == [{"loc": ["body", "colour"], "type": "extra_forbidden", "msg": "Extra inputs are not permitted"}]
    assert refused(b'{"user_id": ').detail[0]["type"] == "json_invalid"
    assert refused(b"\xff\xfe").detail[0]["type"] == "json_invalid"
    assert parse_body(b'{"user_id": 3, "new_items": [1], "candidates": [2, 3]}').candidates == [2, 3]


def read(chunks, length, limit):
    async def gen():
        for c in chunks:
            if c is None:
                raise AssertionError("read past the declared length")
            yield c
    return asyncio.run(read_body(gen(), length, limit))


def test_an_oversized_body_is_413_before_it_is_read():
    with pytest.raises(BodyError) as got:
        read([None], str(2 << 20), 1 << 20)                  # declared too large: not a byte read
    assert got.value.status == 413 and got.value.detail[0]["type"] == "too_large"
    with pytest.raises(BodyError) as got:
        read([b"x" * 600, b"x" * 600, None], None, 1000)      # streamed (no length): stops at the crossing chunk
    assert got.value.status == 413
    with pytest.raises(BodyError) as got:
        read([b"x" * 600, b"x" * 600, None], "10", 1000)      # a false length does not get past the limit
    assert got.value.status == 413
    with pytest.raises(BodyError) as got:
        read([], "ten", 1000)
    assert got.value.status == 400
    assert read([b"ab", b"cd"], "4", 4) == b"abcd"


def test_the_cost_cap_refuses_a_request_priced_above_it_by_the_cost_model():
    limits = RequestLimits(CFG)
    cost = CostModel.from_profile(CFG.node_profile())
    # worst case: nothing cached, every id missed (hand-built from the cost model's own terms)
    p, n, c = 300, 4, 8
    ids = p + n + c
    by_hand = (cost.lookup_s(ids) + cost.host_s(ids) + cost.transfer_s(ids * cost.row_bytes)
               + cost.compute_s(p + n, 0, c))
    assert limits.worst_case_s(p, n, c) == pytest.approx(by_hand)
    api_max = parse_body(json.dumps({"user_id": 3, "new_items": [1] * 256, "candidates": [2] * 4096}).encode())
    assert limits.worst_case_s(8192, 256, 4096) > CFG.max_cost_s
    with pytest.raises(BodyError) as got:
        limits.check(api_max, 8192)
    d = got.value.detail[0]
    assert got.value.status == 422 and d["type"] == "cost_cap" and "prefix_len 8192" in d["msg"]
    small = parse_body(b'{"user_id": 3, "new_items": [1, 2, 3, 4], "candidates": [5, 6, 7, 8]}')
    limits.check(small, 200)                                  # typical: passes
    with pytest.raises(BodyError) as got:
        limits.check(parse_body(b'{"user_id": 3, "new_items": [1], "candidates": [4096]}'), 0)
    assert got.value.detail[0]["loc"] == ["body", "candidates", 0]
    with pytest.raises(BodyError) as got:
        limits.check(small, CFG.max_prefix + 1)
    assert got.value.detail[0]["loc"] == ["body", "prefix_len"]


def test_limits_default_from_the_slo_and_are_validated():
    assert CFG.deadline_s == pytest.approx(20 * 0.05) and CFG.max_cost_s == pytest.approx(2 * 0.05)
    cfg = ServeConfig(slo_ms=20.0, deadline_ms=300.0)
    assert cfg.deadline_s == 0.3 and cfg.max_cost_s == pytest.approx(0.04)
    for bad in ({"deadline_ms": math.inf}, {"slo_ms": math.nan}, {"max_cost_ms": 2000.0}, {"max_body_bytes": 0}):
        with pytest.raises(HelmInputError):
            ServeConfig(**bad).validate()


def test_the_gate_serves_the_cheapest_first_and_refuses_what_cannot_finish_in_time():
    now = [100.0]
    order = []

    async def main():
        gate = Gate(clock=lambda: now[0])
        await gate.enter(0.2, now[0] + 1.0)                   # in service: 0.2 s predicted
        with pytest.raises(Late):                             # 0.2 ahead + 0.9 own > 1.0 left
            await gate.enter(0.9, now[0] + 1.0)

        async def one(name, cost):
            await gate.enter(cost, now[0] + 50.0)
            order.append(name)
            gate.leave()
        tasks = [asyncio.create_task(one(n, c)) for n, c in (("big", 0.5), ("small", 0.01), ("mid", 0.1))]
        await asyncio.sleep(0)
        assert gate.waiting == 3 and gate.ahead_s(0.1) == pytest.approx(0.2 + 0.01 + 0.1)
        gate.leave()
        await asyncio.gather(*tasks)
        assert not gate.busy and gate.cut == 1
    asyncio.run(main())
    assert order == ["small", "mid", "big"]


def test_a_cancelled_waiter_leaves_the_queue_and_the_next_is_served():
    async def main():
        gate = Gate()
        await gate.enter(0.0, math.inf)
        waiter = asyncio.create_task(gate.enter(0.01, time.time() + 60))
        after = asyncio.create_task(gate.enter(0.02, time.time() + 60))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.sleep(0)
        gate.leave()
        await asyncio.wait_for(after, 5)
        assert waiter.cancelled() and gate.busy and gate.waiting == 0
        gate.leave()
        assert not gate.busy
    asyncio.run(main())


class SlowNode:
    """A node whose serve blocks until released (a request "still computing")."""

    def __init__(self):
        self.release, self.served, self.latencies, self.counted = threading.Event(), [], [], []

    def predict_s(self, user, prefix_len, n_new, n_candidates):
        return 0.001

    def serve(self, user, prefix_len, new_ids, cand_ids, append=True, forget=False, in_time=None, band=0):
        if user == 0:
            assert self.release.wait(30)
        self.served.append(user)
        self.counted.append(in_time())                   # what ServeNode.serve asks before it appends
        return {"scores": [0.0] * len(cand_ids)} if self.counted[-1] else {"late": "past its deadline"}

    def finished(self, latency_s):
        self.latencies.append(latency_s)


def test_a_request_whose_deadline_passes_in_the_queue_is_not_served_and_the_next_one_is():
    async def main():
        node = SlowNode()
        w = Worker(node)
        first = asyncio.create_task(w.serve(0, 0, [1], [2], time.time() + 60))
        await asyncio.sleep(0.01)
        late = await w.serve(1, 0, [1], [2], time.time() + 0.05)      # queued behind user 0, start-by passes
        past = await w.serve(2, 0, [1], [2], time.time() - 1.0)       # deadline already gone: no wait at all
        assert "late" in late and "late" in past and node.served == []
        node.release.set()
        assert "scores" in await first
        nxt = await w.serve(3, 0, [1], [2], time.time() + 60)
        assert "scores" in nxt and nxt["cut"] == 2 and node.served == [0, 3]
    asyncio.run(main())


def test_a_caller_cancelled_while_computing_holds_the_next_until_the_work_ends_and_is_told():
    async def main():
        node = SlowNode()
        w = Worker(node)
        first = asyncio.create_task(w.serve(0, 0, [1], [2], time.time() + 60))
        await asyncio.sleep(0.01)
        first.cancel()                                   # the client went away; the thread still computes
        await asyncio.sleep(0.01)
        assert w.gate.busy
        nxt = asyncio.create_task(w.serve(4, 0, [1], [2], time.time() + 60))
        await asyncio.sleep(0.01)
        assert not nxt.done() and node.served == []      # not started alongside the running work
        node.release.set()
        assert "scores" in await asyncio.wait_for(nxt, 10)
        assert node.served == [0, 4] and len(node.latencies) == 2
        assert node.counted == [False, True]            # the cancelled one was told: it appends nothing
    asyncio.run(main())


def test_a_request_that_finishes_past_its_deadline_is_late_and_does_not_count():
    """Started in time, its work ends past its deadline: the replica answers late (a 504 at the
    ingress) and tells the work it does not count (nothing appended), whatever the caller does."""
    async def main():
        node = SlowNode()
        w = Worker(node)
        first = asyncio.create_task(w.serve(0, 0, [1], [2], time.time() + 0.05))
        await asyncio.sleep(0.1)                         # its deadline passes while it computes
        node.release.set()
        out = await first
        assert "late" in out and "scores" not in out and node.counted == [False] and w.gate.cut == 1
        ok = await w.serve(5, 0, [1], [2], time.time() + 60)
        assert "scores" in ok and node.counted == [False, True]
    asyncio.run(main())


def test_healthz_is_503_until_warm_up_requests_were_answered():
    warm = Warmup(replicas=2, rounds=6, pause_s=0.0)
    calls = []

    async def call(k):                                   # replica "b" answers from the fourth request on
        calls.append(k)
        if k == 1:
            raise RuntimeError("replica starting")
        return {"scores": [0.0], "node": "a" if k < 3 else "b"}

    assert warm.health()[0] == 503
    asyncio.run(warm.run(call))
    status, body = warm.health()
    assert status == 200 and body["replicas_warm"] == 2 and calls == [0, 1, 2, 3]

    one = Warmup(replicas=2, rounds=5, pause_s=0.0)      # only one replica ever answers: ready after `rounds`
    asyncio.run(one.run(lambda k: asyncio.sleep(0, {"scores": [0.0], "node": "a"})))
    assert one.ready and one.seen == {"a"} and one.answered == 5


def test_loadgen_summary_is_strict_json_with_a_reason_for_what_is_not_measured():
    failed = [Answer(0.1 * k, 0.5, 504, 10, 0, 0, 0.0, "", math.nan) for k in range(3)]
    out = summarize(failed, 50.0, 1.0)
    assert out["p99_ms"] is None and out["mean_ratio"] is None and out["nulls"]["p99_ms"] == "no request completed"
    assert out["status_counts"] == {"504": 3} and out["completed"] == 0
    json.dumps(out, allow_nan=False)
    assert out["split_ms"] is None and out["nulls"]["split_ms"] == "no request completed"
    # 10 ms at the client, 6 in the ingress's handler, 4 at the replica, 3 of service
    ok = summarize([Answer(0.0, 0.01, 200, 10, 10, 14, 1.0, "a", 0.3, 6.0, 4.0, 3.0)] + failed, 50.0, 1.0)
    assert ok["p50_ms"] == pytest.approx(10.0) and "nulls" not in ok and ok["status_counts"] == {"200": 1, "504": 3}
    assert ok["split_ms"]["p99"] == pytest.approx({"http_ms": 4.0, "ingress_ms": 2.0, "queue_ms": 1.0, "service_ms": 3.0})
    json.dumps(ok, allow_nan=False)
    for bad in ({"duration_s": math.inf}, {"rps": math.nan}, {"timeout_s": 0.0}):
        with pytest.raises(HelmInputError, match=next(iter(bad)).removesuffix("_s")):
            LoadConfig(**bad).validate()


def test_a_node_warms_up_and_predicts_its_service_from_what_it_holds():
    from helmgr.serve.node import ServeNode

    node = ServeNode(ServeConfig.from_dict(CFG.to_dict() | {"controller": True}))
    node.warm_up()
    assert node.runtime.stats.requests == 4 and node.decisions == 0 and node.window().arrival_rps == 0.0
    h = node.history
    cold = node.predict_s(3, 40, 4, 8)
    node.serve(3, 40, h(3, 40, 44), np.arange(8))
    assert node.predict_s(3, 44, 4, 8) < node.predict_s(5, 44, 4, 8)    # user 3's prefix is cached here
    assert 0.5 <= node.slowdown <= 10.0 and cold > 0
    node.runtime.check_integrity()


@pytest.mark.parametrize("field, value, named", [("replicas", 2.5, "integer"), ("seed", 2**40, "seed"),
                                                 ("deadline_ms", float("nan"), "finite")])
def test_serve_config_numbers_go_through_the_one_check(field, value, named):
    from helmgr.core.errors import HelmInputError
    with pytest.raises(HelmInputError, match=named):
        ServeConfig(**{field: value}).validate()


def test_the_gate_serves_the_lower_band_first_then_the_cheapest():
    now = [100.0]
    order = []

    async def main():
        gate = Gate(clock=lambda: now[0])
        await gate.enter(0.2, now[0] + 1.0, band=1)           # in service: 0.2 s predicted

        async def one(name, cost, band):
            await gate.enter(cost, now[0] + 50.0, band)
            order.append(name)
            gate.leave()
        jobs = (("cheap, band 2", 0.01, 2), ("dear, band 0", 0.5, 0), ("cheap, band 1", 0.02, 1),
                ("cheaper, band 0", 0.1, 0))
        tasks = [asyncio.create_task(one(*job)) for job in jobs]
        await asyncio.sleep(0)
        # ahead of a 0.3-s band-0 request: the one in service and band 0's cheaper one, not the others
        assert gate.waiting == 4 and gate.ahead_s(0.3, band=0) == pytest.approx(0.2 + 0.1)
        assert gate.ahead_s(0.3, band=1) == pytest.approx(0.2 + 0.5 + 0.1 + 0.02)
        with pytest.raises(Late):                             # 0.82 ahead + 0.3 own > 1.0 left
            await gate.enter(0.3, now[0] + 1.0, band=1)
        gate.leave()
        await asyncio.gather(*tasks)
    asyncio.run(main())
    assert order == ["cheaper, band 0", "dear, band 0", "cheap, band 1", "cheap, band 2"]
