import pytest
import torch
import torch.nn.functional as F

from helmgr.core.profiles import load_model
from helmgr.real import DevicePool, HSTUModel, KVLayout, PagedKVCache, shrink
from helmgr.real.model import bucket

torch.set_num_threads(1)

ATOL = 1e-4


def make_model(seed=0):
    return HSTUModel(shrink(load_model("small"), 16), torch.Generator().manual_seed(seed))


def tokens(model, n, seed=1):
    return torch.randn(n, model.in_dim, generator=torch.Generator().manual_seed(seed))


def slow_reference(model, x, cand):
    """Loops over positions: position i sums SiLU(q_i . k_j + rab[bucket(i - j)]) v_j over j <= i,
    divided by i + 1; candidate c (at position len(history)) sums over the whole history and
    itself (distance 0), divided by len(history) + 1."""
    h, c = model.embed(x), model.embed(cand)
    for block in model.blocks:
        def rab(d):
            return block.rab[:, int(bucket(torch.tensor(d)))]
        u, v, q, k = block.uvqk(h)
        attn = torch.zeros_like(v)
        for i in range(len(h)):
            for j in range(i + 1):
                attn[i] += F.silu((q[i] * k[j]).sum(-1) + rab(i - j))[:, None] * v[j] / (i + 1)
        cu, cv, cq, ck = block.uvqk(c)
        cattn = torch.zeros_like(cv)
        for i in range(len(c)):
            for j in range(len(h)):
                cattn[i] += F.silu((cq[i] * k[j]).sum(-1) + rab(len(h) - j))[:, None] * v[j]
            cattn[i] = (cattn[i] + F.silu((cq[i] * ck[i]).sum(-1) + rab(0))[:, None] * cv[i]) / (len(h) + 1)
        h, c = block.output(h, attn, u), block.output(c, cattn, cu)
    return h, (c @ model.w_head.T).squeeze(-1)


def test_shrunk_small_profile_keeps_its_shape():
    p = shrink(load_model("small"), 16)
    assert (p.layers, p.heads, p.d_qk, p.d_v, p.d_model, p.emb_dim) == (3, 4, 8, 8, 32, 32)
    assert KVLayout.from_profile(p).bytes_per_token == 3 * 4 * 16 * 4
    with pytest.raises(ValueError, match="shrink factor must be >= 1 and divide"):
        shrink(load_model("small"), 3)


@pytest.mark.parametrize("n,bias", [(6, False), (40, True)])
def test_vectorized_model_matches_a_slow_loop(n, bias):
    """With a trained-like relative bias over distances past the first log buckets (40 positions)
    too: the vectorized attention reads each pair's bias along its diagonal."""
    model = make_model()
    if bias:
        with torch.no_grad():
            for block in model.blocks:
                block.rab.copy_(torch.randn(block.rab.shape, generator=torch.Generator().manual_seed(3)))
    x, cand = tokens(model, n), tokens(model, 3, seed=2)
    hidden, kv = model.prefill(x)
    ref_hidden, ref_scores = slow_reference(model, x, cand)
    torch.testing.assert_close(hidden, ref_hidden, atol=ATOL, rtol=0)
    torch.testing.assert_close(model.score(kv, cand), ref_scores, atol=ATOL, rtol=0)


@pytest.mark.parametrize("cached,new", [(1, 1), (17, 5), (30, 1), (8, 16)])
def test_a_cached_prefix_gives_the_outputs_of_a_full_recompute(cached, new):
    model = make_model()
    x, cand = tokens(model, cached + new), tokens(model, 12, seed=2)
    full_hidden, full_kv = model.prefill(x)
    _, prefix_kv = model.prefill(x[:cached])
    new_hidden, kv = model.extend(x[cached:], prefix_kv)
    assert new_hidden.shape == (new, model.profile.d_model) and kv.tokens == cached + new
    torch.testing.assert_close(new_hidden, full_hidden[cached:], atol=ATOL, rtol=0)
    for layer in range(model.profile.layers):
        torch.testing.assert_close(kv.k[layer], full_kv.k[layer], atol=ATOL, rtol=0)
        torch.testing.assert_close(kv.v[layer], full_kv.v[layer], atol=ATOL, rtol=0)
    torch.testing.assert_close(model.score(kv, cand), model.score(full_kv, cand), atol=ATOL, rtol=0)


def test_the_prefix_round_trips_through_the_paged_kv_cache():
    model = make_model()
    x, cand = tokens(model, 40), tokens(model, 16, seed=2)
    full_hidden, full_kv = model.prefill(x)
    layout = model.layout
    pool = DevicePool(64 * 4 * layout.bytes_per_token, 4 * layout.bytes_per_token, 256)   # 4 tokens/page
    cache = PagedKVCache(pool, layout)
    _, prefix_kv = model.prefill(x[:35])
    assert cache.put(7, *prefix_kv) == 35
    new_hidden, kv = model.extend(x[35:], cache.get(7))
    torch.testing.assert_close(new_hidden, full_hidden[35:], atol=ATOL, rtol=0)
    torch.testing.assert_close(model.score(kv, cand), model.score(full_kv, cand), atol=ATOL, rtol=0)
    cache.check_integrity()


def test_candidates_do_not_see_each_other():
    model = make_model()
    _, kv = model.prefill(tokens(model, 20))
    cand = tokens(model, 10, seed=3)
    all_scores = model.score(kv, cand)
    torch.testing.assert_close(model.score(kv, cand[[7, 2]]), all_scores[[7, 2]], atol=ATOL, rtol=0)


def test_a_position_does_not_depend_on_later_ones():
    model = make_model()
    x = tokens(model, 12)
    torch.testing.assert_close(model.prefill(x[:5])[0], model.prefill(x)[0][:5], atol=ATOL, rtol=0)


@pytest.mark.parametrize("shapes", [
    [(0, 7, 5), (10, 3, 4), (4, 1, 6), (20, 2, 2)],        # KV misses and hits, every size different
    [(9, 4, 3), (9, 4, 3), (9, 4, 3)],                     # one shape
    [(12, 2, 5)],                                          # a batch of one
])
def test_a_batch_gives_each_request_what_it_gets_alone(shapes):
    """(cached, new, candidates) per request; extend_batch + score_batch against extend + score."""
    model = make_model()
    pasts, news, cands, alone = [], [], [], []
    for i, (cached, new, c) in enumerate(shapes):
        x, cand = tokens(model, cached + new, seed=10 + i), tokens(model, c, seed=50 + i)
        past = model.prefill(x[:cached])[1] if cached else model.layout.empty()
        _, full = model.extend(x[cached:], past)
        pasts.append(past), news.append(x[cached:]), cands.append(cand)
        alone.append((full, model.score(full, cand)))
    kv = model.extend_batch(torch.cat(news), [len(x) for x in news], pasts)
    scores = model.score_batch(kv, torch.cat(cands), [len(c) for c in cands])
    assert kv.lengths == tuple(c + n for c, n, _ in shapes)
    for b, (full, want) in enumerate(alone):
        got = kv.request(b)
        for layer in range(model.profile.layers):
            torch.testing.assert_close(got.k[layer], full.k[layer], atol=ATOL, rtol=0)
            torch.testing.assert_close(got.v[layer], full.v[layer], atol=ATOL, rtol=0)
        torch.testing.assert_close(scores[b], want, atol=ATOL, rtol=0)


def test_a_batch_computes_its_requests_real_tokens_and_nothing_for_padding():
    """A KV miss's 40 positions beside three hits of one new token each: the batch's FLOPs (every
    matmul and einsum, torch's count) are the sum of the requests' FLOPs alone, where attention
    padded to the longest sequence would compute 4 x 40 queries over 40 keys."""
    from torch.utils.flop_counter import FlopCounterMode
    model = make_model()
    shapes = [(0, 40, 8), (30, 1, 8), (35, 1, 8), (39, 1, 8)]      # (cached, new, candidates)
    xs = [tokens(model, c + n, seed=30 + i) for i, (c, n, _) in enumerate(shapes)]
    cands = [tokens(model, k, seed=60 + i) for i, (_, _, k) in enumerate(shapes)]
    pasts = [model.prefill(x[:c])[1] if c else model.layout.empty() for x, (c, _, _) in zip(xs, shapes)]

    def flops(run) -> int:
        with FlopCounterMode(display=False) as count:
            run()
        return count.get_total_flops()

    def alone():
        for x, cand, past, (c, _, _) in zip(xs, cands, pasts, shapes):
            model.score(model.extend(x[c:], past)[1], cand)

    def batch():
        kv = model.extend_batch(torch.cat([x[c:] for x, (c, _, _) in zip(xs, shapes)]), [n for _, n, _ in shapes], pasts)
        model.score_batch(kv, torch.cat(cands), [k for _, _, k in shapes])
    assert flops(batch) == flops(alone) > 0


def test_a_batch_with_miscounted_rows_is_a_named_value_error():
    model = make_model()
    past = model.prefill(tokens(model, 3))[1]
    with pytest.raises(ValueError, match="needs as many row counts and their sum of rows"):
        model.extend_batch(tokens(model, 4), [1, 2], [past, past])
    kv = model.extend_batch(tokens(model, 3), [1, 2], [past, past])
    with pytest.raises(ValueError, match="needs as many candidate counts"):
        model.score_batch(kv, tokens(model, 5), [2, 2])


def test_fp16_rows_from_the_emb_cache_are_accepted():
    model = make_model()
    x = tokens(model, 4)
    torch.testing.assert_close(model.prefill(x.half())[0], model.prefill(x.half().float())[0])


def test_bad_shapes_are_named_value_errors():
    model = make_model()
    with pytest.raises(ValueError, match=r"token embeddings must be \(n, 128\), got \(3, 5\)"):
        model.prefill(torch.zeros(3, 5))
    _, kv = model.prefill(tokens(model, 3))
    with pytest.raises(ValueError, match="cached K/V has 2 layers, the model 3"):
        model.extend(tokens(model, 1), type(kv)(kv.k[:2], kv.v[:2]))


def test_same_seed_same_weights():
    a, b = make_model(seed=4), make_model(seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.w_in, make_model(seed=5).w_in)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cached_prefix_equivalence_on_cuda():
    model = make_model().cuda()
    x, cand = tokens(model, 24).cuda(), tokens(model, 8, seed=2).cuda()
    full_hidden, full_kv = model.prefill(x)
    new_hidden, kv = model.extend(x[20:], model.prefill(x[:20])[1])
    torch.testing.assert_close(new_hidden, full_hidden[20:], atol=ATOL, rtol=0)
    torch.testing.assert_close(model.score(kv, cand), model.score(full_kv, cand), atol=ATOL, rtol=0)
    cpu = make_model()
    torch.testing.assert_close(model.score(kv, cand).cpu(), cpu.score(cpu.prefill(x.cpu())[1], cand.cpu()),
                               atol=ATOL, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_batch_on_cuda_gives_each_request_what_it_gets_alone():
    model = make_model().cuda()
    shapes = [(0, 6, 4), (9, 2, 4), (3, 1, 2)]                    # (cached, new, candidates)
    xs = [tokens(model, c + n, seed=20 + i).cuda() for i, (c, n, _) in enumerate(shapes)]
    cands = [tokens(model, k, seed=60 + i).cuda() for i, (_, _, k) in enumerate(shapes)]
    pasts = [model.prefill(x[:c])[1] if c else model.layout.empty("cuda") for x, (c, _, _) in zip(xs, shapes)]
    kv = model.extend_batch(torch.cat([x[c:] for x, (c, _, _) in zip(xs, shapes)]), [n for _, n, _ in shapes], pasts)
    scores = model.score_batch(kv, torch.cat(cands), [k for _, _, k in shapes])
    for x, cand, got in zip(xs, cands, scores):
        torch.testing.assert_close(got, model.score(model.prefill(x)[1], cand), atol=ATOL, rtol=0)
