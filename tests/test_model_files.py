"""The model from files: next-item training scores as serving scores, a checkpoint round-trips
(table memory-mapped), a served answer equals the checkpoint's model computed from scratch, and a
checkpoint that does not fit its preset is refused naming the tensor."""
import json
import resource
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from helmgr.cli import main
from helmgr.core.errors import HelmInputError
from helmgr.real import checkpoint, nextitem
from helmgr.real.model import HSTUModel
from helmgr.real.runtime import runtime_model
from helmgr.serve.config import ServeConfig
from helmgr.serve.node import ServeNode

torch.set_num_threads(1)


def small_model(seed=1, shrink=32):
    return HSTUModel(runtime_model("small", shrink), torch.Generator().manual_seed(seed))


def clustered_log(path, users=120, clusters=4, per=15, length=12, seed=0):
    """Users who each act only on their cluster's `per` items (4 x 15 = 60 items): what a user did
    tells which items come next, which popularity cannot know."""
    rng = np.random.default_rng(seed)
    lines = ["user_id:token\titem_id:token\ttimestamp:float"]
    for u in range(users):
        c = u % clusters
        for t, i in enumerate(rng.integers(0, per, length)):
            lines.append(f"u{u}\ti{c * per + i:03d}\t{t}")
    path.write_text("\n".join(lines) + "\n")
    return path


def mapped_from(t: torch.Tensor) -> str | None:
    """The file whose memory mapping holds `t`'s data (Linux: /proc/self/maps)."""
    addr = t.data_ptr()
    for line in open("/proc/self/maps"):
        span, *rest = line.split()
        lo, hi = (int(x, 16) for x in span.split("-"))
        if lo <= addr < hi:
            return rest[4] if len(rest) > 4 else None
    return None


def test_training_scores_are_the_served_scores():
    m = small_model()
    with torch.no_grad():
        for block in m.blocks:                                           # a trained model's position bias
            block.rab.copy_(torch.randn(block.rab.shape, generator=torch.Generator().manual_seed(8)))
    table = torch.randn(50, m.in_dim, generator=torch.Generator().manual_seed(2))
    ids = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(3))
    pos = torch.tensor([[0, 3, 19], [12, 5, 1]])                        # distances past 8 share buckets
    cand = torch.randint(0, 50, (2, 3, 4), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got = nextitem.candidate_scores(m, table[ids], pos, table[cand])
    for b in range(2):
        for p in range(3):
            _, kv = m.prefill(table[ids[b, :int(pos[b, p]) + 1]])      # the history up to the position
            torch.testing.assert_close(got[b, p], m.score(kv, table[cand[b, p]]), atol=1e-5, rtol=1e-5)


def test_ranks_and_metrics_by_hand():
    # users 0..2: [3, 1, 2], [1, 1], [2, 0, 0, 1]; training counts (last items out): item 0: 2, 1: 2, 2: 1, 3: 1
    seqs = nextitem.Sequences(np.array([3, 1, 2, 1, 1, 2, 0, 0, 1]), np.array([0, 3, 5, 9]), 4)
    assert seqs.train_counts().tolist() == [2, 2, 1, 1]
    # user 0's target 2 (count 1): items 0 and 1 count more, but 1 is in its history; user 2's 1: nothing counts more
    assert nextitem.popularity_ranks(seqs, np.array([0, 1, 2])).tolist() == [1, 0, 0]
    r = nextitem.ranking(np.array([0, 9, 10, 3]))
    assert (r.hr10, r.users) == (0.75, 4)
    assert r.ndcg10 == pytest.approx((1 + 1 / np.log2(11) + 1 / np.log2(5)) / 4)


def test_a_checkpoint_round_trips_with_its_table_mapped(tmp_path):
    m = small_model()
    table = torch.randn(40, m.in_dim, generator=torch.Generator().manual_seed(5))
    checkpoint.save(tmp_path / "ck", m, table, "small", 32, {"trace": "x"})
    with pytest.raises(HelmInputError, match="already exists"):
        checkpoint.save(tmp_path / "ck", m, table, "small", 32, {})
    ck = checkpoint.load(tmp_path / "ck")
    assert ck.meta["trace"] == "x" and ck.n_items == 40
    assert mapped_from(ck.table) == str(tmp_path / "ck" / "items.safetensors")   # mapped, not read whole
    torch.testing.assert_close(ck.table, table, rtol=0, atol=0)
    ck.table[0] = 7.0                                                    # copy-on-write: the file keeps its rows
    torch.testing.assert_close(checkpoint.load(tmp_path / "ck").table, table, rtol=0, atol=0)
    _, kv = m.prefill(table[:5])
    _, kv2 = ck.model.prefill(table[:5])
    torch.testing.assert_close(ck.model.score(kv2, table[5:9]), m.score(kv, table[5:9]), rtol=0, atol=0)


def test_a_checkpoint_that_does_not_fit_its_preset_is_refused_naming_the_tensor(tmp_path):
    checkpoint.save(tmp_path / "ck", small_model(shrink=32), torch.zeros(10, 64), "small", 32, {})
    meta = json.loads((tmp_path / "ck" / "model.json").read_text())
    (tmp_path / "ck" / "model.json").write_text(json.dumps({**meta, "shrink": 16}))   # weights of small/32
    with pytest.raises(HelmInputError, match="'w_in' is \\(32, 64\\), model 'small/16-fp32' needs \\(32, 128\\)|"
                                             "tensor 'w_in'"):
        checkpoint.load(tmp_path / "ck")
    with pytest.raises(HelmInputError, match="not a model checkpoint"):
        checkpoint.load(tmp_path)


def test_a_replica_serves_the_checkpoints_scores(tmp_path):
    m = small_model(seed=9)
    table = torch.randn(300, m.in_dim, generator=torch.Generator().manual_seed(6))
    checkpoint.save(tmp_path / "ck", m, table, "small", 32, {})
    cfg = ServeConfig(candidates=8, pool_mib=4.0, shrink=16, n_items=5, controller=False, warm=False,
                      checkpoint=str(tmp_path / "ck")).with_sources()
    assert (cfg.shrink, cfg.n_items) == (32, 300)                        # the checkpoint's model and catalogue
    node = ServeNode(cfg)
    user = cfg.n_users + 7                                               # outside the synthetic population: no history
    cands = np.arange(100, 108)
    first = node.serve(user, 0, np.array([1, 2, 3]), cands)
    hit = node.serve(user, 3, np.array([4]), cands)                      # a KV hit on the first request's prefix
    assert hit["kv_tokens"] == 3
    _, kv = m.prefill(table[torch.tensor([1, 2, 3, 4])])
    np.testing.assert_allclose(hit["scores"], m.score(kv, table[torch.from_numpy(cands)]).numpy(), atol=1e-5)
    _, kv = m.prefill(table[torch.tensor([1, 2, 3])])
    np.testing.assert_allclose(first["scores"], m.score(kv, table[torch.from_numpy(cands)]).numpy(), atol=1e-5)


def test_training_learns_what_popularity_cannot(tmp_path):
    from helmgr.workload.trace import read_trace
    seqs = nextitem.Sequences.from_log(read_trace(str(clustered_log(tmp_path / "c.inter")), "inter"))
    assert (seqs.n_items, len(seqs.evaluable())) == (60, 120)
    cfg = nextitem.TrainConfig(shrink=32, steps=40, batch=8, positions=4, negatives=15)
    model, table, _ = nextitem.train(seqs, cfg)
    held = nextitem.evaluate(model, table, seqs, 1000, 0)
    assert held["model"]["users"] == held["popularity"]["users"] == 120
    assert held["model"]["hr@10"] > held["popularity"]["hr@10"] + 0.1      # 0.45 against 0.23 when written


def test_model_train_writes_a_checkpoint_that_model_eval_scores_alike(tmp_path, capsys):
    log = clustered_log(tmp_path / "c.inter", users=40)
    rc = main(["model", "train", "--trace", str(log), "--out", str(tmp_path / "ck"), "--steps", "2",
               "--shrink", "32", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and (out["users"], out["actions"]) == (40, 480)
    rc = main(["model", "eval", "--model", str(tmp_path / "ck"), "--trace", str(log), "--json"])
    again = json.loads(capsys.readouterr().out)["held_out_last_item"]
    assert rc == 0 and again["model"] == out["held_out_last_item"]["model"]   # the saved model ranks as the trained one
    assert main(["model", "train", "--trace", str(log), "--out", str(tmp_path / "ck")]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["model", "eval", "--model", str(tmp_path), "--trace", str(log)]) == 2
    assert "not a model checkpoint" in capsys.readouterr().err


def test_a_replays_scores_are_checked_against_the_model_from_scratch(tmp_path):
    """A log replayed through a replica serving a store built from it and a checkpoint: every
    answer (cold, then KV hits on the appended history) scores as the model from scratch on the
    log's sequence + the appends served before it + the new items, also where the app served two
    of a user's requests in another order than sent; a changed score is a mismatch, another
    prefix is not checked."""
    from helmgr.history import HistoryStore, build
    from helmgr.serve.answers import Answer
    from helmgr.serve.loadgen import LoadConfig, trace_requests
    from helmgr.serve.verify import check_scores
    from helmgr.workload.trace import read_trace

    log = tmp_path / "log.inter"
    log.write_text("user_id:token\titem_id:token\ttimestamp:float\n" + "".join(
        f"u{u}\ti{(7 * u + 3 * t) % 40:02d}\t{t}\n" for u in range(3) for t in range(5 + 4 * u)))
    trace = read_trace(str(log), "inter")
    build(tmp_path / "h", trace.user, trace.item, trace.time, trace.n_users, trace.n_items).close()
    m = small_model(seed=4)
    checkpoint.save(tmp_path / "ck", m, torch.randn(trace.n_items, m.in_dim), "small", 32, {})
    cfg = ServeConfig(candidates=6, pool_mib=4.0, controller=False, history=str(tmp_path / "h"),
                      checkpoint=str(tmp_path / "ck")).with_sources()
    node, store = ServeNode(cfg), HistoryStore(cfg.history)
    sent = list(trace_requests(cfg, LoadConfig(rps=50.0, duration_s=10.0, trace=str(log))))
    # the app serves user 2's 3rd and 4th requests swapped (they reached the ingress in that order)
    third, fourth = [k for k, s in enumerate(sent) if s.body["user_id"] == 2][2:4]
    order = list(range(len(sent)))
    order[third], order[fourth] = fourth, third
    answers = [None] * len(sent)
    for k in order:
        s = sent[k]
        b = s.body
        store.refresh()
        prefix = store.length(b["user_id"])                              # what the ingress resolves
        out = node.serve(b["user_id"], prefix, np.array(b["new_items"]), np.array(b["candidates"]))
        answers[k] = Answer(s.t, 0.01, 200, prefix, out["kv_tokens"], 0, 1.0, "n", 0.5,
                            appended=out["appended"], scores=tuple(out["scores"]))
    assert len(sent) == 5 + 9 + 13 and all(a.appended for a in answers)     # one request an interaction
    assert sum(a.kv_tokens > 0 for a in answers) >= len(sent) - 3          # every user's first request is cold
    ck = checkpoint.load(tmp_path / "ck")
    got = check_scores(sent, answers, trace, ck)
    assert (got["score_checked"], got["score_mismatch"], got["score_unchecked"]) == (len(sent), 0, 0)
    assert got["score_max_diff"] < 1e-4
    answers[5] = answers[5]._replace(scores=(answers[5].scores[0] + 1e-2,) + answers[5].scores[1:])
    answers[7] = answers[7]._replace(prefix_len=answers[7].prefix_len + 1)
    got = check_scores(sent, answers, trace, ck)
    assert (got["score_checked"], got["score_mismatch"], got["score_unchecked"]) == (len(sent) - 1, 1, 1)


def test_serve_refuses_a_checkpoint_that_does_not_fit_before_starting(tmp_path):
    checkpoint.save(tmp_path / "ck", small_model(shrink=32), torch.zeros(10, 64), "small", 32, {})
    meta = json.loads((tmp_path / "ck" / "model.json").read_text())
    (tmp_path / "ck" / "model.json").write_text(json.dumps({**meta, "shrink": 16}))
    with pytest.raises(HelmInputError, match="tensor 'w_in'"):
        ServeConfig(checkpoint=str(tmp_path / "ck")).with_sources()


def test_model_eval_takes_a_checkpoint_or_an_app_not_both(tmp_path, capsys):
    log = clustered_log(tmp_path / "c.inter", users=8)
    assert main(["model", "eval", "--trace", str(log)]) == 2
    assert "--model DIR or --url URL" in capsys.readouterr().err
    assert main(["model", "eval", "--trace", str(log), "--model", str(tmp_path), "--url", "http://x"]) == 2
    assert main(["model", "eval", "--trace", str(log), "--url", "http://127.0.0.1:9"]) == 2     # nobody listens
    assert "cannot reach the app" in capsys.readouterr().err


def test_training_that_diverges_stops_naming_the_step_and_the_rate(tmp_path):
    from helmgr.workload.trace import read_trace
    seqs = nextitem.Sequences.from_log(read_trace(str(clustered_log(tmp_path / "c.inter", users=40)), "inter"))
    cfg = nextitem.TrainConfig(shrink=32, steps=5, batch=8, positions=4, negatives=15, lr=1e30)
    with pytest.raises(HelmInputError, match=r"diverged at step 2 of 5 \(the loss is nan\): --lr 1e\+30"):
        nextitem.train(seqs, cfg)                        # step 1's loss is finite, its update is not
    with pytest.raises(HelmInputError, match=r"diverged at step 1 of 1 \(a weight is no longer finite\): --lr 1e\+308"):
        nextitem.train(seqs, nextitem.TrainConfig(shrink=32, steps=1, batch=8, positions=4, negatives=15, lr=1e308))


def test_nan_scores_rank_last_never_as_hits():
    seq = np.array([0, 1, 2])                            # history 0, 1; held out 2; unseen 3, 4
    nan = float("nan")
    assert nextitem.held_out_rank(np.full(5, nan), seq) == 2                  # was 0: a hit
    assert nextitem.held_out_rank(np.array([9.0, 9.0, nan, 0.0, -5.0]), seq) == 2
    assert nextitem.held_out_rank(np.array([nan, nan, 1.0, nan, 2.0]), seq) == 1   # NaN others rank below it
    assert nextitem.held_out_rank([None, 0.5, None, 0.1, 0.2], seq) == 2       # an app's JSON nulls
    m = small_model()
    with torch.no_grad():
        m.w_head.fill_(nan)                                                   # a diverged model: NaN everywhere
    seqs = nextitem.Sequences(np.arange(40) % 20, np.arange(0, 41, 4), 20)
    held = nextitem.evaluate(m, torch.randn(20, m.in_dim), seqs, 10, 0)
    assert (held["model"]["hr@10"], held["model"]["ndcg@10"], held["model"]["users"]) == (0.0, 0.0, 10)


@pytest.mark.parametrize("where", ["blocks.1.w_out", "items"])
def test_a_checkpoint_holding_nan_or_inf_is_refused_naming_the_tensor(tmp_path, capsys, where):
    m, table = small_model(), torch.randn(60, 64)
    with torch.no_grad():
        if where == "items":
            table[37, 5] = float("inf")
        else:
            m.blocks[1].w_out[0, 0] = float("nan")
    checkpoint.save(tmp_path / "ck", m, table, "small", 32, {})
    with pytest.raises(HelmInputError, match=rf"tensor '{where}' in .*(row 37 )?.*NaN or inf"):
        checkpoint.load(tmp_path / "ck")
    with pytest.raises(HelmInputError, match=f"'{where}'"):
        ServeConfig(checkpoint=str(tmp_path / "ck")).with_sources()                # serve --model, loadgen --model
    log = clustered_log(tmp_path / "c.inter", users=8)
    assert main(["model", "eval", "--model", str(tmp_path / "ck"), "--trace", str(log)]) == 2
    assert f"'{where}'" in capsys.readouterr().err



BROKEN = [
    ("items.safetensors", b"garbage\n"),                # read as an 8-byte header length of 7e17: MemoryError
    ("items.safetensors", b""),
    ("items.safetensors", "truncated"),                  # np.memmap past the end: ValueError
    ("model.safetensors", b"garbage\n"),
    ("model.safetensors", "truncated"),
    ("model.json", b"garbage"),
    ("model.json", b"[]"),
    ("model.json", b'{"format": 1, "preset": "small", "shrink": 1e999, "n_items": 60}'),   # OverflowError
]


def test_a_broken_checkpoint_file_is_refused_in_one_line_naming_it(tmp_path, capsys):
    log = clustered_log(tmp_path / "c.inter", users=8)
    for k, (name, content) in enumerate(BROKEN):
        checkpoint.save(tmp_path / f"ck{k}", small_model(), torch.randn(60, 64), "small", 32, {})
        path = tmp_path / f"ck{k}" / name
        path.write_bytes(path.read_bytes()[:-100] if content == "truncated" else content)
        with pytest.raises(HelmInputError, match=str(path)):
            checkpoint.load(tmp_path / f"ck{k}")
        assert main(["model", "eval", "--model", str(tmp_path / f"ck{k}"), "--trace", str(log)]) == 2
        err = capsys.readouterr().err
        assert str(path) in err and len(err.strip().splitlines()) == 1, (name, content)


def test_model_eval_refuses_a_url_that_is_not_an_app_by_name(tmp_path, capsys):
    log = clustered_log(tmp_path / "c.inter", users=8)
    for url in ["bogus", "", "ftp://x", "http://x:abc"]:
        assert main(["model", "eval", "--url", url, "--trace", str(log)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("helmgr: error: --url") and repr(url) in err and len(err.strip().splitlines()) == 1


def test_model_train_checks_its_options_and_out_before_any_work(tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    missing = str(tmp_path / "no.inter")                 # never read: each refusal comes first
    for out, says in [(a_file / "sub", "parent folder"), (tmp_path / "none" / "sub", "parent folder"),
                      ("/proc/helmgr_m", "cannot create a folder")]:
        assert main(["model", "train", "--trace", missing, "--out", str(out), "--steps", "2"]) == 2
        assert f"--out {str(out)!r}" in capsys.readouterr().err and not (tmp_path / "none").exists()
    for opt, value in [("--steps", "1000000000000"), ("--lr", "1e308"), ("--lr", "1e30"), ("--lr", "nan")]:
        assert main(["model", "train", "--trace", missing, "--out", str(tmp_path / "ck"), opt, value]) == 2
        assert opt in capsys.readouterr().err and not (tmp_path / "ck").exists()


@contextmanager
def address_space_capped(extra_bytes):
    """The process may map at most `extra_bytes` more while inside (a regression that builds what
    should be refused fails at once rather than taking the machine's memory)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    mapped = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_model_train_refuses_a_model_too_large_for_memory_before_building_it(tmp_path, capsys, monkeypatch):
    # large/1: 16 features x 1024 floats a row, each row 4 times (weight, gradient, Adam's moments): 256 KiB an item;
    # 50,000 items ask for over 12 GiB, more than half of a machine of 16 GiB (said to be this one's)
    monkeypatch.setattr("helmgr.core.validate.host_memory_bytes", lambda: float(16 << 30))
    log = tmp_path / "wide.inter"
    log.write_text("user_id:token\titem_id:token\ttimestamp:float\n" + "".join(f"u{i % 500}\ti{i}\t{i}\n"
                                                                               for i in range(50_000)))
    with address_space_capped(2 << 30):
        assert main(["model", "train", "--trace", str(log), "--out", str(tmp_path / "ck"), "--preset", "large",
                     "--shrink", "1"]) == 2
    err = capsys.readouterr().err
    assert "--preset large --shrink 1 on 50,000 items ask for ~" in err and "half this machine's 16 GiB" in err
    assert not (tmp_path / "ck").exists()
    for preset, shrink in [("large", 4), ("small", 16)]:
        p = runtime_model(preset, shrink)
        assert nextitem.param_count(p) == sum(w.numel() for w in HSTUModel(p, torch.Generator()).parameters())
    cfg = nextitem.TrainConfig(preset="large", shrink=1)
    extra = nextitem.train_memory_bytes(cfg, 1001) - nextitem.train_memory_bytes(cfg, 1)
    assert extra == 1000 * 4 * 4 * 16 * 1024                                  # 4 copies of 16 x 1024 float32
