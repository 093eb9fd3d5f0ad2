"""The validation layer (issue 23): every bad input is exit 2 with one line on stderr
naming the value, never a traceback; a run past a resource limit is refused before it starts
unless --allow-large."""
import json
import math
import os
import threading
import time
from importlib import resources

import click
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helmgr.cli import main
from helmgr.cli.types import POSITIVE, SEED, Finite, grid_size, ratio_grid
from helmgr.core.errors import HelmInputError
from helmgr.core.profiles import HardwareProfile, ModelProfile, check_profile, load_hardware, load_model
from helmgr.core.validate import Limits, Range, check_record, number
from helmgr.sim.config import FaultSpec, SimConfig, check_faults
from helmgr.workload.trace import read_trace, trace_workload

PROFILES = resources.files("helmgr.core.profiles")
A100 = (PROFILES / "hardware" / "a100-80g.toml").read_text()
LARGE = (PROFILES / "model" / "large.toml").read_text()
INTER = "user_id:token\titem_id:token\ttimestamp:float\n1\t10\t100\n1\t11\t160\n2\t10\t130\n2\t12\t190\n"


def refused(capsys, argv, *needles):
    """`helmgr argv` exits 2 with one line on stderr that holds every needle, and no traceback."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (argv, err)
    assert "Traceback" not in err and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def with_line(text: str, key: str, value: str) -> str:
    """A profile's text with `key = ...` replaced by `key = value`."""
    lines = [f"{key} = {value}" if ln.split("=")[0].strip() == key else ln for ln in text.splitlines()]
    assert lines != text.splitlines()
    return "\n".join(lines) + "\n"


# -- numbers: click's FloatRange lets inf and nan through -----------------------------------------
@pytest.mark.parametrize("argv,value", [
    (["simulate", "--duration", "inf"], "inf"),
    (["simulate", "--duration", "nan"], "nan"),
    (["simulate", "--duration", "1e999"], "1e999"),
    (["simulate", "--duration", "5", "--rps", "inf"], "inf"),
    (["simulate", "--duration", "5", "--rps", "nan"], "nan"),
    (["simulate", "--duration", "5", "--slo-ms", "inf"], "inf"),
    (["simulate", "--duration", "5", "--tick-ms", "nan"], "nan"),
    (["simulate", "--duration", "5", "--refresh-s", "inf"], "inf"),
    (["simulate", "--duration", "5", "--ratio", "nan"], "nan"),
    (["simulate", "--duration", "5", "--time-compression", "inf"], "inf"),
    (["workload", "--duration", "-inf"], "-inf"),
    (["sweep", "--duration", "nan"], "nan"),
    (["compare", "--rps", "inf"], "inf"),
    (["train", "--episode-s", "inf"], "inf"),
    (["profile", "--page-mib", "inf"], "inf"),
    (["profile", "--ratio", "nan"], "nan"),
])
def test_non_finite_numbers_are_refused(capsys, argv, value):
    refused(capsys, argv, "not a finite number", value)


@pytest.mark.parametrize("argv", [
    ["simulate", "--duration", "5", "--seed", "99999999999999999999"],
    ["simulate", "--duration", "5", "--seed", "4294967296"],
    ["simulate", "--duration", "5", "--seed", "-1"],
    ["workload", "--seed", "99999999999999999999"],
    ["train", "--seed", "99999999999999999999"],
])
def test_seeds_out_of_range_are_refused(capsys, argv):
    refused(capsys, argv, "--seed", argv[-1], "4294967295")


def test_calibrate_seed_and_pool_are_checked(capsys, tmp_path):
    refused(capsys, ["calibrate", "--out", str(tmp_path / "c.toml"), "--seed", str(2**40)], str(2**40))
    refused(capsys, ["calibrate", "--out", str(tmp_path / "c.toml"), "--pool-mib", "inf"], "inf")
    assert not (tmp_path / "c.toml").exists()


# -- resource estimates, checked before a run starts -----------------------------------------------
@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.inter"
    path.write_text(INTER)
    return str(path)


@pytest.mark.parametrize("argv,needles", [
    (["simulate", "--rps", "1e12"], ("--rps 1e+12", "requests", "--allow-large")),
    (["workload", "--duration", "5", "--rps", "1e12"], ("--rps 1e+12", "requests")),
    (["sweep", "--duration", "5", "--ratios", "0:1:1e-7"], ("0:1:1e-7", "10,000,001 runs", "--allow-large")),
    (["sweep", "--duration", "5", "--ratios", "0:1:5e-324"], ("0:1:5e-324", "runs")),
    (["compare", "--duration", "5", "--ratios", "0:1:0.0001"], ("0:1:0.0001", "runs")),
    (["simulate", "--duration", "1e7", "--rps", "1e-6"], ("--duration 1e+07", "controller ticks")),
    (["simulate", "--duration", "5", "--tick-ms", "1e-9"], ("--tick-ms 1e-09", "controller ticks")),
    (["simulate", "--duration", "5", "--nodes", "100000"], ("--nodes 100000", "GiB of memory")),
    (["capacity", "--rps", "1e6", "--duration", "60"], ("--rps 1e+06 x --duration 60", "60,000,000 requests",
                                                        "--allow-large")),
    (["capacity", "--workload", "trend", "--nodes", "3000"], ("--nodes 3000", "GiB of memory")),
    (["scenario", "--check", "--rps", "1e5"], ("--rps 100000 x 360 s", "requests")),
    (["scenario", "--check", "--ratios", "0:1:0.0001"], ("--seeds '1,2,3' x --ratios '0:1:0.0001'", "90,009 runs")),
    (["plan", "--rps", "1e6"], ("--rps 1e+06 x 60 s", "requests")),
    (["evaluate", "--capacity-duration", "1e5"], ("steady: capacity probe, 1300 req/s", "130,000,000 requests")),
])
def test_runs_past_a_limit_are_refused_before_they_start(capsys, argv, needles):
    refused(capsys, argv + ["--json"], *needles)


def a_pipe(path) -> str:
    """A named pipe at `path`. Should a command read it, a writer opens and closes it at once, so
    the read sees an empty file and the test fails rather than hangs."""
    os.mkfifo(path)

    def unblock():
        for _ in range(100):
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                return
            except OSError:                      # no reader (yet)
                time.sleep(0.05)
    threading.Thread(target=unblock, daemon=True).start()
    return str(path)


def test_a_pipe_is_refused_not_read(capsys, tmp_path):
    refused(capsys, ["simulate", "--duration", "5", "--classes", a_pipe(tmp_path / "c.toml")],
            "class table file", "is not a regular file")
    refused(capsys, ["simulate", "--duration", "5", "--trace", a_pipe(tmp_path / "t.inter")],
            "t.inter", "is not a regular file")


NT = ["no-tuning", "--hardware", "a100-80g", "--models", "small", "--workloads", "steady", "--ratios", "0.4,0.5"]


@pytest.mark.parametrize("argv,needles", [
    (NT + ["--time-compression", "1e-300"], ("3.6e+302 s (--time-compression 1e-300)", "requests")),
    (NT[:-1] + ["0:1:0.000001"], ("--ratios '0:1:0.000001' + full HELM", "1,000,002 runs")),
    (NT + ["--capacity-workloads", "steady", "--capacity-duration", "1e308"], ("capacity probe", "inf requests")),
    (["train", "--episode-s", "1e9"], ("162.5 req/s x 1e+09 s (--episode-s 1e+09 after a 15-s warm-up)", "requests")),
    (["train", "--envs", "256"], ("--envs 256", "128 GiB of memory")),
    (["train", "--seeds", "1", "--validate-duration", "1e308"], ("steady validation: 1300 req/s x --validate-duration 1e+308",)),
    (["train", "--nodes", "8", "--episode-s", "16000"], ("steady episodes: 1300 req/s x 16015 s (--episode-s 16000 after a 15-s warm-up)",
                                                         "20,819,500 requests")),
    (["scenario", "--check", "--refresh-s", "0.0001", "--workloads", "steady", "--seeds", "1", "--duration", "5"],
     ("steady: --duration 5 / --refresh-s 0.0001 x --nodes 8", "EMB rows re-ranked")),
    (NT + ["--capacity-workloads", "steady", "--capacity-duration", "1e9"], ("--capacity-duration 1e+09",)),
])
def test_studies_past_a_limit_are_refused_before_they_start(capsys, tmp_path, argv, needles):
    if argv[0] == "train":
        argv = argv + ["--out", str(tmp_path / "p.npz"), "--runs-dir", str(tmp_path / "runs")]
    refused(capsys, argv, *needles)
    assert not (tmp_path / "runs").exists()


def test_a_study_whose_runs_measure_nothing_is_refused(capsys):
    refused(capsys, NT + ["--time-compression", "1e308", "--jobs", "1"], "a100-80g/small/steady", "no static-best")


@pytest.mark.parametrize("argv,needle", [
    (["--validate-duration", "5"], "give --seeds"),
    (["--seeds", "1", "--seed", "5"], "--seed 5 and --seeds '1'"),
    (["--seeds", "1", "--validate-seeds", ""], "--validate-seeds ''"),
])
def test_train_options_that_would_be_ignored_or_misnamed(capsys, tmp_path, argv, needle):
    refused(capsys, ["train", "--out", str(tmp_path / "p.npz"), "--runs-dir", str(tmp_path / "runs")] + argv, needle)


def test_a_replay_with_nothing_to_control_is_refused_before_training(capsys, tmp_path):
    log = tmp_path / "t.inter"
    log.write_text("user_id:token\titem_id:token\ttimestamp:float\n"
                   + "".join(f"{k % 50}\t{k % 90}\t{k * 10.0}\n" for k in range(3000)))
    refused(capsys, ["train", "--trace", str(log), "--time-compression", "1e-300", "--out", str(tmp_path / "p.npz"),
                     "--runs-dir", str(tmp_path / "runs")], "hold 1 requests", "--time-compression 1e-300")


@pytest.mark.parametrize("argv,needle", [
    (["profile", "--prefix", "1" + "0" * 23], "'--prefix'"),
    (["bench", "--controller", "--cold-mb", "65536"], "'--cold-mb'"),
    (["bench", "--policy", "{policy}"], "goes with --controller"),
    (["sweep", "--policy", "helm"], "--policy 'helm': a sweep runs static splits"),
    (["sweep", "--ratio", "0.3"], "--ratio 0.3: a sweep runs every ratio"),
    (["workload", "--overlay", "burst"], "give --trace LOG"),
    (["simulate", "--clone-users", "5"], "give --trace LOG"),
    (["compare", "--routers", ""], "--routers"),
    (["calibrate", "--out", "{tmp}/d.toml", "--n-items", "1000000000000"], "more than half this machine"),
    (["calibrate", "--out", "{tmp}/d.toml", "--pool-mib", "1e-9"], "--pool-mib must be >= 0.25"),
    (["calibrate", "--out", "{tmp}/c.model.toml"], "named as the model profile"),
])
def test_options_that_cannot_mean_what_they_say(capsys, tmp_path, argv, needle):
    """Values past any sane run, and options a command would ignore, are refused before any work."""
    from helmgr.controller.controller import default_policy_file
    argv = [a.format(tmp=tmp_path, policy=default_policy_file()) for a in argv]
    refused(capsys, argv, needle)
    assert list(tmp_path.iterdir()) == []


def test_trace_clones_past_the_limit(capsys, trace):
    refused(capsys, ["simulate", "--duration", "5", "--trace", trace, "--clone-users", "100000000"],
            "--clone-users 100000000", "5 lines", "requests")


def test_allow_large_overrides_a_limit(capsys, monkeypatch):
    monkeypatch.setattr("helmgr.cli.types.LIMITS", Limits(requests=100))
    refused(capsys, ["workload", "--duration", "2", "--json"], "requests (limit 100)")
    assert main(["workload", "--duration", "2", "--json", "--allow-large"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] > 100


def test_a_command_s_cost_reads_its_regime_s_rate():
    from helmgr.cli.types import option_costs
    requests = {r: option_costs({"regime": r, "duration": 10.0})[0].amount for r in ("steady", "trend")}
    assert requests == {"steady": 13_000.0, "trend": 22_000.0}          # 1,300 and 2,200 req/s x 10 s


def test_the_default_scenario_is_far_inside_the_limits():
    from helmgr.cli.types import option_costs
    options = {"duration": 120.0, "rps": None, "trace": None, "nodes": 8, "tick_ms": 10.0,
               "ratios": "0.05:0.95:0.05", "policies": "static,static-best,independent,adaptive,latency-driven,oracle"}
    for cost in option_costs(options):
        assert cost.amount <= cost.limit / 20, cost


def test_ratio_grid_past_its_hard_cap_is_refused_even_with_allow_large(capsys):
    refused(capsys, ["sweep", "--ratios", "0:1:1e-9", "--allow-large", "--json"], "0:1:1e-9", "points")


# -- faults that would change nothing --------------------------------------------------------------
@pytest.mark.parametrize("faults,needle", [
    (["1@10"], "not inside the run"),
    (["1@5"], "not inside the run"),
    (["1@1:9"], "after the run's end"),
    (["1@1:3", "1@2:4"], "overlap on node 1"),
    (["1@1", "1@2:3"], "overlap on node 1"),
    (["1@1:2", "1@2:3"], "overlap on node 1"),
    (["1@" + "9" * 400], "not finite"),
])
def test_faults_outside_the_run_or_overlapping_are_refused(capsys, faults, needle):
    argv = ["simulate", "--duration", "5", "--json"] + [x for f in faults for x in ("--fail-node", f)]
    refused(capsys, argv, needle)


def test_faults_on_different_nodes_or_apart_are_fine():
    check_faults((FaultSpec(1, 1.0, 2.0), FaultSpec(1, 3.0, None), FaultSpec(2, 1.5, 4.0)), 5.0)
    with pytest.raises(HelmInputError, match="overlap"):
        SimConfig(nodes=4, faults=(FaultSpec(1, 1.0, None), FaultSpec(1, 3.0, 4.0))).validate()


# -- profiles -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,key,value,needle", [
    ("hardware", "compute_efficiency", "50", "(0, 1]"),
    ("hardware", "compute_efficiency", "0.0", "(0, 1]"),
    ("hardware", "pcie_bw_gbs", "inf", "finite"),
    ("hardware", "hbm_bw_gbs", "nan", "finite"),
    ("hardware", "hbm_gib", "true", "must be a number"),
    ("hardware", "hbm_gib", '"80"', "must be a number"),
    ("hardware", "hbm_gib", "-1.0", "hbm_gib"),
    ("hardware", "launch_us", "0", "launch_us"),
    ("hardware", "reserved_gib", "-0.5", "reserved_gib"),
    ("hardware", "peak_tflops", "1e300", "peak_tflops"),
    ("hardware", "name", '""', "non-empty string"),
    ("model", "layers", "2.5", "must be an integer"),
    ("model", "layers", "0", "layers"),
    ("model", "heads", "-4", "heads"),
    ("model", "d_model", "true", "must be an integer"),
    ("model", "dtype_bytes", "16", "dtype_bytes"),
    ("model", "candidates", "1e400", "must be an integer"),
    ("model", "slo_ms", "inf", "finite"),
    ("model", "weights_gib", "[1, 2]", "must be a number"),
])
def test_impossible_profile_values_name_the_field_and_file(capsys, tmp_path, kind, key, value, needle):
    path = tmp_path / "bad.toml"
    path.write_text(with_line(A100 if kind == "hardware" else LARGE, key, value))
    refused(capsys, ["simulate", "--duration", "5", f"--{kind}", str(path)], key, "bad.toml", needle)


@pytest.mark.parametrize("content,needle", [
    (b"\x00\x01\x02\x03binary\xff", "binary"),
    (b"name = \"x\"\nhbm_gib = 80.0 \xff\xfe\n", "not UTF-8"),
    (b"\xef\xbb\xbf= = =\n", "not valid TOML"),
    (b"", "missing"),
])
def test_binary_or_undecodable_profile_files(capsys, tmp_path, content, needle):
    path = tmp_path / "p.toml"
    path.write_bytes(content)
    refused(capsys, ["simulate", "--duration", "5", "--hardware", str(path)], "p.toml", needle)
    refused(capsys, ["profile", "--model", str(path)], "p.toml", needle)


def test_profile_path_that_is_missing_or_a_folder(capsys, tmp_path):
    refused(capsys, ["profile", "--hardware", str(tmp_path / "nope.toml")], "nope.toml", "does not exist")
    (tmp_path / "dir.toml").mkdir()
    refused(capsys, ["profile", "--hardware", str(tmp_path / "dir.toml")], "dir.toml", "is not a regular file")
    refused(capsys, ["profile", "--model", "../hardware/a100-80g"], "unknown model profile")


def test_every_preset_passes_the_validator():
    from helmgr.core.profiles import available
    for name in available("hardware"):
        load_hardware(name)
    for name in available("model"):
        load_model(name)


BAD_FLOATS = st.sampled_from(["inf", "-inf", "nan", "0.0", "-1.0", "true", "false", '"1.0"', "2e9", "[]", "{}"])
BAD_INTS = st.sampled_from(["2.5", "0", "-1", "true", "inf", "nan", '"8"', "2000000", "1e3"])


def _fields(cls):
    from dataclasses import fields
    return [f for f in fields(cls) if f.type != "str"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_bad_profiles_are_named_errors(tmp_path, data):
    cls, text = data.draw(st.sampled_from([(HardwareProfile, A100), (ModelProfile, LARGE)]))
    field = data.draw(st.sampled_from(_fields(cls)))
    value = data.draw(BAD_INTS if field.type == "int" else BAD_FLOATS)
    if field.name in ("reserved_gib", "fixed_kernels", "batch_half_rows", "batch_request_us") and value in ("0", "0.0"):
        value = "-1"                                      # zero is allowed there
    path = tmp_path / "gen.toml"
    path.write_text(with_line(text, field.name, value))
    with pytest.raises(HelmInputError) as exc:
        (load_hardware if cls is HardwareProfile else load_model)(str(path))
    assert field.name in str(exc.value) and "gen.toml" in str(exc.value)
    assert "\n" not in str(exc.value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=200))
def test_arbitrary_bytes_as_a_profile_are_a_named_error(tmp_path, content):
    path = tmp_path / "rand.toml"
    path.write_bytes(content)
    with pytest.raises(HelmInputError, match="rand.toml"):
        load_hardware(str(path))


def test_a_field_with_a_default_may_be_left_out_and_no_other():
    import tomllib
    data = tomllib.loads(A100)
    assert check_profile(HardwareProfile, data, "x")["batch_request_us"] == 0.0
    del data["batch_request_us"]
    assert "batch_request_us" not in check_profile(HardwareProfile, data, "x")     # the dataclass's default
    assert HardwareProfile(**check_profile(HardwareProfile, data, "x")).batch_request_us == 0.0
    del data["batch_half_rows"]
    with pytest.raises(HelmInputError, match=r"x: missing \['batch_half_rows'\]"):
        check_profile(HardwareProfile, data, "x")


def test_check_profile_accepts_ints_for_float_fields_and_returns_floats():
    import tomllib
    data = tomllib.loads(with_line(A100, "hbm_gib", "80"))
    assert check_profile(HardwareProfile, data, "x")["hbm_gib"] == 80.0
    assert isinstance(check_profile(HardwareProfile, data, "x")["hbm_gib"], float)


# -- traces ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt,content,line,needle", [
    ("inter", b"\x7fELF\x02\x01\x01\x00\x00\x00", 1, "binary"),
    ("inter", INTER.encode() + b"3\t\xff\xfe\t200\n", 6, "not UTF-8"),
    ("inter", INTER.encode() + b"3\t13\t1e308\n", 6, "1e308"),
    ("inter", INTER.encode() + b"3\t13\t-1e308\n", 6, "-1e308"),
    ("inter", INTER.encode() + b"3\t13\t2e18\n", 6, "2e18"),
    ("sequences", b"u1 i1 i2\nu2 \x00\x00 i3\n", 2, "binary"),
    ("sequences", b"u1 i1 i2\nu2 \xc3\x28 i3\n", 2, "not UTF-8"),
])
def test_bad_trace_files_name_the_file_and_line(capsys, tmp_path, fmt, content, line, needle):
    path = tmp_path / "bad.trace"
    path.write_bytes(content)
    refused(capsys, ["simulate", "--duration", "5", "--trace", str(path), "--trace-format", fmt],
            f"bad.trace:{line}:", needle)


def test_a_trace_that_is_not_a_regular_file(capsys):
    refused(capsys, ["simulate", "--duration", "5", "--trace", "/dev/null"], "/dev/null", "not a regular file")


@pytest.mark.parametrize("nodes", ["99999999999", "0", "16385", "32,x"])
def test_bench_cluster_sizes_are_bounded(capsys, nodes):
    refused(capsys, ["bench", "--nodes", nodes, "--json"], f"--nodes '{nodes}'")


def test_compression_that_overflows_the_replay_times_is_an_error(tmp_path):
    path = tmp_path / "long.inter"
    path.write_text("user_id:token\titem_id:token\ttimestamp:float\n1\t10\t0\n1\t11\t1e10\n")
    with pytest.raises(HelmInputError, match="time-compression 1e-300 stretches"):
        trace_workload(str(path), "inter", duration_s=5.0, time_compression=1e-300)


@pytest.mark.parametrize("kwargs,needle", [({"duration_s": math.nan}, "duration"), ({"clone_users": 2.5}, "clone-users"),
                                           ({"seed": -1}, "seed"), ({"time_compression": math.inf}, "time-compression")])
def test_trace_workload_arguments(trace, kwargs, needle):
    with pytest.raises(HelmInputError, match=needle):
        trace_workload(trace, "inter", **kwargs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=300), fmt=st.sampled_from(["inter", "sequences"]))
def test_arbitrary_bytes_as_a_trace_read_or_fail_by_name(tmp_path, content, fmt):
    path = tmp_path / "rand.trace"
    path.write_bytes(content)
    try:
        log = read_trace(str(path), fmt)
    except HelmInputError as exc:
        assert "rand.trace" in str(exc)
    else:
        assert len(log.user) == len(log.item) == len(log.time) and all(map(math.isfinite, log.time))


# -- the types and checkers themselves ------------------------------------------------------------
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e999", float("inf"), float("nan"), "x"])
def test_finite_refuses_non_finite_and_non_numbers(value):
    with pytest.raises(click.BadParameter):
        POSITIVE.convert(value, None, None)


@pytest.mark.parametrize("kind,value,ok", [
    (POSITIVE, "1.5", 1.5), (POSITIVE, 2, 2.0), (Finite(0.0, 1.0), "1", 1.0), (Finite(min=2), "2", 2.0),
])
def test_finite_accepts_finite_values_in_range(kind, value, ok):
    assert kind.convert(value, None, None) == ok


@pytest.mark.parametrize("kind,value", [(POSITIVE, "0"), (POSITIVE, "-1e-300"), (Finite(0.0, 1.0), "1.5"),
                                        (SEED, "4294967296"), (SEED, "-1"), (SEED, "1.5")])
def test_bounds_are_still_checked(kind, value):
    with pytest.raises(click.BadParameter):
        kind.convert(value, None, None)


def test_seed_bounds_inclusive():
    assert SEED.convert("0", None, None) == 0 and SEED.convert(str(2**32 - 1), None, None) == 2**32 - 1


@pytest.mark.parametrize("value,integer,allowed,needle", [
    (True, False, Range(), "must be a number"), ("1", False, Range(), "must be a number"),
    (2.5, True, Range(), "must be an integer"), (math.nan, False, Range(), "finite"),
    (-math.inf, False, Range(), "finite"), (0, False, Range(0, None, low_open=True), "> 0"),
    (1.5, False, Range(0.0, 1.0, low_open=True), "in (0, 1]"), (-1, True, Range(0), ">= 0"),
    (2e6, False, Range(0.25, float(1 << 20)), "in [0.25, 1048576]"), (2e20, False, Range(None, 1e20), "<= 1e+20"),
])
def test_number_names_the_value(value, integer, allowed, needle):
    with pytest.raises(HelmInputError, match="x must") as exc:
        number("x", value, allowed, integer)
    assert needle in str(exc.value) and repr(value) in str(exc.value)


def test_check_record_missing_and_unknown_fields():
    with pytest.raises(HelmInputError, match=r"missing \['hbm_gib'.*unknown \['extra'\]"):
        check_record(HardwareProfile, {"name": "x", "extra": 1}, {}, "where")


@pytest.mark.parametrize("text,n", [("0.05:0.95:0.05", 19), ("0:1:1e-7", 10_000_001), ("0.1,0.2", 2),
                                    ("0:1:5e-324", math.inf)])
def test_grid_size_without_building_the_grid(text, n):
    assert grid_size(text) == n


@pytest.mark.parametrize("text,grid", [("0.1:0.6:0.3", [0.1, 0.4]), ("0:0.9:0.5", [0.0, 0.5]), ("0:1:2", [0.0]),
                                       ("0.2:0.8:0.2", [0.2, 0.4, 0.6, 0.8]), ("0.3:0.3:0.1", [0.3])])
def test_a_grid_stops_at_its_stop(text, grid):
    """Whole steps from start, none past stop (0.1:0.6:0.3 ran 0.7 when the count was rounded)."""
    assert ratio_grid(text) == grid and grid_size(text) == len(grid)


@pytest.mark.parametrize("text", ["0:1:nan", "0:inf:0.1", "nan,0.5", "0:1:0", "1:0:0.1", "a,b"])
def test_bad_grids(text):
    with pytest.raises(HelmInputError, match="--ratios"):
        ratio_grid(text)


def test_sim_config_validate_checks_every_number():
    for bad in ({"slo_ms": math.inf}, {"ratio": math.nan}, {"seed": 2**40}, {"host_kv_gib": -1.0},
                {"r_min": 0.9, "r_max": 0.1}, {"tick_s": math.inf}, {"nodes": 2.5}):
        with pytest.raises(HelmInputError):
            SimConfig(**bad).validate()


def test_reported_by_the_fuzz(tmp_path, capsys):
    """A tiny refresh interval (minutes of re-ranking), calibrate's --out naming a folder, a thread
    count torch cannot take: exit 2 naming the value; an .inter file opening with a BOM is read."""
    from helmgr.cli import main
    for argv, named in ((["simulate", "--duration", "3", "--nodes", "1", "--rps", "10", "--refresh-s", "1e-4"],
                         "--refresh-s 0.0001"),
                        (["calibrate", "--out", "."], "--out '.'"),
                        (["calibrate", "--threads", "1000000000000"], "1000000000000")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert named in err and "\n" not in err and "Traceback" not in err
    bom = tmp_path / "bom.inter"
    bom.write_bytes(b"\xef\xbb\xbfuser_id:token\titem_id:token\ttimestamp:float\n1\t2\t3\n1\t3\t4\n2\t5\t6\n")
    assert main(["workload", "--trace", str(bom), "--duration", "5", "--json"]) == 0


def test_the_hot_spot_figure_needs_no_dense_array_of_empty_spans():
    """Services starting ~1e12 s in (a profile with almost no bandwidth) once asked for a
    122-GiB array; only spans something started in are kept, with the same figure."""
    from helmgr.sim.metrics import node_load_peak
    node = np.array([0, 1, 0, 1, 0])
    start = np.array([0.0, 1.0, 20.0, 21.0, 1e12])
    end = start + np.array([1.0, 3.0, 2.0, 2.0, 1.0])
    assert node_load_peak(node, start, end, 2) == pytest.approx(1.5)      # span 0: 1 vs 3 -> 3 / 2


def test_a_trace_error_crosses_a_process_boundary_whole():
    """A worker's TraceFormatError is pickled back to the parent (unpickling it used to fail,
    which killed the process pool instead of naming the bad line)."""
    import pickle
    from helmgr.core.errors import TraceFormatError
    err = pickle.loads(pickle.dumps(TraceFormatError("bad.trace", 6, "not UTF-8")))
    assert (type(err), str(err), err.line) == (TraceFormatError, "bad.trace:6: not UTF-8", 6)


@pytest.mark.parametrize("argv,needle", [(["simulate", "--emb-sample", "3"], "emb-sample 3 is not a power of two"),
                                         (["simulate", "--emb-sample", "2048"], "2048 is not in the range"),
                                         (["bench", "--sim", "--emb-sample", "1,6"], "--emb-sample '1,6': 6 is not"),
                                         (["bench", "--sim", "--emb-sample", "x"], "not a comma list of integers")])
def test_emb_sampling_rates_are_powers_of_two(capsys, argv, needle):
    refused(capsys, argv + ["--duration", "5"], needle)


def test_bench_sim_names_an_unknown_policy(capsys):
    refused(capsys, ["bench", "--sim", "--policies", "static,helmm"], "--policies 'static,helmm': unknown helmm")


def test_second_audit_cases():
    """Legitimate sizes pass and past-limit ones name what they come from: train's 64 nodes (the
    option's top) within the limits, an episode being its warm-up and control only; a plan's check
    past the EMB re-rank limit; a grid's count at a tiny step."""
    from helmgr.cli.train_cmd import _costs
    from helmgr.core.validate import check_costs
    from helmgr.experiments.plan import PlanConfig, _past_limits
    check_costs(_costs(("steady", "trend", "burst"), 120.0, 64, 1, False, None))     # (135 / 2 + 1) x 64 x 2e6 rows
    pc = PlanConfig(rps=1000.0, cluster=SimConfig(), duration_s=20.0)
    assert _past_limits(pc, 100) is None
    # (20 / 2 + 1) x 1,000 nodes x 2,000,000 items = 2.2e10 rows re-ranked, past 2e10
    assert _past_limits(pc, 1000) == "~2.2e+10 EMB rows re-ranked (limit 2e+10)"
    assert grid_size("0:1:1e-9") == 1_000_000_001


def test_capacity_names_the_option_a_run_s_length_comes_from(capsys):
    refused(capsys, ["capacity", "--time-compression", "1e-300"], "1300 req/s x 3.6e+302 s (--time-compression 1e-300)")
    refused(capsys, ["calibrate", "--out", "x.toml", "--shrink", "1", "--n-items", "1000000000"], "--shrink 1 --n-items")
