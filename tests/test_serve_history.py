"""Serving from a history store, without Ray: a replica (`ServeNode`) appends what it serves, a
KV hit's scores equal a cold recompute from the store, and the ingress's prefix is the store's."""
import numpy as np
import pytest
import torch

from helmgr.history import HistoryStore, build
from helmgr.serve.config import ServeConfig
from helmgr.serve.node import ServeNode

torch.set_num_threads(1)

# a log of 3 users over 500 items: user 0 has 30 actions, user 1 has 12, user 2 has 50
rng = np.random.default_rng(0)
LENS = (30, 12, 50)
USER = np.repeat(np.arange(3), LENS)
ITEM = rng.integers(0, 500, len(USER))
TIME = np.arange(len(USER), dtype=float)
CANDS = np.arange(100, 108)


@pytest.fixture
def cfg(tmp_path):
    build(tmp_path / "h", USER, ITEM, TIME, 3, 500).close()
    return ServeConfig(candidates=8, pool_mib=4.0, shrink=32, controller=False, history=str(tmp_path / "h"),
                       len_cap=128).with_sources()


def test_a_store_sets_the_catalogue_and_users(cfg):
    assert (cfg.n_items, cfg.n_users, cfg.store) == (500, 3, True)
    with pytest.raises(Exception, match="is not a history store"):
        ServeConfig(history=str(cfg.history) + "-nope").with_sources()


def test_a_replica_appends_what_it_serves_and_a_hit_scores_as_a_recompute(cfg):
    a = ServeNode(cfg)
    a.warm_up()
    assert HistoryStore(cfg.history).stat()["appends"] == 0          # the warm-up appends nothing ...
    assert a.runtime.kv.peek(cfg.n_users) == a.runtime.kv.peek(cfg.n_users + 1) == 0   # ... and leaves no K/V
    first = a.serve(0, 30, np.array([7, 8, 9]), CANDS)
    assert first["appended"] and first["kv_tokens"] == 0                # a cold miss: the whole prefix from the store
    second = a.serve(0, 33, np.array([10]), CANDS)
    assert second["appended"] and second["kv_tokens"] == 33             # a KV hit on what the first request left
    store = HistoryStore(cfg.history)
    assert store.length(0) == 34 and store.items(0, 30, 34).tolist() == [7, 8, 9, 10]
    b = ServeNode(cfg)                                                   # another replica, nothing cached
    b.warm_up()
    again = b.serve(0, 34, np.array([11]), CANDS)
    hit = a.serve(0, 34, np.array([11]), CANDS)
    assert again["kv_tokens"] == 0 and hit["kv_tokens"] == 34
    np.testing.assert_allclose(hit["scores"], again["scores"], atol=1e-4)   # same history, hit or recompute
    # both served position 34 but only the first to arrive appended it: the other found 35 actions
    assert again["appended"] and not hit["appended"] and HistoryStore(cfg.history).length(0) == 35


def test_a_request_off_the_stores_history_is_served_and_not_appended(cfg):
    node = ServeNode(cfg)
    out = node.serve(1, 5, np.array([1, 2]), CANDS)                     # user 1 has 12 actions, not 5
    assert not out["appended"] and len(out["scores"]) == 8 and HistoryStore(cfg.history).length(1) == 12
    new = node.serve(9, 0, np.array([3]), CANDS)                        # a user the log never saw: created
    assert new["appended"] and HistoryStore(cfg.history).length(9) == 1


def test_a_request_that_no_longer_counts_is_late_and_appends_nothing(cfg):
    """A request that finished past its deadline or whose caller gave up (`in_time()` False when
    the model is done): answered late, nothing appended, so the user's next request, with the
    same prefix, appends; a request in time appends as before."""
    node = ServeNode(cfg)
    cut = node.serve(0, 30, np.array([7, 8]), CANDS, in_time=lambda: False)
    assert "late" in cut and "scores" not in cut and HistoryStore(cfg.history).length(0) == 30
    nxt = node.serve(0, 30, np.array([9]), CANDS, in_time=lambda: True)
    assert nxt["appended"] and HistoryStore(cfg.history).items(0, 30, 31).tolist() == [9]


def test_the_ingress_takes_the_prefix_from_the_store(cfg):
    pytest.importorskip("ray.serve")
    from helmgr.serve.ingress import Progress
    progress = Progress(cfg)
    assert [progress.prefix(u, None) for u in (0, 1, 2, 9)] == [30, 12, 50, 0]
    assert progress.prefix(0, 4) == 4                                    # the client's word wins
    HistoryStore(cfg.history).append(0, [5, 6])                          # a replica in another process
    assert progress.prefix(0, None) == 32


def test_a_logs_requests_are_replayed_in_its_time_order_at_the_rate(cfg, tmp_path):
    from helmgr.serve.answers import Answer, summarize
    from helmgr.serve.loadgen import LoadConfig, trace_requests
    log = tmp_path / "log.inter"
    log.write_text("user_id:token\titem_id:token\ttimestamp:float\n"
                   "b\tx\t5\nA\ty\t1\nb\tz\t5\nA\tx\t7\nb\ty\t3\n")         # users A=0, b=1; items x=0, y=1, z=2
    load = LoadConfig(rps=100.0, duration_s=1.0, trace=str(log))
    sent = list(trace_requests(cfg, load))
    # A's item at t=1, b's at t=3, b's two at t=5 (one request, file order), A's at t=7
    assert [(s.body["user_id"], s.body["new_items"]) for s in sent] == [(0, [1]), (1, [1]), (1, [0, 2]), (0, [0])]
    assert all("prefix_len" not in s.body and len(s.body["candidates"]) == 8 for s in sent)
    t = [s.t for s in sent]
    assert t == sorted(t) and 0 < t[-1] < 1.0                        # 4 arrivals at ~100/s, within the second
    assert [s.body for s in trace_requests(cfg, load)] == [s.body for s in sent]      # seeded
    assert len(list(trace_requests(cfg, LoadConfig(rps=100.0, duration_s=1.0, trace=str(log), max_requests=2)))) == 2
    # with a class table each request names its user's tenant, drawn as the simulator draws it
    from dataclasses import replace
    from helmgr.core.classes import load_table
    named = [s.body["tenant"] for s in trace_requests(replace(cfg, classes="surfaces"), load)]
    table = load_table("surfaces")
    assert named == [table.tenant_names[j] for j in table.assign(np.array([0, 1, 1, 0]), np.zeros(4, bool), cfg.seed)]
    ok = [Answer(0.0, 0.01, 200, 10, 10, 14, 1.0, "a", 0.3, 6.0, 4.0, 3.0, appended) for appended in (True, False)]
    assert summarize(ok, 50.0, 1.0)["appended"] == 1
    # the same replay for the simulator: the same arrivals, users and new items, each prefix starting
    # at the user's whole log (A: y x; b: y x z) and growing by what was replayed before it
    from helmgr.workload.replay import log_replay, store_replay_workload
    from helmgr.workload.trace import read_trace
    trace = read_trace(str(log), "inter")
    w = store_replay_workload(trace, log_replay(trace, 100.0, 1.0, 100, cfg.seed), cfg.n_items, 8, cfg.seed, 1.0)
    chunk = next(iter(w.chunks(1.0)))
    assert chunk.t.tolist() == t and chunk.user.tolist() == [0, 1, 1, 0]
    assert chunk.prefix_len.tolist() == [2, 3, 4, 3]
    assert [chunk.items(i).tolist() for i in range(4)] == [[1], [1], [0, 2], [0]]
    assert chunk.cand_ids.size == 32 and 0 <= chunk.cand_ids.min() and chunk.cand_ids.max() < cfg.n_items


def test_a_users_requests_take_turns_in_arrival_order():
    import asyncio

    from helmgr.serve.turns import Turns
    turns, log = Turns(), []

    async def request(user: int, k: int, hold: float):
        async with turns.of(user):
            log.append(("in", user, k))
            await asyncio.sleep(hold)
            log.append(("out", user, k))

    async def main():
        await asyncio.gather(request(1, 0, 0.03), request(1, 1, 0.0), request(2, 0, 0.01), request(1, 2, 0.0))
    asyncio.run(main())
    mine = [e for e in log if e[1] == 1]
    assert mine == [("in", 1, 0), ("out", 1, 0), ("in", 1, 1), ("out", 1, 1), ("in", 1, 2), ("out", 1, 2)]
    assert log.index(("in", 2, 0)) < log.index(("out", 1, 0))         # another user does not wait
    assert turns.locks == {}                                           # nobody waiting: forgotten


def test_a_replay_resumes_past_what_the_store_holds(cfg, tmp_path):
    """The log: A=0 acts y at 1 and x at 7, b=1 acts y at 3 and x z at 5 (two actions, one
    request). The store appended A's y and b's x z (b's two requests served swapped): the resumed
    replay sends the other two, the first at once, their gap kept. A tail that no order of the
    replay's requests makes is refused."""
    from helmgr.core.errors import HelmInputError
    from helmgr.serve.loadgen import LoadConfig, log_lengths, resume, trace_requests
    from helmgr.workload.trace import read_trace

    log = tmp_path / "log.inter"
    log.write_text("user_id:token\titem_id:token\ttimestamp:float\n"
                   "b\tx\t5\nA\ty\t1\nb\tz\t5\nA\tx\t7\nb\ty\t3\n")
    trace = read_trace(str(log), "inter")
    assert log_lengths(trace).tolist() == [2, 3]
    sent = list(trace_requests(cfg, LoadConfig(rps=100.0, duration_s=1.0, trace=str(log))))
    assert [(s.body["user_id"], s.body["new_items"]) for s in sent] == [(0, [1]), (1, [1]), (1, [0, 2]), (0, [0])]
    rest, skipped, already = resume(sent, {0: [1], 1: [0, 2]})
    assert skipped == 2 and [s.body for s in rest] == [sent[1].body, sent[3].body]
    assert rest[0].t == 0.0 and rest[1].t == pytest.approx(sent[3].t - sent[1].t)
    assert already == {0: [1], 1: [0, 2]}
    rest, skipped, _ = resume(sent, {0: [], 1: []})                      # nothing replayed yet: all of it
    assert skipped == 0 and len(rest) == 4
    rest, skipped, _ = resume(sent, {0: [1, 0], 1: [1, 0, 2]})           # all of it: nothing left
    assert skipped == 4 and rest == []
    with pytest.raises(HelmInputError, match=r"user 1.s history in the store, past the log, .* \(at its item 1\)"):
        resume(sent, {0: [], 1: [1, 0]})                                  # b: y, then half of [0, 2]


def test_loadgen_counts_the_users_the_store_did_not_know():
    from helmgr.serve.answers import Answer, summarize
    answers = [Answer(0.0, 0.01, 200, 0, 0, 5, 1.0, "a", 0.3, appended=True, new_user=new) for new in (True, False, True)]
    answers.append(Answer(0.0, 0.01, 503, 0, 0, 0, 0.0, "", 0.3, new_user=True))       # not answered: not counted
    assert summarize(answers, 50.0, 1.0)["new_users"] == 2


def test_a_replica_with_a_class_table_caches_each_prefix_in_its_band(cfg):
    from dataclasses import replace
    node = ServeNode(replace(cfg, classes="surfaces"))
    kv = node.runtime.kv
    assert kv.floors == [0.0, 0.2, 0.05]                         # surfaces' bands: feed, interactive, refresh
    node.serve(0, 30, np.array([7, 8, 9]), CANDS, append=False, band=2)
    node.serve(1, 10, np.array([7]), CANDS, append=False)         # no class named: band 0
    assert kv.group_pages(2) > 0 and kv.group_pages(0) > 0 and kv.group_pages(1) == 0
    kv.check_integrity()
    plain = ServeNode(cfg).runtime.kv
    assert plain.floors is None
