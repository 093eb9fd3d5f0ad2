"""The phase oracle (docs/concepts.md): the block fit, its guards, the per-policy figures by hand, and a
tiny simulated run (serial and parallel replays agree)."""
import dataclasses

import numpy as np
import pytest

from helmgr.experiments.block_fit import BlockFit, fit_block
from helmgr.experiments.phase_oracle import (PhaseOracleResult, band_distance, block_arrivals, figures, held,
                                             horizon_in_phase, in_phase_band_distance, oracle_blocks,
                                             oracle_distance, regret, run_phase_oracle)
from helmgr.sim import SimConfig
from helmgr.sim.metrics import window_ratios
from helmgr.workload import Phase, default_config, synthetic_workload

GRID = np.round(np.arange(1, 10) * 0.1, 10)          # 0.1 .. 0.9


# -- the fit -------------------------------------------------------------------------------------
def slow_convex_regression(x, y):
    """Every set of second-difference constraints held with equality, the best feasible fit."""
    n = len(x)
    slope = lambda f: np.diff(f) / np.diff(x)                          # noqa: E731
    rows = np.array([np.eye(n - 1)[k + 1] - np.eye(n - 1)[k] for k in range(n - 2)]) @ (
        np.diff(np.eye(n), axis=0) / np.diff(x)[:, None])             # second differences: rows @ f >= 0
    best = None
    for mask in range(1 << (n - 2)):
        tight = rows[[k for k in range(n - 2) if mask >> k & 1]]
        if len(tight):                                                # least squares on {f: tight f = 0}
            _, _, vt = np.linalg.svd(tight)
            basis = vt[len(tight):].T
            f = basis @ np.linalg.lstsq(basis, y, rcond=None)[0]
        else:
            f = y.copy()
        if np.all(np.diff(slope(f)) >= -1e-9) and (best is None or np.sum((f - y) ** 2) < np.sum((best - y) ** 2)):
            best = f
    return best


def test_convex_regression_matches_a_slow_reference():
    from helmgr.experiments.block_fit import convex_regression
    np.testing.assert_allclose(convex_regression(np.array([0.0, 1, 2]), np.array([0.0, 1, 0])), [1 / 3] * 3)
    rng = np.random.default_rng(0)
    for _ in range(40):
        x = np.sort(rng.choice(np.arange(0.05, 1.0, 0.05), rng.integers(3, 8), replace=False))
        y = rng.normal(size=len(x))
        np.testing.assert_allclose(convex_regression(x, y), slow_convex_regression(x, y), atol=1e-9)


@pytest.mark.parametrize("fit", ["convex", "quadratic"])
def test_a_curve_quadratic_in_log_p99_is_fitted_exactly(fit):
    # log P99 = log 10 + 4 (r - 0.62)^2 (convex: the parabola through the fit at 0.5, 0.6, 0.7 is
    # this one); within 2 % where 4 (r - 0.62)^2 <= log 1.02
    got = fit_block(GRID, 10 * np.exp(4 * (GRID - 0.62) ** 2), current=0.5, fit=fit)
    half = np.sqrt(np.log(1.02) / 4)                   # 0.07036
    assert got.kind == fit
    assert got.r_star == pytest.approx(0.62, abs=1e-9)
    assert (got.band_lo, got.band_hi) == pytest.approx((0.62 - half, 0.62 + half), abs=2e-4)
    np.testing.assert_allclose(got.fitted_ms, 1e4 * np.exp(4 * (GRID - 0.62) ** 2), rtol=1e-9)


@pytest.mark.parametrize("fit", ["convex", "quadratic"])
def test_a_convex_curve_in_p99_has_its_argmin_and_band_near_the_true_ones(fit):
    # P99 = 10 + 40 (r - 0.62)^2: the true band is 40 (r - 0.62)^2 <= 0.2, r in 0.62 -+ 0.0707
    got = fit_block(GRID, 10 + 40 * (GRID - 0.62) ** 2, current=0.5, fit=fit)
    assert got.r_star == pytest.approx(0.62, abs=0.01)
    assert got.band_lo == pytest.approx(0.62 - np.sqrt(0.005), abs=0.02)
    assert got.band_hi == pytest.approx(0.62 + np.sqrt(0.005), abs=0.02)


def test_the_convex_fit_follows_an_asymmetric_curve_the_quadratic_misses():
    # a slow slope down to 0.6, a wall after it (the shape of a measured steady block)
    grid = np.round(np.arange(1, 20) * 0.05, 10)
    p99 = np.where(grid <= 0.6, 14 - 8 * grid, 9.2 + 30 * (grid - 0.6))
    assert fit_block(grid, p99, 0.5).r_star == pytest.approx(0.6, abs=0.025)
    assert fit_block(grid, p99, 0.5, "quadratic").r_star < 0.55


@pytest.mark.parametrize("fit", ["convex", "quadratic"])
def test_noise_moves_the_fitted_argmin_less_than_the_raw_one(fit):
    rng = np.random.default_rng(0)
    raw, fitted = [], []
    for _ in range(200):
        p99 = (10 + 40 * (GRID - 0.62) ** 2) * np.exp(rng.normal(0, 0.02, len(GRID)))
        raw.append(GRID[np.argmin(p99)])
        fitted.append(fit_block(GRID, p99, 0.5, fit).r_star)
    assert np.std(fitted) < 0.8 * np.std(raw)


@pytest.mark.parametrize("fit", ["convex", "quadratic"])
def test_a_vertex_past_the_grid_is_clamped_and_its_band_hand_computed(fit):
    # log P99 = 4 (r - 1.2)^2: the minimum over the grid is at 0.9; the band is where
    # 4 (r - 1.2)^2 <= 4 * 0.09 + log 1.02, r >= 1.2 - sqrt(0.09 + log(1.02) / 4) = 0.89186
    got = fit_block(GRID, np.exp(4 * (GRID - 1.2) ** 2), current=0.1, fit=fit)
    assert got.r_star == 0.9 and got.band_hi == 0.9
    # the convex fit is linear between 0.8 and 0.9: 4 (0.16 - 0.09) x (0.9 - r) / 0.1 <= log 1.02
    lo = 0.9 - np.log(1.02) / 2.8 if fit == "convex" else 1.2 - np.sqrt(0.09 + np.log(1.02) / 4)
    assert got.band_lo == pytest.approx(lo, abs=2e-4)


def test_a_concave_quadratic_takes_its_best_grid_point():
    got = fit_block(GRID, np.exp(-4 * (GRID - 0.45) ** 2), current=0.5, fit="quadratic")   # a hill
    assert got.kind == "concave" and got.r_star == 0.9                 # 0.9 is farther from 0.45
    assert got.band_hi == 0.9 and got.band_lo < 0.9


def test_the_convex_fit_of_a_hill_is_a_line_to_its_lower_end():
    got = fit_block(GRID, np.exp(-4 * (GRID - 0.4) ** 2), current=0.5)
    assert got.kind == "convex" and got.r_star == 0.9


@pytest.mark.parametrize("fit", ["convex", "quadratic"])
def test_a_flat_curve_keeps_the_current_ratio(fit):
    got = fit_block(GRID, np.full(len(GRID), 0.01), current=0.4, fit=fit)
    assert got.r_star == pytest.approx(0.4)
    assert (got.band_lo, got.band_hi) == (0.1, 0.9)


@pytest.mark.parametrize("p99,current,r,band", [
    ([0.020, 0.010], 0.5, 0.9, (0.9, 0.9)),                    # two points: the raw argmin
    ([0.010, 0.0101], 0.1, 0.1, (0.1, 0.9)),                   # ... its band: neighbours within 2 %
    ([0.010, 0.010], 0.8, 0.9, (0.1, 0.9)),                    # a tie: the nearer to the current ratio
])
def test_fewer_than_three_points_take_the_raw_argmin(p99, current, r, band):
    got = fit_block([0.1, 0.9], p99, current)
    assert got.kind == "raw" and got.r_star == r and (got.band_lo, got.band_hi) == band


def test_an_empty_block_keeps_the_current_ratio():
    got = fit_block(GRID, np.full(len(GRID), np.inf), current=0.35)
    assert got.kind == "empty" and got.r_star == got.band_lo == got.band_hi == 0.35


def test_inf_points_are_left_out_of_the_fit():
    p99 = 10 * np.exp(4 * (GRID - 0.62) ** 2)
    p99[[0, 8]] = np.inf
    assert fit_block(GRID, p99, 0.5).r_star == pytest.approx(0.62, abs=1e-9)


# -- blocks and their arrivals -----------------------------------------------------------------
def test_phases_are_cut_into_equal_blocks_of_at_most_block_s():
    phases = (Phase(0.0, 25.0, "steady"), Phase(25.0, 30.0, "burst"))
    got = oracle_blocks(phases, 10.0)
    assert [(round(b.start, 6), round(b.end, 6), b.kind) for b in got] == [
        (0.0, 8.333333, "steady"), (8.333333, 16.666667, "steady"), (16.666667, 25.0, "steady"), (25.0, 30.0, "burst")]
    assert oracle_blocks(phases, None) == phases


def test_block_arrivals_cut_the_stream_at_the_blocks_ends():
    w = synthetic_workload(default_config("steady", rps=200, duration_s=4, n_users=5_000, n_items=20_000,
                                          n_clusters=4), 0)
    blocks = (Phase(0.0, 1.5, "a"), Phase(1.5, 1.7, "b"), Phase(1.7, 4.0, "c"))
    whole = list(w.chunks(1.0))
    per_block = list(block_arrivals(w, blocks))
    for b, pieces in zip(blocks, per_block):
        t = np.concatenate([p.t for p in pieces])
        assert ((t >= b.start) & (t < b.end)).all()
    pieces = [p for ps in per_block for p in ps]
    np.testing.assert_array_equal(np.concatenate([p.t for p in pieces]), np.concatenate([c.t for c in whole]))
    flat = [np.concatenate([p.items(i) for p in pieces for i in range(len(p))]),
            np.concatenate([p.candidates(i) for p in pieces for i in range(len(p))])]
    np.testing.assert_array_equal(flat[0], np.concatenate([c.item_ids for c in whole]))
    np.testing.assert_array_equal(flat[1], np.concatenate([c.cand_ids for c in whole]))


# -- the per-policy figures, by hand -------------------------------------------------------------
def hand_oracle() -> PhaseOracleResult:
    """Two 2-s blocks: r* 0.3 in [0.2, 0.4], then r* 0.7 in [0.6, 0.8]; the oracle's P99 10 ms; no
    lookahead."""
    fits = (BlockFit(0.3, 0.2, 0.4, "quadratic"), BlockFit(0.7, 0.6, 0.8, "quadratic"))
    blocks = (Phase(0.0, 2.0, "steady"), Phase(2.0, 4.0, "burst"))
    return PhaseOracleResult({"p99_ms": 10.0}, None, blocks, fits, np.array([0.1, 0.9]), np.zeros((2, 2)), None,
                             lookahead_s=0.0)


def test_distances_and_regret_by_hand():
    o = hand_oracle()
    # node 0 holds 0.5; node 1 starts at 0.5 (then 0.5 again at t=0: the later one counts) and moves
    # to 0.9 at t=2.5. Window means: 0.5, 0.5, (0.5 + 0.7) / 2 = 0.6, 0.7
    timeline = [(0.0, 0, 0.5), (0.0, 1, 0.1), (0.0, 1, 0.5), (2.5, 1, 0.9)]
    # |r - r*|: 0.2, 0.2, 0.1, 0.0; from the band: 0.1, 0.1, 0.0 (0.6 is its edge), 0.0
    assert oracle_distance(timeline, 2, 4.0, o) == pytest.approx(0.5 / 4)
    assert band_distance(timeline, 2, 4.0, o) == pytest.approx(0.2 / 4)
    assert regret(12.0, o) == pytest.approx(0.2)
    assert regret(float("nan"), o) is None
    # no lookahead and no reaction allowance: every block is judged in its own phase, so both band
    # distances agree
    assert figures(held(0.35, 2), 2, 4.0, o, 10.0, react_s=0.0) == pytest.approx(
        {"oracle_distance": (0.05 * 2 + 0.35 * 2) / 4, "band_distance": 0.25 * 2 / 4,
         "band_distance_in_phase": 0.25 * 2 / 4, "regret": 0.0})
    # the 20-s reaction allowance leaves out the burst block (it starts at the change): 0.35 is
    # inside the steady block's band
    assert figures(held(0.35, 2), 2, 4.0, o, 10.0)["band_distance_in_phase"] == 0.0


def test_in_phase_band_distance_leaves_out_blocks_judged_on_the_next_phase():
    o = dataclasses.replace(hand_oracle(), lookahead_s=2.0)
    # the steady block's 2-s horizon takes in the burst block; the burst block's is itself
    assert o.in_phase(react_s=0.0).tolist() == [False, False, True, True]
    # held 0.35: 0.25 from the burst's band in both of its windows, 0 in the steady block's
    f = figures(held(0.35, 2), 2, 4.0, o, 10.0, react_s=0.0)
    assert f["band_distance"] == pytest.approx(0.25 * 2 / 4) and f["band_distance_in_phase"] == pytest.approx(0.25)
    # held 0.5: 0.1 in each steady window (left out) and in each burst window (kept)
    assert figures(held(0.5, 2), 2, 4.0, o, 10.0, react_s=0.0)["band_distance_in_phase"] == pytest.approx(0.1)
    assert in_phase_band_distance([0.5, 0.5], [0.2, 0.2], [0.4, 0.4], [False, False]) is None


def test_horizon_in_phase_looks_as_far_as_the_lookahead():
    kinds = ["feed"] * 4 + ["discovery"] * 3 + ["feed"]
    blocks = [Phase(10.0 * k, 10.0 * (k + 1), kind) for k, kind in enumerate(kinds)]
    assert horizon_in_phase(blocks, 0.0, 0.0).all()
    # 25 s reaches the two blocks after: the two before each change are out
    assert horizon_in_phase(blocks, 25.0, 0.0).tolist() == [True, True, False, False, True, False, False, True]
    # a 15-s reaction allowance: also out, the two blocks starting 0 and 10 s after each change (40 s, 70 s)
    assert horizon_in_phase(blocks, 0.0, 15.0).tolist() == [True, True, True, True, False, False, True, False]
    assert horizon_in_phase(blocks, 25.0, 15.0).tolist() == [True, True, False, False, False, False, False, False]
    # by default (20 s): the blocks starting 0 and 10 s after each change are out, as with 15 s
    assert horizon_in_phase(blocks, 30.0).tolist() == horizon_in_phase(blocks, 30.0, 20.0).tolist()
    assert horizon_in_phase(blocks, 0.0).tolist() == [True, True, True, True, False, False, True, False]


def test_per_window_takes_the_block_of_the_windows_middle():
    star, lo, hi = hand_oracle().per_window()
    assert star.tolist() == [0.3, 0.3, 0.7, 0.7] and lo.tolist() == [0.2, 0.2, 0.6, 0.6]


# -- a tiny simulated run ------------------------------------------------------------------------
TINY = dict(rps=300, duration_s=12, n_users=20_000, n_items=50_000, n_clusters=8)
SMALL_GRID = [0.2, 0.5, 0.8]


@pytest.fixture(scope="module")
def tiny():
    w = synthetic_workload(default_config("steady", **TINY), 0)
    return run_phase_oracle(SimConfig(nodes=2, warmup_s=0), w, SMALL_GRID, jobs=1, block_s=5.0)


def test_the_oracle_gives_r_star_per_block_and_a_stitched_summary(tiny):
    assert [(b.start, b.end) for b in tiny.blocks] == [(0.0, 4.0), (4.0, 8.0), (8.0, 12.0)]
    assert tiny.grid_p99.shape == (3, 3) and np.isfinite(tiny.grid_p99).all()
    assert ((0.2 <= tiny.r_star) & (tiny.r_star <= 0.8)).all()
    s = tiny.summary
    assert s["policy"] == "oracle" and s["completed"] == s["requests"] > 0 and s["oracle_blocks"] == 3
    assert s["regret"] == 0.0 and s["band_distance"] == pytest.approx(0.0, abs=1e-3)
    # it follows r* to within a page of the pool
    assert s["oracle_distance"] < 1e-3
    r = window_ratios(tiny.series.timeline, 2, 12.0)
    np.testing.assert_allclose(r, np.repeat(tiny.r_star, 4), atol=1e-3)
    assert [row["r_star"] for row in tiny.block_table()] == tiny.r_star.tolist()


def test_the_stitched_run_starts_at_its_first_blocks_ratio(tiny):
    at_zero = [(node, r) for t, node, r in tiny.series.timeline if t == 0.0]
    pages = tiny.cluster.nodes[0].pool.total_pages
    assert len(at_zero) == 2 and all(r == pytest.approx(tiny.r_star[0], abs=1 / pages) for _, r in at_zero)
    assert tiny.summary["ratio"] == tiny.r_star[0]


def test_an_unknown_fit_is_refused():
    from helmgr.core.errors import HelmInputError
    w = synthetic_workload(default_config("steady", **TINY), 0)
    with pytest.raises(HelmInputError, match="unknown oracle fit 'cubic'"):
        run_phase_oracle(SimConfig(nodes=2), w, SMALL_GRID, fit="cubic")


def test_parallel_replays_agree_with_serial(tiny):
    w = synthetic_workload(default_config("steady", **TINY), 0)
    par = run_phase_oracle(SimConfig(nodes=2, warmup_s=0), w, SMALL_GRID, jobs=2, block_s=5.0)
    np.testing.assert_array_equal(par.grid_p99, tiny.grid_p99)
    np.testing.assert_array_equal(par.r_star, tiny.r_star)
    assert par.summary["p99_ms"] == tiny.summary["p99_ms"]


def test_compare_reports_the_phase_oracles_figures_and_its_steady_check():
    from helmgr.experiments.compare import compare, oracle_check
    from helmgr.experiments.phase_oracle import common_band
    from helmgr.workload import WorkloadSpec
    spec = WorkloadSpec("steady", duration_s=4, rps=300)
    c = compare(spec, {"prefix-aware": SimConfig(nodes=2, warmup_s=0)}, ["static", "static-best", "oracle"], SMALL_GRID)
    rows = {r["policy"]: r for r in c.rows}
    assert list(rows) == ["static", "static-best", "oracle"]
    oracle = c.oracles["prefix-aware"]
    assert len(c.r_star) == 4 and oracle.lookahead_s == 30.0
    for r in rows.values():
        assert {"oracle_distance", "band_distance", "band_distance_in_phase", "regret", "held_oracle_distance"} <= set(r)
        assert r["regret"] == pytest.approx(r["p99_ms"] / rows["oracle"]["p99_ms"] - 1)
    static = rows["static"]                                           # holds 0.5 on both nodes
    star, lo, hi = oracle.per_window()
    assert static["oracle_distance"] == pytest.approx(np.mean(np.abs(0.5 - star)))
    assert static["band_distance"] == pytest.approx(np.mean(np.maximum(np.maximum(lo - 0.5, 0.5 - hi), 0)))
    assert rows["oracle"]["regret"] == 0.0
    # the steady check: the splits inside every block's band, static-best's regret against 1 %
    check = oracle_check(c)["prefix-aware"]
    assert check["common_band"] == common_band(oracle, 0.0)
    assert check["static_best_regret"] == rows["static-best"]["regret"]
    assert check["pass"] == (check["common_band"] is not None and check["static_best_regret"] <= 0.01)


def test_common_band_is_the_bands_overlap_after_the_warm_up():
    """Three blocks with bands [0.3, 0.7], [0.5, 0.9], [0.6, 0.8]: after 10 s they share
    [0.6, 0.8]; from 0 s [0.6, 0.7]; a block with band [0.1, 0.2] leaves no split in all."""
    from types import SimpleNamespace as NS
    from helmgr.experiments.phase_oracle import common_band
    from helmgr.workload import Phase
    blocks = tuple(Phase(10.0 * k, 10.0 * (k + 1), "steady") for k in range(3))
    fits = tuple(NS(band_lo=lo, band_hi=hi) for lo, hi in ((0.3, 0.7), (0.5, 0.9), (0.6, 0.8)))
    o = NS(blocks=blocks, fits=fits)
    assert common_band(o, 10.0) == [0.6, 0.8] and common_band(o, 0.0) == [0.6, 0.7]
    assert common_band(NS(blocks=blocks, fits=fits[:2] + (NS(band_lo=0.1, band_hi=0.2),)), 0.0) is None


def test_lookahead_horizon_spans_the_blocks_ending_within_it():
    from helmgr.experiments.phase_oracle import _with_horizon
    from helmgr.workload import Phase
    blocks = [Phase(10.0 * k, 10.0 * (k + 1), "steady") for k in range(5)]
    arrivals = [[f"b{k}"] for k in range(5)]
    got = [(b.start, pieces, horizon) for b, pieces, horizon in _with_horizon(blocks, arrivals, 25.0)]
    assert got == [(0.0, ["b0"], ["b0", "b1", "b2"]), (10.0, ["b1"], ["b1", "b2", "b3"]),
                   (20.0, ["b2"], ["b2", "b3", "b4"]), (30.0, ["b3"], ["b3", "b4"]), (40.0, ["b4"], ["b4"])]
    assert [h for _, _, h in _with_horizon(blocks, arrivals, 0.0)] == arrivals


@pytest.mark.parametrize("router,regime", [("least-loaded", "steady"), ("helm", "burst"), ("prefix-aware", "trend")])
def test_the_compiled_path_replays_the_oracle_as_the_python_path_does(router, regime):
    """Every replay (forks of a cluster mid-run on the compiled path) and the stitched run give
    the same P99s, r* and summary on either path, with lookahead (a replay runs past its block)."""
    w = synthetic_workload(default_config(regime, **(TINY | dict(duration_s=16))), 2)
    runs = {}
    for path in ("python", "auto"):
        cfg = SimConfig(nodes=3, router=router, seed=2, warmup_s=0, path=path)
        runs[path] = run_phase_oracle(cfg, w, SMALL_GRID, jobs=1, block_s=5.0, lookahead_s=5.0)
    py, comp = runs["python"], runs["auto"]
    assert comp.cluster.path == "compiled" and py.cluster.path == "python"
    np.testing.assert_array_equal(comp.grid_p99, py.grid_p99)
    np.testing.assert_array_equal(comp.r_star, py.r_star)
    skip = {"wall_s", "sim_path"}
    assert {k: v for k, v in comp.summary.items() if k not in skip} == {k: v for k, v in py.summary.items() if k not in skip}
