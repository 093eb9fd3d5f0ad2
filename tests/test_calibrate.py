import json
import subprocess
import sys
from pathlib import Path

from types import SimpleNamespace

import pytest
import torch

from helmgr.cli import main
from helmgr.core.costs import CostModel
from helmgr.core.errors import HelmInputError
from helmgr.core.records import NodeConfig
from helmgr.core.profiles import MIB, NodeProfile, load_hardware, load_model, node_profile
from helmgr.real.calibrate import (CalibrateConfig, batch_shapes, batch_sizes, compute_shapes, fit_affine, fit_compute,
                                   fit_profiles)
from helmgr.real.calibrated_toml import model_path
from helmgr.real.measure import Measure
from helmgr.real.runtime import PAGE_MIB, NodeRuntime

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--n-items", "20000", "--pool-mib", "8", "--max-tokens", "256", "--candidates", "16",
        "--repeats", "3", "--warmup", "1"]


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- the fits, on made-up numbers ------------------------------------------------------------
def test_fit_affine_recovers_a_line_exactly():
    x = [64, 256, 1024, 4096]
    fit = fit_affine(x, [3e-6 + 2e-9 * v for v in x])
    assert fit.intercept == pytest.approx(3e-6, rel=1e-9) and fit.slope == pytest.approx(2e-9, rel=1e-9)


def test_fit_affine_never_returns_a_negative_fixed_cost():
    x, y = [1.0, 2.0, 4.0], [1.0, 2.1, 4.3]              # the line through them crosses zero at x > 0
    fit = fit_affine(x, y)
    r = [a / b for a, b in zip(x, y)]                      # through the origin, least relative error:
    assert fit.intercept == 0.0 and fit.slope == pytest.approx(sum(r) / sum(v * v for v in r), rel=1e-12)
    with pytest.raises(ValueError, match="positive times"):
        fit_affine([1, 2], [1.0, 0.0])
    with pytest.raises(ValueError, match="does not grow"):
        fit_affine([1, 2, 4], [3.0, 2.0, 1.0])


def test_fit_compute_recovers_achieved_flops_and_launch_overhead_from_cost_model_flops():
    model = CalibrateConfig().model_profile
    cost = CostModel.from_parts(load_hardware("a100-80g"), model)
    achieved, launch_s = 7.5e9, 40e-6
    flops = [cost.prefix_flops(p - c + n, c) + cost.candidate_flops(k, p + n)
             for p, c, n, k in compute_shapes(1024, 64)]
    seconds = [f / achieved + model.launches * launch_s for f in flops]
    got_flops, got_launch = fit_compute(flops, seconds, model.launches)
    assert got_flops == pytest.approx(achieved, rel=1e-9) and got_launch == pytest.approx(launch_s, rel=1e-9)


CONSTANTS = dict(hbm_bw=2e9, pcie_bw=10e9, miss_fixed=300e-6, host_row=500e-9, achieved=6e9, fixed=1.5e-3,
                 emb_fixed=200e-6, gemm_tflops=0.06, batch_efficiency=0.125, batch_half_rows=96.0, batch_request=300e-6)


class FakeMeasure:
    """`Measure`'s interface, answering with the times a device with `CONSTANTS` would give, so
    that calibration runs end to end without a timer and must hand the constants back."""

    def __init__(self, rt, repeats, warmup, seed):
        self.rt, self.c = rt, CONSTANTS

    def emb(self):
        row, c, ids = self.rt.pool.row_bytes, self.c, [64, 256, 1024, 4096]
        hit = [{"ids": n, "bytes": n * row, "s": c["emb_fixed"] + n * row / c["hbm_bw"]} for n in ids]
        miss = [{**h, "s": h["s"] + c["miss_fixed"] + n * (c["host_row"] + row / c["pcie_bw"])}
                for h, n in zip(hit, ids)]
        return hit, miss

    def h2d(self):
        return [{"bytes": b, "s": 2e-6 + b / self.c["pcie_bw"]} for b in (4 << 10, 1 << 20, 16 << 20)]

    def host_gather(self):
        return [{"rows": n, "s": 1e-6 + n * 1e-7} for n in (64, 256, 1024, 4096)]

    def gemm(self):
        return {"n": 1024, "s": 1.0, "tflops": self.c["gemm_tflops"]}

    def compute(self, shapes, cost, on_round):
        on_round()
        points = []
        for p, c, n, k in shapes:
            f = cost.prefix_flops(p - c + n, c) + cost.candidate_flops(k, p + n)
            points.append({"prefix_len": p, "cached": c, "new_tokens": n, "candidates": k, "flops": f,
                           "s": self.c["fixed"] + f / self.c["achieved"], "score_s": 0.0})
        return points

    def batches(self, shapes, sizes, cost, on_round):
        """Each batch: the fixed cost once, its FLOPs at the curve's rate for its rows, and each
        request beyond the first its own fixed cost."""
        on_round()
        c, points = self.c, []
        for p, cached, n, k in shapes:
            for b in sizes:
                rows, f = b * (p - cached + n + k), b * cost.request_flops(p - cached + n, cached, k)
                rate = c["gemm_tflops"] * 1e12 * c["batch_efficiency"] * rows / (rows + c["batch_half_rows"])
                points.append({"prefix_len": p, "cached": cached, "new_tokens": n, "candidates": k, "batch": b,
                               "rows": rows, "flops": f, "s": c["fixed"] + f / rate + (b - 1) * c["batch_request"]})
        return points


def assert_constants(hw, model):
    approx = lambda v: pytest.approx(v, rel=1e-6)
    assert hw.hbm_bw_gbs == approx(2.0) and hw.pcie_bw_gbs == approx(10.0)
    assert hw.pcie_latency_us == approx(300.0) and hw.host_lookup_ns == approx(500.0)
    assert hw.peak_tflops == approx(0.06) and hw.flops == approx(6e9)
    assert hw.launch_us * model.launches == approx(1500.0 + 200.0)      # compute + lookup fixed costs
    assert hw.batch_efficiency == approx(0.125) and hw.batch_half_rows == approx(96.0)
    assert hw.batch_request_us == approx(300.0)


def made_up_points(cfg: CalibrateConfig) -> dict:
    """Every measurement of a calibration, from the made-up device of FakeMeasure."""
    rt = SimpleNamespace(pool=SimpleNamespace(row_bytes=cfg.model_profile.row_bytes))
    m = FakeMeasure(rt, 1, 0, 0)
    cost = CostModel.from_parts(load_hardware("a100-80g"), cfg.model_profile)
    hit, miss = m.emb()
    return {"emb_hit": hit, "emb_miss": miss, "h2d": m.h2d(), "host_gather": m.host_gather(), "gemm": [m.gemm()],
            "compute": m.compute(compute_shapes(cfg.max_tokens, cfg.candidates), cost, lambda: None),
            "batch": m.batches(batch_shapes(cfg.max_tokens, cfg.candidates), batch_sizes(8), cost, lambda: None)}


def test_fit_profiles_recovers_every_constant_of_a_made_up_device():
    cfg = CalibrateConfig()
    points = made_up_points(cfg)
    hw, model, fits = fit_profiles(cfg, points, {"weights_gib": 1e-4})
    assert_constants(hw, model)
    assert fits["compute_fixed_us"] == pytest.approx(1500.0) and max(map(abs, fits["compute_fit_err"])) < 1e-9
    assert max(map(abs, fits["batch_fit_err"])) < 1e-9
    # on CPU the pool the simulator sees is the runtime's
    assert NodeProfile(hw, model).pool_budget_bytes == pytest.approx(cfg.pool_mib * MIB, abs=1)


def test_a_batch_faster_than_a_request_s_fixed_cost_is_named():
    cfg = CalibrateConfig()
    points = made_up_points(cfg)
    points["batch"][0]["s"] = 1e-3                       # under the 1.5 ms fixed cost
    with pytest.raises(HelmInputError, match="calibration of batched compute: a batch took 500 us less than"):
        fit_profiles(cfg, points, {"weights_gib": 1e-4})


# -- the command -----------------------------------------------------------------------------
def test_calibrate_writes_profiles_the_simulator_loads(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("helmgr.real.calibrate.Measure", FakeMeasure)
    out = tmp_path / "cpu.toml"
    code, stdout, err = run(capsys, "calibrate", "--device", "cpu", "--out", out, *TINY, "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["out"] == str(out) and summary["model_out"] == str(model_path(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu.model.toml", "cpu.toml"]
    hw, model = load_hardware(str(out)), load_model(str(model_path(out)))
    assert_constants(hw, model)                                          # exactly, through the TOML
    assert hw.name == "calibrated-cpu" and model.name == "small/16-fp32" and model.candidates == 16
    assert (model.dtype_bytes, model.emb_dtype_bytes, model.d_model) == (4, 4, 32)
    text = out.read_text()
    assert "Measured by `helmgr calibrate --device cpu`" in text and "small/16-fp32" in text
    assert "helmgr simulate --hardware cpu.toml --model cpu.model.toml" in text
    profile = node_profile(str(out), str(model_path(out)), page_mib=1 / 16)
    assert profile.pool_budget_bytes == pytest.approx(8 * MIB, abs=1)
    assert CostModel.from_profile(profile).breakdown(32, 32, 4, 16, 10).total_s > 0


def test_the_measurements_run_on_a_tiny_runtime():
    """The real timings (not their values: this machine's load is not ours to assert on)."""
    cfg = CalibrateConfig(n_items=20000, pool_mib=8, max_tokens=64, candidates=8)
    rt = NodeRuntime(NodeProfile(load_hardware("a100-80g"), cfg.model_profile, PAGE_MIB), 8 * MIB, "cpu", 0,
                     cfg.n_items, NodeConfig(ratio=0.3))
    m = Measure(rt, repeats=1, warmup=0, seed=0)
    hit, miss = m.emb()
    assert rt.pool.n_rows == 38 * 128                     # 38 of 128 pages of 64 KiB, 512-byte rows
    assert [p["ids"] for p in hit] == [p["ids"] for p in miss] == [19, 76, 304, 1216]   # up to a quarter
    assert rt.emb.lookups > 0 and rt.emb.misses >= sum(p["ids"] for p in miss)
    assert len(m.h2d()) == 4 and len(m.host_gather()) == 4 and m.gemm()["tflops"] > 0
    shapes, rounds = compute_shapes(64, 8), []
    points = m.compute(shapes, rt.cost, lambda: rounds.append(1))
    assert len(rounds) == 1
    assert [(p["prefix_len"], p["cached"], p["new_tokens"], p["candidates"]) for p in points] == shapes
    assert all(p["s"] > p["score_s"] > 0 for p in points + hit + miss if "score_s" in p)
    assert all(p["s"] > 0 for p in hit + miss)
    rt.check_integrity()


@pytest.mark.parametrize("argv,needle", [
    (["--device", "tpu"], "'--device': 'tpu'"),
    (["--out", "{tmp}/profile.txt"], "must end in .toml"),
    (["--out", "{tmp}/missing/cpu.toml"], "missing' does not exist"),
    (["--out", "{tmp}"], "is a folder"),
    (["--model", "huge"], "unknown model profile 'huge'"),
    (["--n-items", "100"], "--n-items must be >= "),
    (["--ratio", "0.99"], "'--ratio': 0.99"),
    (["--max-batch", "0"], "'--max-batch': 0"),
    (["--shrink", "3"], "--shrink 3: shrink factor must be >= 1 and divide"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(capsys, tmp_path, argv, needle):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "cpu.toml")]
    code, out, err = run(capsys, "calibrate", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_a_device_is_named(capsys, tmp_path):
    code, _, err = run(capsys, "calibrate", "--device", "cuda", "--out", tmp_path / "gpu.toml")
    assert code == 2 and "torch sees no CUDA device" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_the_bench_imports_neither_click_nor_rich_nor_numba():
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import bench_realpath; "
            "bad = [m for m in ('click', 'rich', 'numba') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src")}, check=True)
