"""Fuzz every command (issue 23, Deliver 6): generated options, trace files and profile
files, mixing small valid values with bad ones (nan, inf, negative, huge, wrong types, unknown
names, malformed fault specs and grids, binary and near-valid files).

For every example: the exit code is 0 or 2 and nothing escapes `main` (no traceback); with exit 2
stdout is empty and stderr is one line; with `--json` and exit 0 stdout is exactly one strict JSON
object; with `--out` and exit 2 the folder it sits in is byte-identical to before; with `--out` and
exit 0 the folder holds the command's result files (the same JSON as stdout), keeps the files it
already had, and no `.helmgr-*` scratch folder is left beside it.

Bounded for CI: every run that is not refused is tiny (<= 3 simulated seconds, <= 2 nodes, small
rates, grids of <= 3 ratios); values that are huge are past a limit of `core.validate` and so
refused before any work. `train` and `calibrate` take minutes, so their work is stubbed: an example
that gets past their checks counts as accepted. `serve` and `loadgen` only get values refused
before anything starts. `derandomize=True`: the same examples on every run.
"""
from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helmgr.cli import main

PROFILES = resources.files("helmgr.core.profiles")
PRESET_TEXT = {"hardware": (PROFILES / "hardware" / "a100-80g.toml").read_text(),
               "model": (PROFILES / "model" / "small.toml").read_text()}


def fuzz(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much])


# -- the invariants -------------------------------------------------------------------------------
class Reached(Exception):
    """A stubbed slow step (training, calibration, a server) was reached: every check passed."""


def _reach(*args, **kwargs):
    raise Reached


def strict_loads(text: str):
    def refuse(name):
        raise AssertionError(f"non-strict JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def snapshot(root: Path) -> dict:
    """Every path under `root`: a file's bytes, a link's target, None for a folder."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            out[rel] = ("link", os.readlink(p)) if p.is_symlink() else None if p.is_dir() else p.read_bytes()
    return out


RESULT_FILES = {"simulate": ("summary.json", "summary.md"), "sweep": ("sweep.json", "sweep.md", "sweep.png"),
                "compare": ("compare.json", "compare.md"), "workload": ("workload.json", "workload.md",
                                                                         "workload.png")}


@pytest.fixture
def fuzz_root(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


STATS: collections.Counter = collections.Counter()   # (command, outcome) -> examples


@pytest.fixture(scope="module", autouse=True)
def _stats():
    """HELMGR_FUZZ_STATS=file.json: write how many examples each command ran, by outcome."""
    yield
    if os.environ.get("HELMGR_FUZZ_STATS"):
        Path(os.environ["HELMGR_FUZZ_STATS"]).write_text(json.dumps(
            {f"{cmd} {outcome}": n for (cmd, outcome), n in sorted(STATS.items())}, indent=1))


def check(capsys, root: Path, argv: list[str], out: Path | None = None) -> int | None:
    """Run `helmgr argv` in `root` (the cwd) and assert the invariants; the exit code, or None when
    a stubbed step was reached."""
    code = _check(capsys, root, argv, out)
    STATS[argv[0], {None: "reached-stub", 0: "exit-0", 2: "exit-2"}[code]] += 1
    return code


def _check(capsys, root: Path, argv: list[str], out: Path | None = None) -> int | None:
    before = snapshot(root)
    kept = out is not None and out.is_dir() and (out / "notes.txt").exists()
    cwd = os.getcwd()
    os.chdir(root)
    try:
        code = main(argv)
    except Reached:
        code = None
    except BaseException as exc:                       # what a user would see as a traceback
        _, err = capsys.readouterr()
        raise AssertionError(f"helmgr {argv!r} raised {type(exc).__name__}: {exc}\n{err}") from exc
    finally:
        os.chdir(cwd)
    stdout, stderr = capsys.readouterr()
    assert "Traceback" not in stderr, (argv, stderr)
    if code is None:
        return None
    assert code in (0, 2), (argv, code, stderr)
    if code == 2:
        lines = stderr.splitlines()
        assert stdout == "" and len(lines) == 1 and lines[0].startswith("helmgr: error: "), (argv, stdout, stderr)
        assert snapshot(root) == before, f"helmgr {argv!r} exited 2 but changed {root}"
        return code
    obj = None
    if "--json" in argv:
        obj = strict_loads(stdout)
        assert isinstance(obj, dict), argv
    assert not list(root.rglob(".helmgr-*")), f"helmgr {argv!r} left a scratch folder"
    if out is not None:
        names = {p.name for p in out.iterdir()}
        files = RESULT_FILES[argv[0]]
        assert set(files) <= names, (argv, names)
        assert not kept or (out / "notes.txt").read_text() == "mine", argv
        first = strict_loads((out / files[0]).read_text())
        assert isinstance(first, dict) and (obj is None or first == obj), argv
    return code


# -- values ---------------------------------------------------------------------------------------
NOT_A_NUMBER = ["nan", "NaN", "inf", "+inf", "-inf", "1e999", "-1e999", "x", "", " ", "1,5", "1.5.2", "0x10",
                "--", "true", "½", "1e", "e5", "--json"]
NOT_POSITIVE = ["0", "-0.0", "-1", "-1e-300", "-3"]
NOT_AN_INT = ["x", "", "1.5", "nan", "inf", "1e3", "0x10", "2**32", "--json"]
BAD_SEED = ["-1", "4294967296", str(2**64), "1.0", "x", "nan", "99999999999999999999"]


def floats(lo: float, hi: float) -> st.SearchStrategy[str]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False).map(repr)


def pick(*values) -> st.SearchStrategy[str]:
    return st.sampled_from([str(v) for v in values])


def good_or(good: st.SearchStrategy[str], *extra) -> st.SearchStrategy[str]:
    return st.one_of(good, pick(*extra)) if extra else good


# Each option: (valid values that keep a run tiny, values that must be refused before any work).
# A "refused" value is wrong in type or range, or past a limit of core.validate (so never run):
# a huge --duration is >= 2e7 s (over 20 M controller ticks whatever --tick-ms), a huge --nodes is
# past 16 GiB, a huge --rps past 20 M requests.
WORKLOAD_OPTS = {
    "--workload": (pick("steady", "trend", "burst", "trend+burst", "burst+trend", "steady+burst"),
                   pick("bursty", "", "+", "steady+", "trend+trend", "STEADY", "burst+steady+trend+x", "nan")),
    "--duration": (good_or(floats(0.01, 3.0), "3", "0.001", "３", "1e-3"),
                   pick(*NOT_A_NUMBER, *NOT_POSITIVE, "1e9", "1e300", "1.7e308")),
    "--seed": (good_or(st.integers(0, 2**32 - 1).map(str), "0", "4294967295"), pick(*BAD_SEED)),
    "--rps": (good_or(floats(0.5, 200.0), "1e-9", "1", "50"), pick(*NOT_A_NUMBER, *NOT_POSITIVE, "1e12", "1e300")),
}
SIM_OPTS = {
    "--nodes": (pick(1, 2), pick(*NOT_AN_INT, "0", "-1", "100000", "10000000000", "99999999999999999999")),
    "--policy": (pick("static", "adaptive", "helm", "helm-base", "helm-base+adapter", "independent",
                      "latency-driven"), pick("oracle", "static-best", "magic", "", "HELM")),
    "--ratio": (good_or(floats(0.0, 1.0), "0", "1", "0.5", "1e-300"),
                pick(*NOT_A_NUMBER, "-0.1", "1.0000001", "2", "-1e-300")),
    "--router": (pick("round-robin", "least-loaded", "p2c", "affinity", "prefix-aware", "helm", "helm-kv",
                      "helm-emb", "helm-load"), pick("random", "", "helm,p2c", "Helm")),
    "--hardware": (pick("a100-80g", "h100-80g", "h200-141g", "cpu-ref"),
                   pick("tpu", "", "a100", "../hardware/a100-80g", "/nonexistent.toml", "x.toml", ".toml")),
    "--model": (pick("small", "large"), pick("huge", "", "small.toml", "/", "../model/small")),
    "--slo-ms": (good_or(floats(0.01, 1e6), "1e-300", "15"), pick(*NOT_A_NUMBER, *NOT_POSITIVE)),
    "--refill": (pick("sync", "lazy", "background"), pick("async", "", "LAZY")),
    # valid values stay >= 0.5 s so that examples stay fast; a tiny one is refused by the
    # re-ranked-rows limit (tests/test_validate.py)
    "--refresh-s": (good_or(floats(0.5, 50.0), "2"), pick(*NOT_A_NUMBER, *NOT_POSITIVE, "1e-7")),
    "--tick-ms": (good_or(floats(0.5, 1000.0), "10", "3000"), pick(*NOT_A_NUMBER, *NOT_POSITIVE, "1e-9", "1e-300")),
    "--max-batch": (pick(1, 2, 8, 65536), pick(*NOT_AN_INT, "0", "-1", "65537", "99999999999999999999")),
    "--fail-node": (pick("0@1", "1@1", "0@0.5:1.5", "1@1:2", "0@2.5", "1@0.1:0.2"),
                    pick("2@x", "9@1", "-1@1", "1@", "@1", "1@2:1", "1@nan", "1@inf", "1@1:inf", "1@1e9", "x@1",
                         "1@1:2:3", "1", "", "1@-1", "1@" + "9" * 400, "1.5@1", "99999999999999999999@1")),
}
TRACE_OPTS = {
    "--trace-format": (pick("inter", "sequences"), pick("csv", "", "INTER")),
    "--time-compression": (good_or(floats(1e-3, 1e6), "1", "1e300"),
                           pick(*NOT_A_NUMBER, *NOT_POSITIVE)),
    "--clone-users": (pick(1, 2, 3), pick(*NOT_AN_INT, "0", "-1", "100000000", "99999999999999999999")),
    "--overlay": (pick("trend", "burst"), pick("steady", "", "trend+burst", "x")),
}
LIST_OPTS = {
    "--ratios": (pick("0.3,0.7", "0.5", "0.2:0.8:0.3", "0:1:0.5", "0.3, 0.7", "1,0", "0.7,0.3,0.5"),
                 pick("0.5:0.1:0.1", "0.2,1.5", "0:1:0", "0:1:-0.1", "0:1:1e-7", "0:1:5e-324", "0:1:nan",
                      "0:inf:0.1", "nan,0.5", "a,b", "", ",", "0:1", "0:1:0.1:0.1", "-0.1,0.5", "0.5,inf",
                      "0:1:1e-9")),
    "--jobs": (pick(1), pick(*NOT_AN_INT, "0", "-1")),
}
COMPARE_OPTS = {
    "--policies": (pick("static", "static,adaptive", "static,oracle", "static-best", "helm,static",
                        "static, adaptive", "static,,adaptive"),
                   pick("static,magic", "", ",", "oracle2", "Static", "static;adaptive")),
    "--routers": (pick("prefix-aware", "helm,least-loaded", "round-robin"),
                  pick("nope", "", ",", "helm,,nope", "HELM")),
}


@st.composite
def options(draw, table: dict, required: tuple[str, ...] = (), bad: bool = False, max_optional: int = 4,
            repeatable: tuple[str, ...] = ("--fail-node", "--overlay")) -> list[str]:
    """Options from `table`: every `required` one and a few others, all valid, or (bad) with one
    or two refused values."""
    optional = [k for k in table if k not in required]
    least = 1 if bad and not required else 0
    names = list(required) + draw(st.lists(st.sampled_from(optional), unique=True, min_size=least,
                                           max_size=max(max_optional, least)))
    wrong = set(draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))) if bad else set()
    argv = []
    for name in names:
        good, refused = table[name]
        times = draw(st.integers(1, 2)) if name in repeatable else 1
        for _ in range(times):
            argv += [name, draw(refused if name in wrong else good)]
    return argv


@st.composite
def out_folder(draw, root: Path, bad: bool) -> tuple[list[str], Path | None]:
    """No --out, a new folder, an existing one with a file of its own (and a stale result), or
    (bad) also a file, a folder whose parent is missing, or a folder inside a file."""
    kinds = ["none", "none", "new", "existing"] + (["file", "missing-parent", "under-file"] if bad else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "none":
        return [], None
    out = root / "res"
    if kind == "existing":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
        (out / "summary.json").write_text('{"old": 1}\n')
    elif kind == "file":
        out.write_text("keep")
    elif kind == "missing-parent":
        out = root / "missing" / "res"
    elif kind == "under-file":
        (root / "f").write_text("keep")
        out = root / "f" / "res"
    return ["--out", str(out)], out


@pytest.fixture
def example_root(fuzz_root):
    """A fresh folder per hypothesis example (the fixture itself is per test)."""
    made = []

    def fresh() -> Path:
        made.append(Path(tempfile.mkdtemp(dir=fuzz_root)))
        return made[-1]
    yield fresh
    for p in made:
        shutil.rmtree(p, ignore_errors=True)


def _run_with_out(capsys, root: Path, data, argv: list[str], bad: bool = True) -> int | None:
    extra, out = data.draw(out_folder(root, bad), label="out")
    argv = argv + extra + data.draw(st.sampled_from([["--json"], ["--json"], []]), label="json")
    return check(capsys, root, argv, out if extra and out is not None and out.parent.is_dir() else None)


BAD = st.sampled_from([False, True, True])           # a third of the examples are valid, tiny runs


# -- the commands ---------------------------------------------------------------------------------
@fuzz(15)
@given(data=st.data())
def test_fuzz_simulate(capsys, example_root, data):
    root = example_root()
    bad = data.draw(BAD, label="bad")
    table = WORKLOAD_OPTS | SIM_OPTS
    argv = ["simulate", "--jobs", "1"] + data.draw(options(table, ("--duration", "--nodes", "--rps"), bad, 5),
                                                   label="argv")
    if not bad and data.draw(st.booleans(), label="allow-large"):
        argv.append("--allow-large")
    _run_with_out(capsys, root, data, argv, bad)


@fuzz(7)
@given(data=st.data())
def test_fuzz_sweep(capsys, example_root, data):
    root = example_root()
    bad = data.draw(BAD, label="bad")
    table = WORKLOAD_OPTS | SIM_OPTS | LIST_OPTS
    argv = ["sweep"] + data.draw(options(table, ("--duration", "--nodes", "--rps", "--ratios", "--jobs"), bad, 3),
                                 label="argv")
    _run_with_out(capsys, root, data, argv, bad)


@fuzz(7)
@given(data=st.data())
def test_fuzz_compare(capsys, example_root, data):
    root = example_root()
    bad = data.draw(BAD, label="bad")
    table = WORKLOAD_OPTS | SIM_OPTS | LIST_OPTS | COMPARE_OPTS
    argv = ["compare"] + data.draw(options(table, ("--duration", "--nodes", "--rps", "--ratios", "--jobs",
                                                   "--policies"), bad, 2), label="argv")
    _run_with_out(capsys, root, data, argv, bad)


@fuzz(24)
@given(data=st.data())
def test_fuzz_workload(capsys, example_root, data):
    root = example_root()
    bad = data.draw(BAD, label="bad")
    argv = ["workload"] + data.draw(options(WORKLOAD_OPTS, ("--duration",), bad, 3), label="argv")
    _run_with_out(capsys, root, data, argv, bad)


PROFILE_OPTS = {
    "--hardware": SIM_OPTS["--hardware"],
    "--model": SIM_OPTS["--model"],
    "--ratio": SIM_OPTS["--ratio"],
    "--prefix": (good_or(st.integers(0, 10**30).map(str), "0", "1000"), pick(*NOT_AN_INT, "-1")),
    "--new-tokens": (good_or(st.integers(0, 10**30).map(str), "0", "4"), pick(*NOT_AN_INT, "-1")),
    "--page-mib": (good_or(floats(0.05, 1000.0), "2", "1e-9", "1e-300", "1e9"), pick(*NOT_A_NUMBER, *NOT_POSITIVE)),
}


@fuzz(60)
@given(data=st.data())
def test_fuzz_profile(capsys, example_root, data):
    argv = ["profile"] + data.draw(options(PROFILE_OPTS, (), data.draw(BAD), 4), label="argv")
    check(capsys, example_root(), argv + data.draw(st.sampled_from([["--json"], []])))


BENCH_OPTS = {
    "--router": (SIM_OPTS["--router"][0], pick("fastest", "", "helm,p2c")),
    "--nodes": (pick("1", "2", "1,2", "2,1", " 2 , 1 ", "1,"), pick("0", "32,x", "x", "", ",", "16385", "-1",
                                                                   "1.5", "99999999999", "1;2")),
    "--decisions": (pick(100, 150), pick(*NOT_AN_INT, "99", "0", "10000001")),
    "--repeats": (pick(1), pick(*NOT_AN_INT, "0", "1001")),
}
CONTROLLER_OPTS = {
    "--decisions": BENCH_OPTS["--decisions"],
    "--cold-mb": (pick(0, 1), pick(*NOT_AN_INT, "-1", "65537")),
    "--policy": (pick("__garbage__"), pick("/nonexistent.npz", "", ".")),
}


@fuzz(24)
@given(data=st.data())
def test_fuzz_bench(capsys, example_root, data):
    root = example_root()
    bad = data.draw(BAD)
    if data.draw(st.booleans(), label="controller"):
        argv = ["bench", "--controller"] + data.draw(options(CONTROLLER_OPTS, ("--decisions",), bad, 2))
        if "__garbage__" in argv:                       # an existing file that is no policy
            (root / "p.npz").write_bytes(data.draw(st.binary(max_size=64)))
            argv[argv.index("__garbage__")] = str(root / "p.npz")
    else:
        argv = ["bench"] + data.draw(options(BENCH_OPTS, ("--nodes", "--decisions", "--repeats"), bad, 1))
        if data.draw(st.booleans()) and bad:
            argv += ["--cold-mb", "4"]                  # only with --controller
    check(capsys, root, argv + data.draw(st.sampled_from([["--json"], []])))


TRAIN_OPTS = {
    "--timesteps": (pick(64, 20000, 10**9), pick(*NOT_AN_INT, "63", "0", "1000000001")),
    "--seed": WORKLOAD_OPTS["--seed"],
    "--out": (pick("policy.npz", "p/../policy.npz", "deep.npz"), pick(".", "missing/p.npz", "/proc/p.npz", "f/p.npz")),
    "--workloads": (pick("steady", "steady,trend,burst", "trend+burst", "burst, steady"),
                    pick("nope", "", ",", "steady,nope", " , ")),
    "--episode-s": (good_or(floats(2.0, 1e4), "2"), pick(*NOT_A_NUMBER, "1.99", "0", "-5")),
    "--runs-dir": (pick("runs", "a/b/c"), pick("f", "f/runs", "/proc/runs")),
    "--envs": (pick(1, 2, 256), pick(*NOT_AN_INT, "0", "257")),
}


@fuzz(30)
@given(data=st.data())
def test_fuzz_train(capsys, monkeypatch, example_root, data):
    pytest.importorskip("stable_baselines3")
    monkeypatch.setattr("helmgr.learn.train.train", _reach)            # minutes of PPO: stubbed
    root = example_root()
    (root / "f").write_text("keep")
    argv = ["train"] + data.draw(options(TRAIN_OPTS, (), data.draw(BAD), 4))
    if data.draw(st.booleans()):
        argv.append("--relative")
    if "/proc" in " ".join(argv) and not os.path.exists("/proc/self"):
        return
    check(capsys, root, argv + data.draw(st.sampled_from([["--json"], []])))


CALIBRATE_OPTS = {
    "--device": (pick("cpu", "cuda"), pick("tpu", "", "CPU")),
    "--out": (pick("c.toml", "sub/../c.toml"), pick("missing/c.toml", "f/c.toml", "f", "c.txt", "/proc/c.toml",
                                                     ".", "..", "/")),
    "--model": (pick("small", "large"), pick("huge", "", "x.toml")),
    "--shrink": (pick(1, 16), pick(*NOT_AN_INT, "0", "-1")),
    "--candidates": (pick(1, 64), pick(*NOT_AN_INT, "0")),
    "--n-items": (pick(1000, 100000), pick(*NOT_AN_INT, "0")),
    "--pool-mib": (good_or(floats(1.0, 4096.0), "48"), pick(*NOT_A_NUMBER, *NOT_POSITIVE)),
    "--ratio": (good_or(floats(0.05, 0.95), "0.05", "0.95"), pick(*NOT_A_NUMBER, "0.04", "0.96", "0", "1")),
    "--max-tokens": (pick(8, 1024), pick(*NOT_AN_INT, "7", "0")),
    "--repeats": (pick(1, 7), pick(*NOT_AN_INT, "0")),
    "--warmup": (pick(0, 2), pick(*NOT_AN_INT, "-1")),
    "--threads": (pick(1, 2), pick(*NOT_AN_INT, "0", "-1", "1000000000000")),
    "--seed": WORKLOAD_OPTS["--seed"],
}


@fuzz(30)
@given(data=st.data())
def test_fuzz_calibrate(capsys, monkeypatch, example_root, data):
    pytest.importorskip("torch")
    monkeypatch.setattr("helmgr.real.calibrate.calibrate", _reach)     # seconds to minutes: stubbed
    root = example_root()
    (root / "f").write_text("keep")
    bad = data.draw(BAD)
    argv = ["calibrate"] + data.draw(options(CALIBRATE_OPTS, ("--out",), bad, 4))
    if "/proc" in " ".join(argv) and not os.path.exists("/proc/self"):
        return
    import torch
    threads = torch.get_num_threads()
    try:
        check(capsys, root, argv + data.draw(st.sampled_from([["--json"], []])))
    finally:
        torch.set_num_threads(threads)


# serve and loadgen: every example has at least one value click refuses, so nothing starts.
SERVE_OPTS = {
    "--replicas": (pick(1, 2), pick(*NOT_AN_INT, "0", "-1")),
    "--port": (pick(8000, 65535), pick(*NOT_AN_INT, "0", "65536", "-1")),
    "--num-cpus": (pick(1, 2), pick(*NOT_AN_INT, "0")),
    "--device": (pick("cpu", "cuda"), pick("tpu", "")),
    "--replica-cpus": (pick("0", "0.25", "1"), pick(*NOT_A_NUMBER, "-1", "-1e-300")),
    "--pool-mib": (pick("48", "1"), pick(*NOT_A_NUMBER, *NOT_POSITIVE)),
    "--ratio": (pick("0.3", "0.05"), pick(*NOT_A_NUMBER, "0.04", "0.96", "1")),
    "--slo-ms": (pick("50", "1"), pick(*NOT_A_NUMBER, *NOT_POSITIVE)),
    "--seed": WORKLOAD_OPTS["--seed"],
}
LOADGEN_OPTS = {
    "--duration": (pick("1", "20"), pick(*NOT_A_NUMBER, *NOT_POSITIVE)),
    "--rps": (pick("1", "20"), pick(*NOT_A_NUMBER, *NOT_POSITIVE)),
    "--concurrency": (pick(1, 32), pick(*NOT_AN_INT, "0")),
    "--max-requests": (pick(1, 100), pick(*NOT_AN_INT, "0")),
    "--slo-ms": (pick("50"), pick(*NOT_A_NUMBER, *NOT_POSITIVE)),
    "--timeout": (pick("30"), pick(*NOT_A_NUMBER, *NOT_POSITIVE)),
}


@fuzz(40)
@given(data=st.data())
def test_fuzz_serve_and_loadgen_refuse_before_starting(capsys, monkeypatch, example_root, data):
    import helmgr.cli.serve_cmd as serve_cmd
    monkeypatch.setattr(serve_cmd, "require", _reach, raising=False)  # belt and braces: nothing may start
    root = example_root()
    if data.draw(st.booleans()):
        argv = ["serve"] + data.draw(options(SERVE_OPTS, (), True, 3))
    else:
        argv = ["loadgen", "--url", "http://127.0.0.1:9"] + data.draw(options(LOADGEN_OPTS, (), True, 3))
        argv += data.draw(st.sampled_from([["--json"], [], ["--out", str(root / "res")]]))
    assert check(capsys, root, argv) == 2


# -- generated trace files ------------------------------------------------------------------------
TIMESTAMPS = st.one_of(st.integers(0, 10**6).map(str), floats(-1e6, 1e6),
                       pick("1e308", "-1e308", "1e18", "-1e18", "1.1e18", "9e18", "nan", "inf", "-inf", "1e-320",
                            "", "x", " 5", "5 ", "0x10", "1_000", "１２"))
IDS = st.one_of(st.integers(0, 50).map(str), pick("", " ", "u1", "ü", "\u00a0", "a b", "1.0", "-1", "nan"))


@st.composite
def inter_text(draw) -> bytes:
    header = draw(st.sampled_from([
        "user_id:token\titem_id:token\ttimestamp:float",
        "user_id:token\titem_id:token\trating:float\ttimestamp:float",
        "item_id:token\tuser_id:token\ttimestamp:float",
        "user_id:token\titem_id:token",
        "user_id\titem_id\ttimestamp",
        "\ufeffuser_id:token\titem_id:token\ttimestamp:float",
        "user_id:token,item_id:token,timestamp:float",
        "",
    ]))
    width = header.count("\t") + 1
    rows = []
    for _ in range(draw(st.integers(0, 12))):
        if draw(st.integers(0, 9)) == 0:                # a malformed row
            rows.append(draw(st.sampled_from(["", "\t", "1\t2", "1\t2\t3\t4\t5", "garbage", "\t\t"])))
            continue
        cols = [draw(IDS) for _ in range(width)]
        stamp = next((k for k, h in enumerate(header.split("\t")) if h.startswith("timestamp")), None)
        if stamp is not None:                           # (a comma header has no tab column to fill)
            cols[stamp] = draw(TIMESTAMPS)
        rows.append("\t".join(cols))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    raw = (newline.join([header] + rows) + draw(st.sampled_from(["", newline]))).encode()
    return _corrupt(draw, raw)


@st.composite
def sequences_text(draw) -> bytes:
    lines = [" ".join(draw(st.lists(IDS, max_size=8))) for _ in range(draw(st.integers(0, 10)))]
    raw = "\n".join(lines).encode()
    return _corrupt(draw, raw)


def _corrupt(draw, raw: bytes) -> bytes:
    """Sometimes a stray byte: a NUL, a byte that is not UTF-8, a lone continuation byte."""
    if raw and draw(st.integers(0, 4)) == 0:
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from([b"\0", b"\xff", b"\x80", b"\xc3\x28", b"\xed\xa0\x80"])) + raw[at:]
    return raw


TRACE_FILES = st.one_of(st.binary(max_size=300).map(lambda b: ("inter", b)),
                        st.binary(max_size=300).map(lambda b: ("sequences", b)),
                        inter_text().map(lambda b: ("inter", b)), inter_text().map(lambda b: ("inter", b)),
                        sequences_text().map(lambda b: ("sequences", b)))


@fuzz(60)
@given(data=st.data())
def test_fuzz_trace_files(capsys, example_root, data):
    root = example_root()
    fmt, content = data.draw(TRACE_FILES, label="trace")
    path = root / "t.trace"
    path.write_bytes(content)
    fmt = data.draw(st.sampled_from([fmt, fmt, fmt, "inter" if fmt == "sequences" else "sequences"]))
    # workload is cheap, so most examples; a few through a simulation of 1 node
    command = data.draw(st.sampled_from(["workload", "workload", "workload", "simulate"]))
    argv = [command, "--trace", str(path), "--trace-format", fmt, "--duration", data.draw(pick("1", "3"))]
    argv += data.draw(options({k: TRACE_OPTS[k] for k in ("--time-compression", "--clone-users", "--overlay")},
                              (), False, 2))
    if command == "simulate":
        argv += ["--nodes", "1", "--jobs", "1"]
    _run_with_out(capsys, root, data, argv)


# -- generated profile files ----------------------------------------------------------------------
def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)                      # a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"


TOML_VALUES = st.one_of(
    st.integers(-2**63, 2**63 - 1), st.floats(), st.booleans(), st.text(max_size=8),
    st.sampled_from([0, 1, 2, 8, 9, 10**6, 10**6 + 1, 0.0, 1e-300, 0.5, 1.0, 1e9, 1e10, 2.5, -1.0]),
    st.lists(st.integers(0, 3), max_size=3), st.dictionaries(st.sampled_from("ab"), st.integers(0, 3), max_size=2))


@st.composite
def profile_text(draw, kind: str) -> bytes:
    import tomllib
    data = tomllib.loads(PRESET_TEXT[kind])
    for _ in range(draw(st.integers(0, 3))):
        what = draw(st.sampled_from(["set", "set", "drop", "add"]))
        key = draw(st.sampled_from(sorted(data) or ["name"]))
        if what == "set":
            data[key] = draw(TOML_VALUES)
        elif what == "drop":
            data.pop(key, None)
        else:
            data[draw(st.sampled_from(["extra", "hbm", "Name", "layers "]))] = draw(TOML_VALUES)
    text = "".join(f"{json.dumps(k)} = {_toml(v)}\n" for k, v in data.items())
    return _corrupt(draw, text.encode())


PROFILE_FILES = st.one_of(
    st.sampled_from(["hardware", "model"]).flatmap(lambda k: profile_text(k).map(lambda b: (k, b))),
    st.sampled_from(["hardware", "model"]).flatmap(lambda k: profile_text(k).map(lambda b: (k, b))),
    st.tuples(st.sampled_from(["hardware", "model"]), st.binary(max_size=200)),
    st.tuples(st.sampled_from(["hardware", "model"]), st.text(max_size=200).map(str.encode)))


@fuzz(80)
@given(data=st.data())
def test_fuzz_profile_files(capsys, example_root, data):
    root = example_root()
    kind, content = data.draw(PROFILE_FILES, label="profile")
    path = root / "p.toml"
    path.write_bytes(content)
    argv = ["profile", f"--{kind}", str(path)] + data.draw(st.sampled_from([["--json"], []]))
    if check(capsys, root, argv) != 0 or content == PRESET_TEXT[kind].encode():
        return
    # A file `profile` accepts: simulate with it only when it is the preset's own values.
    # BUG (reported): valid but extreme profile values make a tiny simulation blow up:
    # peak_tflops = 1e-09 -> sim/metrics.py node_load_peak allocates 122 GiB (MemoryError);
    # pcie_bw_gbs = 1e-09 -> 30 s and 4.5 GB, then MemoryError. So no random accepted profile is
    # simulated here.


def test_fuzz_simulate_with_a_bad_profile_file_writes_nothing(capsys, example_root):
    """A refused profile file refuses the whole run before work: the --out folder stays as it was."""
    root = example_root()
    (root / "res").mkdir()
    (root / "res" / "notes.txt").write_text("mine")
    for kind, text in (("hardware", "hbm_gib = nan\n"), ("model", "\0"), ("hardware", PRESET_TEXT["hardware"] +
                                                                          "extra = 1\n")):
        (root / "p.toml").write_text(text)
        argv = ["simulate", "--duration", "1", "--nodes", "1", f"--{kind}", str(root / "p.toml"), "--json",
                "--out", str(root / "res")]
        assert check(capsys, root, argv, root / "res") == 2


# -- a few as a real process: exit status, stderr, no traceback ------------------------------------
@pytest.mark.parametrize("argv,code", [
    (["simulate", "--duration", "nan"], 2),
    (["workload", "--trace", "{root}/bin.trace", "--duration", "1"], 2),
    (["profile", "--page-mib", "1e-9"], 2),
    (["workload", "--duration", "1", "--rps", "20", "--json"], 0),
])
def test_fuzz_reproducers_as_a_process(fuzz_root, argv, code):
    (fuzz_root / "bin.trace").write_bytes(b"\x7fELF\0\0\xff")
    argv = [a.format(root=fuzz_root) for a in argv]
    p = subprocess.run([sys.executable, "-c", "import sys; from helmgr.cli import main; sys.exit(main())", *argv],
                       capture_output=True, text=True, timeout=120, cwd=fuzz_root)
    assert p.returncode == code, p.stderr
    assert "Traceback" not in p.stderr
    if code == 2:
        assert p.stdout == "" and len(p.stderr.splitlines()) == 1
    else:
        assert isinstance(strict_loads(p.stdout), dict)
