import numpy as np
import pytest
import torch

from helmgr.core.records import NodeConfig
from helmgr.core.profiles import NodeProfile, load_hardware, load_model
from helmgr.real.runtime import NodeRuntime, RealRequest, predicted, runtime_model
from helmgr.policy.base import Scheduled

torch.set_num_threads(1)

ATOL = 1e-4
N_ITEMS = 400
CANDS = 8
HISTORY = np.random.default_rng(7).integers(0, N_ITEMS, size=(10, 200))   # user -> item id per position


def history(user, start, stop):
    return HISTORY[user, start:stop]


def runtime(ratio=0.5, budget_kib=256, tail_first=False, seed=0):
    """small/16 in fp32: 512-byte rows, 768-byte tokens; 64 KiB pages (4 of them), so EMB holds
    128 rows a page and KV 85 tokens a page."""
    profile = NodeProfile(load_hardware("a100-80g"), runtime_model("small", 16, CANDS), page_mib=1 / 16)
    return NodeRuntime(profile, budget_kib << 10, "cpu", seed, N_ITEMS,
                       NodeConfig(ratio=ratio, kv_tail_first=tail_first))


def candidates(seed):
    return np.random.default_rng(seed).choice(N_ITEMS, CANDS, replace=False)


def serve(rt, user, prefix_len, new, seed):
    return rt.serve(0.0, user, prefix_len, history(user, prefix_len, prefix_len + new), candidates(seed), history)


def from_scratch(rt, user, prefix_len, new, seed):
    """The same request computed by the model alone: the whole history from the host table."""
    host = rt.emb.host
    _, kv = rt.model.prefill(host[torch.from_numpy(history(user, 0, prefix_len + new))])
    return rt.model.score(kv, host[torch.from_numpy(candidates(seed))])


def test_scores_match_a_from_scratch_computation_on_kv_miss_and_hit():
    rt = runtime()
    first = serve(rt, user=1, prefix_len=30, new=4, seed=1)
    assert first.kv_tokens == 0 and first.tokens == 34 and first.ids == 34 + CANDS
    torch.testing.assert_close(first.scores, from_scratch(rt, 1, 30, 4, 1), atol=ATOL, rtol=0)
    second = serve(rt, user=1, prefix_len=34, new=3, seed=2)          # the user's next request
    assert second.kv_tokens == 34 and second.tokens == 3              # only the new tokens computed
    torch.testing.assert_close(second.scores, from_scratch(rt, 1, 34, 3, 2), atol=ATOL, rtol=0)
    assert rt.kv.peek(1) == 37
    s = rt.stats
    assert (s.requests, s.cold_requests, s.prefix_tokens, s.kv_hit_tokens) == (2, 1, 64, 34)
    assert s.kv_hit_rate == pytest.approx(34 / 64)
    assert s.token_ids == 37 and s.ids == 37 + 2 * CANDS
    rt.check_integrity()


def test_emb_counters_follow_the_lookups():
    rt = runtime()
    a = serve(rt, user=2, prefix_len=20, new=2, seed=3)
    assert a.misses == a.ids == rt.stats.misses                    # cold cache: every id misses
    assert a.rows_fetched == len(np.unique(np.concatenate([history(2, 0, 22), candidates(3)])))
    b = serve(rt, user=2, prefix_len=22, new=2, seed=3)              # same candidates: now resident
    assert b.misses <= 2 and rt.stats.misses == a.misses + b.misses
    assert rt.stats.ids == a.ids + b.ids
    assert rt.stats.emb_hit_rate == pytest.approx(1 - rt.stats.misses / rt.stats.ids)
    assert rt.emb.hits + rt.stats.misses == rt.emb.lookups
    assert a.emb_s > 0 and a.compute_s > 0 and a.score_s > 0
    assert a.service_s >= a.emb_s + a.kv_s + a.compute_s + a.score_s


@pytest.mark.parametrize("tail_first", [False, True])
def test_resize_keeps_integrity_counters_and_exact_scores(tail_first):
    rt = runtime(ratio=0.25, tail_first=tail_first)
    assert (rt.pool.emb_pages, rt.pool.kv_pages) == (1, 3)
    prefix = {0: 30, 1: 30}
    served = []
    for step, ratio in enumerate([None, 0.25, 0.75, 0.25, 0.5, 0.25]):
        if ratio is not None:
            plan, wake = rt.resize(ratio, now=float(step))
            assert wake is None and rt.ratio == plan.ratio_after
            rt.check_integrity()
        for u in prefix:
            s = serve(rt, u, prefix[u], 5, seed=10 * step + u)
            torch.testing.assert_close(s.scores, from_scratch(rt, u, prefix[u], 5, 10 * step + u), atol=ATOL, rtol=0)
            served.append((prefix[u], s))
            prefix[u] += 5
            rt.check_integrity()
    st = rt.stats
    assert st.requests == len(served)
    assert st.prefix_tokens == sum(p for p, _ in served)
    assert st.kv_hit_tokens == sum(s.kv_tokens for _, s in served)
    assert st.ids == sum(s.ids for _, s in served) and st.misses == sum(s.misses for _, s in served)
    # cold: both first requests, then each user once around the shrink to one KV page (user 1 lost
    # its page to the EMB; serving it again evicted user 0)
    assert st.cold_requests == sum(s.kv_tokens == 0 for _, s in served) == 4
    assert rt.emb.hits + st.misses == rt.emb.lookups


def test_a_trimmed_prefix_is_extended_from_where_it_stops():
    rt = runtime(ratio=0.25, tail_first=True)
    serve(rt, user=0, prefix_len=100, new=5, seed=1)             # 105 tokens: KV pages 0 and 1
    assert rt.kv.entries[0].pages == (0, 1)
    rt.resize(0.75)                                               # KV keeps page 0 only
    assert rt.kv.peek(0) == rt.kv.tokens_per_page == 85
    s = serve(rt, user=0, prefix_len=105, new=5, seed=2)
    assert s.kv_tokens == 85 and s.tokens == 105 - 85 + 5 and s.recompute_s > 0
    torch.testing.assert_close(s.scores, from_scratch(rt, 0, 105, 5, 2), atol=ATOL, rtol=0)
    rt.check_integrity()


def test_a_memory_policy_drives_the_runtime_like_a_simulated_node():
    rt = runtime(ratio=0.25)
    policy = Scheduled([(0.0, 0.25), (1.0, 0.75)])
    policy.attach(0, rt)
    rt.resize(policy.decide(0, rt, now=2.0), now=2.0)
    assert rt.ratio == 0.75 and rt.pool.emb_pages == 3
    rt.check_integrity()


def test_the_prediction_is_the_cost_models_breakdown_of_what_was_seen():
    rt = runtime()
    serve(rt, user=3, prefix_len=40, new=4, seed=5)
    s = serve(rt, user=3, prefix_len=44, new=2, seed=6)
    expected = rt.cost.breakdown(44, 44, 2, CANDS, s.rows_fetched)
    assert rt.prediction(s, 44) == expected == predicted(rt.cost, s, 44)


def request(user, prefix_len, new, seed):
    return RealRequest(user, prefix_len, history(user, prefix_len, prefix_len + new), candidates(seed))


def test_a_batch_serves_each_request_as_it_would_be_served_alone():
    rt = runtime(budget_kib=512)
    first = serve(rt, user=1, prefix_len=30, new=4, seed=1)          # user 1's prefix is cached
    seeds = {1: 2, 3: 3, 4: 4}
    batch = [request(1, 34, 3, seeds[1]), request(3, 20, 2, seeds[3]), request(4, 5, 1, seeds[4])]
    served = rt.serve_batch(5.0, batch, history)
    assert [s.kv_tokens for s in served.services] == [34, 0, 0]
    assert [s.tokens for s in served.services] == [3, 22, 6]
    assert [s.ids for s in served.services] == [3 + CANDS, 22 + CANDS, 6 + CANDS]
    for r, s in zip(batch, served.services):
        want = from_scratch(rt, r.user, r.prefix_len, len(r.new_ids), seeds[r.user])
        torch.testing.assert_close(s.scores, want, atol=ATOL, rtol=0)
        assert (s.start, s.end) == (5.0, 5.0 + served.service_s)
        assert rt.kv.peek(r.user) == r.prefix_len + len(r.new_ids)
    assert served.service_s >= served.emb_s + served.kv_s + served.compute_s + served.score_s > 0
    assert served.rows_fetched <= sum(s.rows_fetched for s in served.services)
    st = rt.stats
    assert (st.requests, st.cold_requests, st.prefix_tokens, st.kv_hit_tokens) == (4, 3, 30 + 34 + 20 + 5, 34)
    assert st.ids == first.ids + sum(s.ids for s in served.services)
    assert st.misses == first.misses + sum(s.misses for s in served.services)
    assert rt.emb.hits + st.misses == rt.emb.lookups
    rt.check_integrity()


def test_the_runtime_refuses_what_it_does_not_run():
    hw = load_hardware("a100-80g")
    with pytest.raises(ValueError, match="runs fp32"):
        NodeRuntime(NodeProfile(hw, load_model("small"), 1 / 16), 256 << 10)
    with pytest.raises(ValueError, match="lazy refill"):
        NodeRuntime(NodeProfile(hw, runtime_model(), 1 / 16), 256 << 10, config=NodeConfig(refill="sync"))
