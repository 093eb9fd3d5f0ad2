import numpy as np
import pytest

from helmgr.core.errors import HelmInputError, TraceFormatError
from helmgr.workload import describe, read_trace, trace_workload

HEADER = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"


def collect(w):
    chunks = list(w.chunks())
    return {f: np.concatenate([getattr(c, f) for c in chunks]) for f in ("t", "user", "prefix_len", "new_tokens", "item_ids", "burst")}


def test_inter_replay_groups_same_time_interactions(tmp_path):
    p = tmp_path / "tiny.inter"
    p.write_text(HEADER + "a\tx\t1\t10\na\ty\t1\t10\nb\tx\t1\t15\na\tz\t1\t20\n")
    w = trace_workload(str(p), "inter", duration_s=10.0, time_compression=1.0)
    r = collect(w)
    # a@10 (2 items), b@15, a@20 -> times 0, 5, 10; the last falls at the end of a 10-s run
    assert r["t"].tolist() == [0.0, 5.0]
    assert r["new_tokens"].tolist() == [2, 1] and r["prefix_len"].tolist() == [0, 0]
    w = trace_workload(str(p), "inter", duration_s=10.0)          # fitted: 20 s of log in 10 s
    r = collect(w)
    assert r["prefix_len"].tolist() == [0, 0, 2]
    assert w.history(0, 0, 3).tolist() == [0, 1, 2]                 # a's items x, y, z


@pytest.mark.parametrize("body,line,msg", [
    ("a\tx\t1\t10\nb\tx\t1\n", 3, "expected 4 tab-separated fields, found 3"),
    ("a\tx\t1\t10\nb\tx\t1\tsoon\n", 3, "timestamp 'soon' is not a number"),
    ("\tx\t1\t10\n", 2, "empty user_id"),
])
def test_malformed_inter_lines_name_file_and_line(tmp_path, body, line, msg):
    p = tmp_path / "bad.inter"
    p.write_text(HEADER + body)
    with pytest.raises(TraceFormatError) as e:
        read_trace(str(p), "inter")
    assert e.value.line == line and msg in str(e.value) and str(p) in str(e.value)


def test_inter_header_without_timestamp(tmp_path):
    p = tmp_path / "bad.inter"
    p.write_text("user_id:token\titem_id:token\n1\t2\n")
    with pytest.raises(TraceFormatError, match=r":1: header lacks column\(s\) timestamp"):
        read_trace(str(p), "inter")


def test_malformed_sequence_line(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_text("1 2 3\n2\n")
    with pytest.raises(TraceFormatError, match=r"bad.txt:2: a line needs a user id"):
        read_trace(str(p), "sequences")


def test_bad_options(tmp_path):
    with pytest.raises(HelmInputError, match="does not exist"):
        trace_workload(str(tmp_path / "none.inter"))
    with pytest.raises(HelmInputError, match="unknown trace format"):
        read_trace(str(tmp_path), "csv")


def test_ml100k_replay(shared_data):
    path = shared_data / "ml-100k.inter"
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:]]
    groups = {(u, t) for u, _, _, t in rows}
    w = trace_workload(str(path), "inter", duration_s=120.0)
    r = collect(w)
    assert len(r["t"]) == len(groups)
    assert r["new_tokens"].sum() == 100_000
    assert len(np.unique(r["user"])) == 943
    # each request's prefix is the user's earlier interactions
    seen = {}
    for u, p, k in zip(r["user"].tolist(), r["prefix_len"].tolist(), r["new_tokens"].tolist()):
        assert p == seen.get(u, 0)
        seen[u] = p + k


def test_amazon_sequences_replay_with_clones_and_overlays(shared_data):
    path = shared_data / "amazon-beauty.txt"
    lines = path.read_text().split("\n")
    interactions = sum(len(line.split()) - 1 for line in lines if line.strip())
    w = trace_workload(str(path), "sequences", duration_s=60.0, clone_users=2, candidates=16)
    summary = describe(w.chunks(), w.duration_s, w.n_items)[0]
    assert summary["requests"] == 2 * interactions
    assert summary["users"] == 2 * 22_363
    wb = trace_workload(str(path), "sequences", duration_s=60.0, overlays=("burst", "trend"), candidates=16)
    r = collect(wb)
    assert wb.bursts and r["burst"].any()
    assert np.mean(r["user"][r["burst"]] >= 22_363) > 0.8      # mostly new users
