"""The scenario check's properties (S1-S5) on hand-built runs whose answers are worked out by hand."""
import json

import numpy as np
import pytest

from helmgr.cli import main
from helmgr.experiments.scenario import BINS, PhaseRun, hist_quantile, properties

KINDS = ["steady", "burst", "steady", "burst"]          # 10 s each, 1 s windows
STEADY = {0.3: 0.010, 0.6: 0.008, 0.9: 0.012}           # every request's latency (s), by ratio
BURST = {0.3: 0.060, 0.6: 0.040, 0.9: 0.020}


def run(ratio: float) -> PhaseRun:
    hists = np.zeros((4, len(BINS) - 1), np.int64)
    lat = [STEADY[ratio] if k == "steady" else BURST[ratio] for k in KINDS]
    for p, x in enumerate(lat):
        hists[p, np.searchsorted(BINS, x, side="right") - 1] = 1000
    window_phase = np.repeat(np.arange(4), 10)
    load = np.where(np.isin(window_phase, [1, 3]) & (ratio == 0.9), 0.8, 0.5)
    summary = {"p99_ms": max(lat) * 1e3, "utilization": 0.5, "overloaded": False}
    return PhaseRun(ratio, summary, KINDS, hists, window_phase, np.repeat(lat, 10), load, 0.030)


def test_hist_quantile_within_a_bin():
    hist = np.zeros(len(BINS) - 1, np.int64)
    np.add.at(hist, np.searchsorted(BINS, np.linspace(0.001, 0.1, 10_000), side="right") - 1, 1)
    assert hist_quantile(hist, 0.99) == pytest.approx(np.percentile(np.linspace(0.001, 0.1, 10_000), 99), rel=0.005)
    assert np.isnan(hist_quantile(hist * 0, 0.99))


def test_properties_by_hand():
    p = properties([run(r) for r in (0.3, 0.6, 0.9)])
    assert p["S1"]["value"] == pytest.approx(60 / 20) and p["S1"]["pass"]          # worst 0.3 over best 0.9
    assert p["best_ratio_by_kind"] == {"steady": 0.6, "burst": 0.9}
    assert p["S2"]["value"] == pytest.approx(0.3) and p["S2"]["pass"]
    # at 0.6 the steady windows (8 ms) and at 0.9 the burst windows (20 ms) meet the 30-ms SLO; peak 0.8
    assert p["S3"]["value"] == 1.0 and p["S3"]["peak_utilization"] == pytest.approx(0.8) and p["S3"]["pass"]
    # at steady's best (0.6) both bursts run at 40 ms; at burst's best steady costs 12 / 8
    assert p["S4"]["value"] == 1.0 and p["S4"]["base_cost"] == pytest.approx(1.5, rel=0.01) and p["S4"]["pass"]
    # the single best (0.9) already serves the bursts at their best: its P99 is the stitch's (20 ms)
    assert p["S5"]["value"] == pytest.approx(1.0, rel=0.01) and not p["S5"]["pass"]
    assert p["S5"]["per_phase"] == pytest.approx(1.5, rel=0.01)
    per = properties([run(r) for r in (0.3, 0.6, 0.9)], s5="per-phase")
    assert per["S5"]["value"] == pytest.approx(1.5, rel=0.01) and per["S5"]["pass"]


def test_overloaded_burst_fails_s3():
    global BURST
    saved, BURST = BURST, {0.3: 0.060, 0.6: 0.045, 0.9: 0.035}      # over the SLO at every split
    try:
        p = properties([run(r) for r in (0.3, 0.6, 0.9)])
    finally:
        BURST = saved
    assert p["S3"]["by_kind"]["burst"]["window_slo"] == 0.0 and not p["S3"]["pass"]


def test_a_burst_beyond_the_provisioned_peak_is_reported_apart_from_s3():
    """The second burst at 0.9 runs at 35 ms (over the 30-ms SLO) with a peak utilization of 0.9:
    beyond the provisioned 0.85, so S3 counts the first burst alone (its windows all meet the SLO,
    peak 0.8) and reports the second apart; S1-S3 are gated, S4 and S5 reported."""
    runs = [run(r) for r in (0.3, 0.6, 0.9)]
    last = runs[2]
    lat = last.window_p99_s.copy()
    lat[30:40] = 0.035
    load = last.window_load.copy()
    load[30:40] = 0.9
    runs[2] = PhaseRun(0.9, last.summary, KINDS, last.hists, last.window_phase, lat, load, last.slo_s)
    p = properties(runs)
    burst = p["S3"]["by_kind"]["burst"]
    assert (burst["window_slo"], burst["phases"], burst["beyond_provisioned"], burst["beyond_window_slo"]) == (
        1.0, 1, 1, 0.0)
    assert p["S3"]["peak_utilization"] == pytest.approx(0.8) and p["S3"]["pass"]
    assert [p[s]["gated"] for s in ("S1", "S2", "S3", "S4", "S5")] == [True, True, True, False, False]


def test_scenario_check_cli_end_to_end(capsys):
    rc = main(["scenario", "--check", "--workloads", "burst", "--seeds", "1", "--ratios", "0.3,0.8",
               "--duration", "90", "--rps", "150", "--nodes", "2", "--jobs", "1", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    seed = out["regimes"]["burst"]["seeds"]["1"]
    assert seed["ratios"] == [0.3, 0.8] and set(seed["p99_ms_by_kind"]) == {"steady", "burst"}
    assert set(out["regimes"]["burst"]["summary"]) == {"S1", "S2", "S3", "S4", "S5"}
    assert all(isinstance(v["pass"], bool) for v in out["regimes"]["burst"]["summary"].values())


def test_scenario_check_bad_input(capsys):
    assert main(["scenario", "--check", "--seeds", "x"]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert main(["scenario", "--check", "--ratios", "0.5"]) == 2
