import importlib
import json
import os

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
    (["simulate", "--fail-node", "2@x"], "--fail-node '2@x'"),
    (["simulate", "--fail-node", "9@1"], "node 9 does not exist"),
    (["simulate", "--nodes", "0"], "'--nodes': 0"),
    (["simulate", "--router", "random"], "'--router': 'random'"),
    (["simulate", "--ratio", "-0.1"], "'--ratio': -0.1"),
    (["sweep", "--ratios", "0.5:0.1:0.1"], "--ratios '0.5:0.1:0.1'"),
    (["sweep", "--ratios", "0.2,1.5"], "got 1.5"),
    (["bench", "--nodes", "32,x"], "--nodes '32,x'"),
    (["bench", "--nodes", "0"], "every node count must be >= 1"),
    (["bench", "--router", "fastest"], "'--router': 'fastest'"),
    (["bench", "--cold-mb", "-1", "--controller"], "'--cold-mb': -1"),
    (["bench", "--cold-mb", "4"], "--cold-mb 4 goes with --controller"),
    (["train", "--workloads", "nope"], "unknown workload 'nope'"),
    (["train", "--timesteps", "10"], "'--timesteps': 10"),
    (["train", "--checkpoint-every", "0"], "'--checkpoint-every': 0"),
    (["train", "--target-kl", "0"], "'--target-kl': 0"),
    (["train", "--target-kl", "1e308"], "'--target-kl': 1e+308"),
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


SPEC_FIELDS = ("requests", "completed", "p50_ms", "p95_ms", "p99_ms", "p999_ms", "slo_ms", "slo_attainment",
               "window_slo_satisfaction", "throughput_rps", "goodput_rps", "emb_hit_rate", "kv_hit_rate", "h2d_gb",
               "refill_blocked_s", "mean_ratio", "burst_violation_share", "wall_s")


def test_simulate_json_has_the_spec_fields(capsys, tmp_path):
    code, out, _ = run(capsys, "simulate", "--duration", "6", "--rps", "200", "--nodes", "2", "--policy", "static", "--json",
                       "--out", str(tmp_path / "sim"))
    assert code == 0
    s = json.loads(out)
    assert all(f in s for f in SPEC_FIELDS) and s["completed"] == s["requests"] > 0
    assert {"summary.json", "summary.md", "latency_cdf.png", "p99_windows.png", "ratio_timeline.png",
            "hit_rates.png"} <= {p.name for p in (tmp_path / "sim").iterdir()}


def test_sweep_finds_the_best_ratio(capsys, tmp_path):
    code, out, _ = run(capsys, "sweep", "--duration", "6", "--rps", "200", "--nodes", "2", "--ratios", "0.2,0.6",
                       "--jobs", "1", "--json", "--out", str(tmp_path / "sw"))
    assert code == 0
    s = json.loads(out)
    assert [r["ratio"] for r in s["rows"]] == [0.2, 0.6]
    assert s["best_p99_ms"] == min(r["p99_ms"] for r in s["rows"])
    assert {p.name for p in (tmp_path / "sw").iterdir()} == {"sweep.json", "sweep.md", "sweep.png"}


def test_parse_ratios():
    from helmgr.cli.types import ratio_grid
    assert ratio_grid("0.05:0.95:0.05") == [round(0.05 * k, 10) for k in range(1, 20)]
    assert ratio_grid("0.1,0.3") == [0.1, 0.3]


def test_compare_reports_every_policy_and_its_distance_from_the_oracle(capsys, tmp_path):
    code, out, _ = run(capsys, "compare", "--duration", "5", "--rps", "300", "--nodes", "2", "--ratios", "0.2,0.8",
                       "--policies", "static,adaptive,static-best,oracle", "--jobs", "1", "--json",
                       "--out", str(tmp_path / "cmp"))
    assert code == 0
    s = json.loads(out)
    assert [r["policy"] for r in s["results"]] == ["static", "adaptive", "static-best", "oracle"]
    assert len(s["r_star"]) == 5 and set(s["r_star"]) <= {0.2, 0.8}
    for r in s["results"]:
        assert all(f in r for f in SPEC_FIELDS) and r["oracle_distance"] >= 0
    static = s["results"][0]
    assert static["oracle_distance"] == pytest.approx(sum(abs(0.5 - x) for x in s["r_star"]) / 5)
    assert len(s["held_r_star"]) == 5 and set(s["held_r_star"]) <= {0.2, 0.8}
    assert static["held_oracle_distance"] == pytest.approx(sum(abs(0.5 - x) for x in s["held_r_star"]) / 5)
    assert all("held_oracle_distance" in r for r in s["results"])
    assert {p.name for p in (tmp_path / "cmp").iterdir()} == {"compare.json", "compare.md", "compare_p99_slo.png",
                                                              "compare_ratios.png", "compare_cdf.png"}


def test_compare_with_classes_reports_each_runs_figures_per_class(capsys, tmp_path):
    common = ["--duration", "5", "--rps", "300", "--nodes", "2", "--classes", "surfaces", "--tenancy", "helm"]
    code, out, _ = run(capsys, "compare", *common, "--ratios", "0.2,0.8", "--policies", "static,static-best,oracle",
                       "--jobs", "1", "--json", "--out", str(tmp_path / "cmp"))
    assert code == 0
    s = json.loads(out)
    assert (s["class_table"], s["tenancy"]) == ("class table 'surfaces'", "helm")
    static, best, oracle = s["results"]
    assert set(static["classes"]) == set(best["classes"]) == {"feed", "interactive", "refresh"}
    assert "classes" not in oracle                               # stitched from blocks: no class figures
    code, out, _ = run(capsys, "simulate", *common, "--policy", "static", "--json")
    one = json.loads(out)
    assert static["classes"] == one["classes"] and static["fairness"] == one["fairness"]    # the same run
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "Per class (class table 'surfaces', `--tenancy helm`)" in md and "| feed p99_ms |" in md
    code, out, _ = run(capsys, "compare", *common, "--ratios", "0.2,0.8", "--policies", "static", "--jobs", "1")
    assert code == 0 and "per class (class table 'surfaces', --tenancy helm)" in out


@pytest.mark.parametrize("argv,needle", [
    (["compare", "--policies", "static,magic"], "unknown magic"),
    (["compare", "--routers", "nope"], "unknown nope"),
    (["compare", "--tenancy", "strict"], "--tenancy strict needs a class table"),
])
def test_compare_bad_lists(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and needle in err and err.count("\n") == 1


def test_bench_router_json(capsys):
    code, out, _ = run(capsys, "bench", "--router", "helm", "--nodes", "4,16", "--decisions", "300", "--repeats", "1",
                       "--json")
    assert code == 0
    r = json.loads(out)
    assert r["router"] == "helm" and [row["nodes"] for row in r["sizes"]] == [4, 16]
    assert all(0 < row["p50_us"] <= row["p99_us"] for row in r["sizes"])


def test_bench_controller_json(capsys):
    code, out, _ = run(capsys, "bench", "--controller", "--decisions", "300", "--cold-mb", "1", "--json")
    assert code == 0
    r = json.loads(out)
    assert r["steps"] == 300 and r["cold_mb"] == 1 and r["policy"] == "default"
    assert 0 < r["p50_us"] <= r["p99_us"] <= r["p999_us"] and r["bursts"] == 0    # the first 4x burst is at 4,500


def strict_loads(text: str):
    def refuse(name):
        raise ValueError(f"non-strict JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def test_nothing_measured_gives_strict_json_with_reasons(capsys, tmp_path):
    code, out, _ = run(capsys, "simulate", "--duration", "5", "--nodes", "2", "--rps", "1e-9", "--policy", "static", "--json",
                       "--out", str(tmp_path / "sim"))
    assert code == 0
    for s in (strict_loads(out), strict_loads((tmp_path / "sim" / "summary.json").read_text())):
        assert s["requests"] == 0 and s["p99_ms"] is None
        assert s["nulls"]["p99_ms"] == "no request completed after the warm-up"
        assert all(s[k] is not None for k in s if k not in s["nulls"] and k != "burst_violation_share")


def test_infinite_slo_gives_strict_json_or_exit_2(capsys):
    code, out, err = run(capsys, "simulate", "--duration", "5", "--nodes", "2", "--slo-ms", "inf", "--policy", "static",
                          "--json")
    if code == 2:                                         # once options refuse infinite numbers
        assert out == "" and err.count("\n") == 1 and "inf" in err
    else:
        s = strict_loads(out)
        assert code == 0 and s["slo_ms"] is None and "inf" in s["nulls"]["slo_ms"]


def test_sweep_with_nothing_measured_has_no_best_ratio(capsys):
    code, out, _ = run(capsys, "sweep", "--duration", "5", "--nodes", "2", "--rps", "1e-9", "--ratios", "0.2,0.6",
                       "--jobs", "1", "--json")
    s = strict_loads(out)
    assert code == 0 and s["best_ratio"] is None and "no ratio measured" in s["nulls"]["best_ratio"]
    assert [r["p99_ms"] for r in s["rows"]] == [None, None]


def _refuse_work(*args, **kwargs):
    raise AssertionError("the command ran before checking --out")


@pytest.mark.parametrize("command,module,work", [
    ("simulate", "helmgr.cli.simulate_cmd", "simulate"),
    ("sweep", "helmgr.cli.sweep_cmd", "sweep"),
    ("compare", "helmgr.cli.compare_cmd", "compare"),
    ("workload", "helmgr.cli.workload_cmd", "describe"),
])
@pytest.mark.parametrize("where,needle", [("/proc/x", "cannot create a folder in '/proc'"),
                                          ("{tmp}/missing/res", "does not exist")])
def test_out_is_checked_before_any_work(capsys, monkeypatch, tmp_path, command, module, work, where, needle):
    if where.startswith("/proc") and not os.path.exists("/proc/self"):
        pytest.skip("no /proc")
    monkeypatch.setattr(importlib.import_module(module), work, _refuse_work)
    code, out, err = run(capsys, command, "--duration", "5", "--out", where.format(tmp=tmp_path))
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err and "--out" in err


def test_train_out_is_checked_before_training(capsys, monkeypatch, tmp_path):
    pytest.importorskip("stable_baselines3")
    monkeypatch.setattr("helmgr.learn.train.train", _refuse_work)
    for argv, needle in [(["--out", str(tmp_path / "missing" / "p.npz")], "does not exist"),
                         (["--out", str(tmp_path)], "is a directory"),       # click's check
                         (["--out", "/proc/p.npz"], "cannot create files in '/proc'"),
                         (["--runs-dir", "/proc/runs"], "cannot create files in '/proc'")]:
        if "/proc" in argv[1] and not os.path.exists("/proc/self"):
            continue
        code, out, err = run(capsys, "train", "--timesteps", "64", *argv)
        assert code == 2 and out == "" and err.count("\n") == 1 and needle in err


def test_train_init_and_nodes_are_checked_before_training(capsys, monkeypatch, tmp_path):
    pytest.importorskip("stable_baselines3")
    import numpy as np
    from helmgr.controller.mlp import MLPPolicy
    monkeypatch.setattr("helmgr.learn.train.train", _refuse_work)
    small = tmp_path / "small.npz"
    MLPPolicy([np.zeros((8, 10)), np.zeros((1, 8))], [np.zeros(8), np.zeros(1)], np.zeros(10), np.ones(10)).save(small)
    (tmp_path / "junk.npz").write_text("not a policy")
    for argv, needle in [(["--init", str(tmp_path / "none.npz")], "does not exist"),         # click's check
                         (["--init", str(tmp_path / "junk.npz")], "is not a HELM policy"),
                         (["--init", str(small)], "hidden layers [8] over 10 inputs; training's are [64, 64]"),
                         (["--nodes", "8", "--envs", "2"], "--envs 2 cannot be used with it")]:
        code, out, err = run(capsys, "train", "--timesteps", "64", *argv)
        assert code == 2 and out == "" and err.count("\n") == 1 and needle in err, err


def test_train_passes_checkpoint_every_and_target_kl_to_training(capsys, monkeypatch, tmp_path):
    pytest.importorskip("stable_baselines3")
    seen = {}

    def fake(timesteps, seed, out, runs_dir, env, **kw):
        seen.update(kw)
        return {"out": str(out), "log": "x", "wall_s": 0.0}
    monkeypatch.setattr("helmgr.learn.train.train", fake)
    code, out, err = run(capsys, "train", "--timesteps", "64", "--checkpoint-every", "32", "--target-kl", "0.03",
                         "--out", str(tmp_path / "p.npz"), "--runs-dir", str(tmp_path / "runs"))
    assert code == 0 and seen["checkpoint_every"] == 32 and seen["target_kl"] == 0.03, err


def test_failed_write_leaves_the_old_out_folder_byte_identical(capsys, monkeypatch, tmp_path):
    out = tmp_path / "sim"
    out.mkdir()
    for name, text in [("summary.json", '{"old": 1}\n'), ("summary.md", "# old\n"), ("latency_cdf.png", "old png"),
                       ("notes.txt", "mine")]:
        (out / name).write_text(text)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def plot_then_fail(series, title, folder):
        (folder / "latency_cdf.png").write_bytes(b"\x89PNG new")
        raise RuntimeError("plotting failed")
    monkeypatch.setattr("helmgr.experiments.plots.plot_simulation", plot_then_fail)
    with pytest.raises(RuntimeError, match="plotting failed"):
        main(["simulate", "--duration", "5", "--nodes", "2", "--rps", "100", "--policy", "static", "--out", str(out)])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["sim"]


def test_result_table_goes_to_stdout(capsys):
    code, out, err = run(capsys, "simulate", "--duration", "5", "--nodes", "2", "--rps", "100", "--policy", "static")
    assert code == 0 and "p99_ms" in out and "slo_attainment" in out and "p99_ms" not in err


def test_simulate_sim_path_option(capsys):
    """--sim-path picks the per-request path, the JSON says which ran, and both give the same run;
    `compiled` where the engine cannot run is a one-line error that names why."""
    base = ["simulate", "--duration", "4", "--nodes", "2", "--rps", "150", "--policy", "static", "--json"]
    runs = {}
    for path in ("python", "compiled"):
        code, out, err = run(capsys, *base, "--sim-path", path)
        assert code == 0, err
        runs[path] = json.loads(out)
        assert runs[path]["sim_path"] == path
    assert runs["python"]["sim_path_reason"] == "asked for (--sim-path python)"
    wall = ("wall_s", "sim_path", "sim_path_reason")
    assert {k: v for k, v in runs["python"].items() if k not in wall} == \
           {k: v for k, v in runs["compiled"].items() if k not in wall}
    code, out, err = run(capsys, *base, "--sim-path", "compiled", "--refill", "background")
    assert code == 2 and err.strip().count("\n") == 0
    assert "--sim-path compiled cannot run this configuration: background refill" in err
