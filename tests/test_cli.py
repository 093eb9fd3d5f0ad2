import json

import pytest

from helmgr.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv,needle", [
    (["workload", "--duration", "-5"], "'--duration': -5.0"),
    (["workload", "--workload", "bursty"], "unknown workload 'bursty'"),
    (["workload", "--seed", "x"], "'--seed': 'x'"),
    (["profile", "--ratio", "1.5"], "'--ratio': 1.5"),
    (["profile", "--hardware", "tpu"], "unknown hardware profile 'tpu'"),
    (["workload", "--trace", "/nonexistent/x.inter"], "does not exist"),
    (["simulate-nothing"], "No such command"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


def test_workload_json_is_the_only_stdout(capsys):
    code, out, _ = run(capsys, "workload", "--workload", "burst", "--duration", "20", "--rps", "100", "--seed", "1", "--json")
    assert code == 0
    s = json.loads(out)
    for field in ("requests", "rps", "peak_rps_1s", "median_rps_1s", "users", "returning_share", "mean_prefix_len",
                  "distinct_items", "top1pct_item_share", "hot_set_turnover_per_min"):
        assert field in s
    assert s["workload"] == "burst" and s["requests"] > 0


def test_workload_out_dir(capsys, tmp_path):
    out = tmp_path / "res"
    code, _, _ = run(capsys, "workload", "--duration", "20", "--rps", "100", "--out", str(out))
    assert code == 0
    assert {p.name for p in out.iterdir()} == {"workload.json", "workload.md", "workload.png"}
    assert (out / "workload.png").read_bytes()[:4] == b"\x89PNG"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".helmgr-")]


def test_out_dir_that_is_a_file_writes_nothing(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("keep")
    code, _, err = run(capsys, "workload", "--duration", "5", "--out", str(f))
    assert code == 2 and "is a file" in err and str(f) in err and f.read_text() == "keep"


def test_profile_json(capsys):
    code, out, _ = run(capsys, "profile", "--model", "small", "--ratio", "0.25", "--json")
    s = json.loads(out)
    assert code == 0 and s["kv_bytes_per_token"] == 6144 and s["row_bytes"] == 4096
    assert s["emb_rows"] == int(0.25 * s["pool_budget_gib"] * 2**30 // 4096)
