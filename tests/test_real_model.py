import pytest
import torch
import torch.nn.functional as F

from helmgr.core.profiles import load_model
from helmgr.real import DevicePool, HSTUModel, KVLayout, PagedKVCache, shrink

torch.set_num_threads(1)

ATOL = 1e-4


def make_model(seed=0):
    return HSTUModel(shrink(load_model("small"), 16), torch.Generator().manual_seed(seed))


def tokens(model, n, seed=1):
    return torch.randn(n, model.in_dim, generator=torch.Generator().manual_seed(seed))


def slow_reference(model, x, cand):
    """Loops over positions: position i sums SiLU(q_i . k_j) v_j over j <= i, divided by i + 1;
    candidate c sums over the whole history and itself, divided by len(history) + 1."""
    h, c = model.embed(x), model.embed(cand)
    for block in model.blocks:
        u, v, q, k = block.uvqk(h)
        attn = torch.zeros_like(v)
        for i in range(len(h)):
            for j in range(i + 1):
                attn[i] += F.silu((q[i] * k[j]).sum(-1))[:, None] * v[j] / (i + 1)
        cu, cv, cq, ck = block.uvqk(c)
        cattn = torch.zeros_like(cv)
        for i in range(len(c)):
            for j in range(len(h)):
                cattn[i] += F.silu((cq[i] * k[j]).sum(-1))[:, None] * v[j]
            cattn[i] = (cattn[i] + F.silu((cq[i] * ck[i]).sum(-1))[:, None] * cv[i]) / (len(h) + 1)
        h, c = block.output(h, attn, u), block.output(c, cattn, cu)
    return h, (c @ model.w_head.T).squeeze(-1)


def test_shrunk_small_profile_keeps_its_shape():
    p = shrink(load_model("small"), 16)
    assert (p.layers, p.heads, p.d_qk, p.d_v, p.d_model, p.emb_dim) == (3, 4, 8, 8, 32, 32)
    assert KVLayout.from_profile(p).bytes_per_token == 3 * 4 * 16 * 4
    with pytest.raises(ValueError, match="shrink factor must be >= 1 and divide"):
        shrink(load_model("small"), 3)


def test_vectorized_model_matches_a_slow_loop():
    model = make_model()
    x, cand = tokens(model, 6), tokens(model, 3, seed=2)
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
