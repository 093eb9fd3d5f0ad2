"""Catalogue widening: clone k of a replayed log reads item i as i + k x n_items."""
import hashlib

import numpy as np
import pytest

from helmgr.cli import main
from helmgr.core.errors import HelmInputError
from helmgr.workload import read_trace, trace_workload

HEADER = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
# 3 users, 4 items (w x y z -> dense ids 0 1 2 3), 9 interactions; a and c act twice at one time
TINY = ("a\tx\t1\t10\na\ty\t1\t10\nb\tx\t1\t15\na\tz\t1\t20\nc\tx\t1\t21\nc\tw\t1\t21\n"
        "b\ty\t1\t30\nc\tx\t1\t40\nb\tx\t1\t41\n")
K = 3


@pytest.fixture
def tiny(tmp_path):
    p = tmp_path / "tiny.inter"
    p.write_text(HEADER + TINY)
    return str(p)


def stream(w):
    """The whole stream as flat arrays, with each history item's and candidate's request user."""
    chunks = list(w.chunks())
    cat = {f: np.concatenate([getattr(c, f) for c in chunks]) for f in ("user", "item_ids", "cand_ids", "burst")}
    cat["item_user"] = np.concatenate([np.repeat(c.user, np.diff(c.item_offsets)) for c in chunks])
    cat["cand_user"] = np.concatenate([np.repeat(c.user, np.diff(c.cand_offsets)) for c in chunks])
    return cat


def replay(path, widen, **kw):
    overlays = kw.pop("overlays", ()) + (("widen",) if widen else ())
    return trace_workload(path, "inter", duration_s=30.0, seed=1, clone_users=K, candidates=8, overlays=overlays, **kw)


def test_widened_clones_read_their_own_item_range(tiny):
    log = read_trace(tiny, "inter")
    n, users = log.n_items, log.n_users
    plain, wide = replay(tiny, False), replay(tiny, True)
    assert (plain.n_items, wide.n_items, wide.space.n_items) == (n, K * n, K * n)
    p, q = stream(plain), stream(wide)
    assert np.array_equal(p["user"], q["user"])
    for ids, owner in (("item_ids", "item_user"), ("cand_ids", "cand_user")):
        clone = q[owner] // users
        assert set(clone.tolist()) == set(range(K))
        assert np.array_equal(q[ids] // n, clone)             # clone k's ids lie in [k n, (k + 1) n)
        assert np.array_equal(q[ids] % n, p[ids])              # ... and are the unwidened ids, shifted
    # every clone replays the whole log: its history items have the log's histogram, in its range
    for k in range(K):
        mine = q["item_ids"][q["item_user"] // users == k]
        assert np.bincount(mine - k * n, minlength=n).tolist() == np.bincount(log.item, minlength=n).tolist()
        cands = q["cand_ids"][q["cand_user"] // users == k]
        plain_cands = p["cand_ids"][p["cand_user"] // users == k]
        assert np.bincount(cands - k * n, minlength=n).tolist() == np.bincount(plain_cands, minlength=n).tolist()
    assert wide.history(users + 1, 0, 3).tolist() == (plain.history(1, 0, 3) + n).tolist()   # clone 1 of user 1


def test_widened_prior_gives_each_clone_range_the_log_shape(tiny):
    plain, wide = replay(tiny, False), replay(tiny, True)
    n = plain.n_items
    assert wide.prior.shape == (K * n,)
    assert wide.prior.sum() == pytest.approx(1.0)
    for k in range(K):
        assert np.allclose(wide.prior[k * n:(k + 1) * n], plain.prior / K, rtol=1e-12, atol=0)


def test_widened_drift_and_bursts_stay_in_the_widened_space(tmp_path):
    path = tmp_path / "log.inter"
    write_log(path)
    log = read_trace(str(path), "inter")
    kw = dict(duration_s=90.0, seed=3, clone_users=K, candidates=16)
    plain = trace_workload(str(path), "inter", overlays=("trend", "burst"), **kw)
    wide = trace_workload(str(path), "inter", overlays=("trend", "burst", "widen"), **kw)
    assert wide.bursts and len(wide.bursts) == len(plain.bursts)
    q = stream(wide)
    n = log.n_items
    assert 0 <= q["cand_ids"].min() and q["cand_ids"].max() < K * n
    owner = (q["item_user"] // log.n_users) % K                # burst users (new ids) map to a clone too
    assert np.array_equal(q["item_ids"] // n, owner)
    burst_row = np.repeat(q["burst"], 16)
    drifted = q["cand_ids"][~burst_row]                         # drift rotates inside the clone's range
    assert np.array_equal(drifted // n, (q["cand_user"][~burst_row] // log.n_users) % K)


def test_widen_needs_clones(tiny, capsys):
    with pytest.raises(HelmInputError, match="--widen-catalogue needs --clone-users"):
        trace_workload(tiny, "inter", clone_users=1, overlays=("widen",))
    for argv in (["--trace", tiny, "--widen-catalogue"], ["--trace", tiny, "--clone-users", "1", "--widen-catalogue"],
                 ["--clone-users", "4", "--widen-catalogue"]):
        assert main(["workload", "--duration", "5", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--widen-catalogue" in err and "--clone-users" in err
    argv = ["workload", "--duration", "5", "--trace", tiny, "--clone-users", "2", "--widen-catalogue", "--json"]
    assert main(argv) == 0
    assert '"workload": "trace:tiny.inter+widen"' in capsys.readouterr().out


def write_log(path):
    """An ml-100k-like log: 40 users, Zipf items, some same-second interactions, 1997 timestamps."""
    rng = np.random.default_rng(100)
    lines = []
    for u in range(40):
        t = int(rng.integers(880_000_000, 890_000_000))
        for _ in range(int(rng.integers(3, 30))):
            t += int(rng.choice([0, 0, 1, 60, 3600]))
            lines.append(f"{u + 1}\t{min(int(rng.zipf(1.3)), 150)}\t{int(rng.integers(1, 6))}\t{t}\n")
    path.write_text(HEADER + "".join(lines))


def digest(w):
    h = hashlib.sha256()
    for c in w.chunks(1.0):
        for f in ("t", "user", "prefix_len", "new_tokens", "item_ids", "item_offsets", "cand_ids", "cand_offsets",
                  "burst"):
            a = np.ascontiguousarray(getattr(c, f))
            h.update(f"{f}{a.dtype}{a.shape}".encode())
            h.update(a.tobytes())
    h.update(np.ascontiguousarray(w.prior).tobytes())
    return h.hexdigest()


# sha256 of the chunk arrays and the prior, recorded with the replay code before widening existed
@pytest.mark.parametrize("clones,overlays,expected", [
    (1, (), "2a94f54a4b1294fdcb4d37626837fef157416f09669091673c84ccd5a1dfb971"),
    (3, (), "34b942e1af8388e4432186bd403441509de674a28f9744dc654fe03f0d42d672"),
    (3, ("trend", "burst"), "536ee0326c3b4fc9fd306f890d9c0f2637985fc5a35c1d66f9f789a0c2c0cb0e"),
])
def test_unwidened_replay_is_bit_for_bit_unchanged(tmp_path, clones, overlays, expected):
    path = tmp_path / "log.inter"
    write_log(path)
    w = trace_workload(str(path), "inter", duration_s=90.0, seed=3, candidates=16, clone_users=clones,
                       overlays=overlays)
    assert digest(w) == expected


def test_amazon_widened_catalogue(shared_data):
    path = str(shared_data / "amazon-beauty.txt")
    plain = trace_workload(path, "sequences", duration_s=5.0, seed=1, clone_users=4)
    wide = trace_workload(path, "sequences", duration_s=5.0, seed=1, clone_users=4, overlays=("widen",))
    assert wide.n_items == 4 * plain.n_items
    first = next(iter(wide.chunks()))
    clone = first.user // (wide.history.n_base)
    owner = np.repeat(clone, np.diff(first.cand_offsets))
    assert np.array_equal(first.cand_ids // plain.n_items, owner)
