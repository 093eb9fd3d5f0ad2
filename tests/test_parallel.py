"""experiments.parallel: one runner for independent runs, serial, on local processes and on Ray;
sweep and compare give the same JSON whichever runs them."""
import gc
import importlib.util
import json
import os
import weakref

import pytest

from helmgr.cli import main
from helmgr.core.errors import HelmInputError
from helmgr.experiments.parallel import run_all

TINY = ("--duration", "3", "--nodes", "2", "--rps", "300", "--seed", "2")


def square(x: int) -> int:
    return x * x


def scaled(k: int, x: int) -> int:
    return k * x


def pid_of(_: int) -> int:
    return os.getpid()


def picky(x: float) -> float:
    if x == 0.35:
        raise HelmInputError("ratio 0.35 is not allowed here")
    if x == 0.5:
        raise ZeroDivisionError("division by zero")
    return x


@pytest.mark.parametrize("jobs", [1, 2])
def test_results_come_in_task_order_and_equal_serial(jobs):
    done = []
    assert run_all(square, range(7), jobs=jobs, on_done=done.append) == [x * x for x in range(7)]
    assert sorted(done) == list(range(7))
    assert run_all(scaled, [1, 2, 3], jobs=jobs, shared=10) == [10, 20, 30]
    assert run_all(square, [], jobs=jobs) == []
    kept = []                                 # each result reaches on_result in this process as it ends
    assert run_all(square, range(5), jobs=jobs, on_result=lambda i, v: kept.append((i, v))) == [0, 1, 4, 9, 16]
    assert sorted(kept) == [(i, i * i) for i in range(5)]


def test_jobs_1_runs_here_and_jobs_2_elsewhere():
    assert set(run_all(pid_of, range(3), jobs=1)) == {os.getpid()}
    assert os.getpid() not in run_all(pid_of, range(4), jobs=2)


class Cyclic:
    """What a run leaves behind: objects in a reference cycle, freed only by a full collection."""


CYCLES: list = []


def leave_a_cycle(x: int) -> int:
    a, b = Cyclic(), Cyclic()
    a.other, b.other = b, a
    CYCLES.append(weakref.ref(a))
    return x


def test_each_task_ends_with_a_full_collection():
    """A run's cycles are freed when its task ends, not when Python's object count next says so
    (a process running many runs grew by gigabytes): with automatic collection off, nothing a
    finished task left in a cycle is alive."""
    was = gc.isenabled()
    gc.disable()
    try:
        CYCLES.clear()
        assert run_all(leave_a_cycle, range(3), jobs=1) == [0, 1, 2]
        assert len(CYCLES) == 3 and all(r() is None for r in CYCLES)
        leave_a_cycle(9)                       # the same cycle outside a task: still alive
        assert CYCLES[-1]() is not None
    finally:
        CYCLES.clear()
        gc.collect()
        if was:
            gc.enable()


def test_a_serial_batch_keeps_what_was_alive_before_it_out_of_its_collections():
    """Each task's full collection walks what the tasks made, not the caller's state (an oracle's
    cluster, millions of recorded items): frozen for the batch, thawed after it, also when a task
    fails."""
    assert gc.get_freeze_count() == 0
    alive = [[] for _ in range(1000)]
    assert all(n >= len(alive) for n in run_all(lambda _: gc.get_freeze_count(), range(2), jobs=1))
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError, match="task 0 failed"):
        run_all(lambda _: 1 / 0, range(1), jobs=1)
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failed_task_is_named(jobs):
    names = [f"sweep ratio {r:g}" for r in (0.1, 0.35)]
    with pytest.raises(HelmInputError, match=r"^sweep ratio 0.35 failed: ratio 0.35 is not allowed here$"):
        run_all(picky, [0.1, 0.35], jobs=jobs, names=names)
    with pytest.raises(RuntimeError, match=r"^task 1 failed: ZeroDivisionError: division by zero$"):
        run_all(picky, [0.1, 0.5, 0.2], jobs=jobs)


def cli_json(capsys, *argv) -> dict:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def same(doc):
    """The document without what the wall clock decides (run times, controller decision times)."""
    if isinstance(doc, dict):
        return {k: same(v) for k, v in doc.items() if "wall" not in k and not k.startswith("decision_us")}
    if isinstance(doc, list):
        return [same(v) for v in doc]
    return doc


def test_sweep_json_is_the_same_with_one_or_two_workers(capsys):
    one, two = (cli_json(capsys, "sweep", *TINY, "--ratios", "0.3,0.7", "--jobs", j, "--json") for j in ("1", "2"))
    assert [r["ratio"] for r in one["rows"]] == [0.3, 0.7]
    assert same(one) == same(two)


def test_compare_json_is_the_same_with_one_or_two_workers(capsys):
    argv = ("compare", *TINY, "--ratios", "0.3,0.7", "--policies", "static,adaptive,static-best,oracle", "--json")
    one, two = (cli_json(capsys, *argv, "--jobs", j) for j in ("1", "2"))
    assert [r["policy"] for r in one["results"]] == ["static", "adaptive", "static-best", "oracle"]
    assert len(one["r_star"]) == 3
    assert same(one) == same(two)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (the [serve] extra)")
def test_a_sweep_on_a_local_ray_instance_gives_the_same_json(capsys):
    import ray
    argv = ("sweep", *TINY, "--ratios", "0.3,0.7", "--sim-path", "python", "--json")   # (workers load no kernels)
    serial = cli_json(capsys, *argv, "--jobs", "1")
    try:
        on_ray = cli_json(capsys, *argv, "--jobs", "2", "--ray-address", "local")
        kept = []
        assert run_all(square, range(3), ray_address="local", on_result=lambda i, v: kept.append((i, v))) == [0, 1, 4]
        assert sorted(kept) == [(0, 0), (1, 1), (2, 4)]
        with pytest.raises(HelmInputError, match="sweep ratio 0.35 failed: ratio 0.35 is not allowed"):
            run_all(picky, [0.1, 0.35], names=["sweep ratio 0.1", "sweep ratio 0.35"], ray_address="local")
    finally:
        ray.shutdown()
    assert same(on_ray) == same(serial)


def test_bench_sim_json_parses_strictly(capsys):
    code = main(["bench", "--sim", "--nodes", "2", "--routers", "least-loaded", "--duration", "1", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    r = json.loads(out, parse_constant=lambda name: pytest.fail(f"non-strict JSON constant {name}"))
    (row,) = r["rows"]
    assert row["nodes"] == 2 and row["router"] == "least-loaded" and row["requests"] > 0 and row["req_per_s"] > 0
    assert set(row["phase_share"]) == set(r["phases"]) and all(v >= 0 for v in row["phase_s"].values())
    assert sum(row["phase_share"].values()) == pytest.approx(1.0)
    assert row["setup_bytes_per_node"] > 0


def test_bench_sim_times_full_helm_and_every_compiled_step(capsys):
    """A row per policy; the compiled phase counts every call of the engine's step (full HELM's
    controller ticks every 10 ms: more than 100 in 1.2 s), not only the first, which goes
    through numba's dispatcher (CompiledRun.step calls the overload directly after it)."""
    code = main(["bench", "--sim", "--nodes", "2", "--routers", "helm", "--duration", "1.2", "--policies",
                 "static,helm", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    static, helm = json.loads(out)["rows"]
    assert (static["policy"], helm["policy"]) == ("static", "helm")
    assert static["sim_path"] == helm["sim_path"] == "compiled"
    assert helm["phase_calls"]["compiled"] > 100 and helm["phase_calls"]["windows_policy"] > 100
    assert static["phase_calls"]["compiled"] < helm["phase_calls"]["compiled"]


def test_bench_sim_table_by_path(capsys):
    """The table (not only --json) for both per-request paths: a row each, the path named."""
    code = main(["bench", "--sim", "--nodes", "2", "--routers", "least-loaded", "--duration", "1",
                 "--sim-path", "python,compiled"])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert len(rows) == 2 and "python" in rows[0] and "compil" in rows[1]
