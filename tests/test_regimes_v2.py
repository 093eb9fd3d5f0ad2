"""The regimes: phases, trend's moving mix, burst's trending events, and the default settings
(the steady stream kept bit for bit)."""
import hashlib
from collections import Counter

import numpy as np
import pytest

from helmgr.core.errors import HelmInputError
from helmgr.workload import REGIMES, Phase, SyntheticConfig, WorkloadSpec, default_config, describe, synthetic_workload
from helmgr.workload.arrivals import SessionShape, burst_schedule, session_starts
from helmgr.workload.phases import Plateaus, blocks, carve, whole

TINY = dict(n_items=1000, n_clusters=1, n_users=2000, rps=100.0, candidates=4)
SMALL = dict(n_items=64_000, n_clusters=16, n_users=200_000, rps=400.0, candidates=16)
FIELDS = ("t", "user", "prefix_len", "new_tokens", "item_ids", "item_offsets", "cand_ids", "cand_offsets", "burst")

# sha256 of every chunk's arrays, in order, recorded from the first version's code: a steady
# stream of 30 s at 2,400 req/s over 1 M items, seed 1 (the generator has kept it bit for bit)
STEADY_DIGEST = "8dfeb531c4126764a3f32e5373cef947e9f6a0451a77d367d1e99bc677ebefc3"


def digest(w) -> str:
    h = hashlib.sha256()
    for c in w.chunks():
        for f in FIELDS:
            h.update(np.ascontiguousarray(getattr(c, f)).tobytes())
    return h.hexdigest()


def arrays(w, *fields):
    chunks = list(w.chunks())
    return [np.concatenate([getattr(c, f) for c in chunks]) for f in fields]


# -- defaults -------------------------------------------------------------------------------

def test_the_steady_stream_is_the_first_versions_bit_for_bit():
    w = synthetic_workload(SyntheticConfig(duration_s=30.0, rps=2400.0, n_items=1_000_000), 1)
    assert digest(w) == STEADY_DIGEST


def test_default_settings():
    assert REGIMES == ("steady", "trend", "burst")
    burst = default_config("burst")
    assert burst == SyntheticConfig(regime="burst") and (burst.duration_s, burst.rps, burst.n_items) == (
        360.0, 1300.0, 2_000_000)
    trend = default_config("trend")
    assert (trend.rps, trend.trend_phase_s) == (2200.0, 120.0)
    assert default_config("trend", rps=10.0).rps == 10.0 and default_config("trend+burst").rps == 2200.0
    with pytest.raises(HelmInputError, match=r"unknown workload 'flash'"):
        synthetic_workload(default_config("flash"))


def test_workload_spec_builds_the_default_settings():
    w = WorkloadSpec("trend", rps=50.0).build()
    assert w.name == "trend" and w.duration_s == 360.0
    assert WorkloadSpec("burst", 20.0).build().duration_s == 20.0


# -- phases ---------------------------------------------------------------------------------

def test_phase_helpers_by_hand():
    assert carve(whole(100.0), [(10, 20), (50, 70)]) == (
        Phase(0, 10, "steady"), Phase(10, 20, "burst"), Phase(20, 50, "steady"), Phase(50, 70, "burst"),
        Phase(70, 100, "steady"))
    mix = Plateaus(60.0, 10.0, (0.05, 0.6))
    assert carve(mix.phases(150.0), [(55, 70)]) == (
        Phase(0, 55, "feed"), Phase(55, 70, "burst"), Phase(70, 120, "discovery"), Phase(120, 150, "feed"))
    assert blocks(25.0) == (Phase(0, 10, "block"), Phase(10, 20, "block"), Phase(20, 25, "block"))
    t = np.array([0, 59.9, 60, 65, 70, 119, 120, 125, 130])
    np.testing.assert_allclose(mix.level(t), [0.05, 0.05, 0.05, 0.325, 0.6, 0.6, 0.6, 0.325, 0.05])


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("regime", REGIMES + ("trend+burst",))
def test_phases_cover_the_run_contiguously(regime, seed):
    w = synthetic_workload(default_config(regime, **TINY), seed)
    p = w.phases
    assert p[0].start == 0.0 and p[-1].end == w.duration_s
    assert all(a.end == b.start for a, b in zip(p[:-1], p[1:])) and all(x.start < x.end for x in p)
    assert [(x.start, x.end) for x in p if x.kind == "burst"] == [(b.start, b.end) for b in w.bursts]
    kinds = {x.kind for x in p}
    if "trend" in regime:
        assert {"feed", "discovery"} <= kinds <= {"feed", "discovery", "burst"}
    else:
        assert kinds <= {"steady", "burst"}


# -- burst ----------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [1, 2, 3])
def test_burst_v2_events(seed):
    bursts = synthetic_workload(default_config("burst", **TINY), seed).bursts
    assert len(bursts) >= 2
    assert all(20.0 <= b.end - b.start <= 90.0 and 1.5 <= b.mult <= 3.0 for b in bursts)
    assert 30.0 <= bursts[0].start <= 60.0 and bursts[-1].end <= 360.0


def test_burst_v2_schedule_always_fits_two():
    """First start <= 60 s, so the first burst ends by 150 s and the second starts by 300 s; a
    last burst is cut at the run's end if 20 s of it fit."""
    cfg = SyntheticConfig()
    for seed in range(300):
        bursts = burst_schedule(np.random.default_rng([seed, 2]), 360.0, cfg.burst_every_s, cfg.burst_len_s,
                                cfg.burst_mult, 1000, first_s=cfg.burst_first_s, clip=True)
        assert len(bursts) >= 2 and all(20.0 <= b.end - b.start <= 90.0 for b in bursts) and bursts[-1].end <= 360.0


def test_burst_rate_is_mult_times_the_base():
    w = synthetic_workload(default_config("burst", **(SMALL | dict(candidates=4))), seed=1)
    t, burst = arrays(w, "t", "burst")
    for b in w.bursts:
        inside = (t >= b.start) & (t < b.end)
        length = b.end - b.start
        extra = (b.mult - 1.0) * 400.0 * length
        assert abs((inside & burst).sum() - extra) < 4 * np.sqrt(extra)       # Poisson, one request a session
        assert inside.sum() / length == pytest.approx(b.mult * 400.0, rel=0.1)
    assert not burst[~np.any([(t >= b.start) & (t < b.end) for b in w.bursts], axis=0)].any()


# -- trend ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trend():
    knobs = SMALL | dict(rps=2400.0, candidates=4, trend_phase_s=60.0)
    w = synthetic_workload(default_config("trend", **knobs), seed=1)
    return (w, *arrays(w, "t", "user", "discovery", "burst"))


def test_trend_discovery_share_follows_the_plateaus(trend):
    w, t, user, discovery, burst = trend
    assert not burst.any() and not w.bursts
    assert [p.kind for p in w.phases] == ["feed", "discovery"] * 3
    for p in w.phases:
        plateau = (t >= p.start + (10.0 if p.start else 0.0)) & (t < p.end)
        share = 0.05 if p.kind == "feed" else 0.6
        assert discovery[plateau].mean() == pytest.approx(share, abs=0.01)
    assert np.mean(user[discovery] >= 200_000) == pytest.approx(0.9, abs=0.01)     # mostly new users


def test_trend_rate_follows_the_diurnal_curve(trend):
    """rate = 2400 (1 - 0.4 cos(2 pi t / 360)): about 0.6 x 2400 over [0, 30) and 1.4 x 2400 over
    [165, 195)."""
    _, t, *_ = trend
    curve = lambda a, b: np.mean(1.0 - 0.4 * np.cos(2 * np.pi * np.linspace(a, b, 10_001) / 360.0))
    low, high = np.mean((t >= 0) & (t < 30)) * len(t) / 30, np.mean((t >= 165) & (t < 195)) * len(t) / 30
    assert low == pytest.approx(2400 * curve(0, 30), rel=0.05)
    assert high == pytest.approx(2400 * curve(165, 195), rel=0.05)
    assert high / low == pytest.approx(curve(165, 195) / curve(0, 30), rel=0.06)
    assert high / low == pytest.approx(1.4 / 0.6, rel=0.08)      # the windows' means: 2.26


def test_discovery_candidates_lean_on_their_phase_set():
    """16 candidates, share 0.2 -> 0.5 across each phase: 3 trending candidates at a phase's start
    (rint 3.2), 8 at its end."""
    w = synthetic_workload(default_config("trend+burst", **SMALL), seed=1)
    checked = 0
    for c in w.chunks():
        for i in np.flatnonzero(c.discovery)[:5]:
            assert not c.burst[i]
            e = next(e for e in w.events if e.lean == "discovery" and e.start <= c.t[i] < e.end)
            k = int(np.rint((0.2 + 0.3 * (c.t[i] - e.start) / (e.end - e.start)) * 16))
            inside = (c.candidates(i) - e.trend_start) % w.n_items < w.trending.items
            assert inside[:k].all()
            checked += 1
    assert checked > 1000
    assert [e.lean for e in w.events].count("burst") == len(w.bursts) >= 2


def test_the_hot_set_turns_over_across_discovery_phases():
    w = synthetic_workload(default_config("trend", **(SMALL | dict(trend_phase_s=60.0))), seed=1)
    counts = np.zeros((6, w.n_items), np.int64)
    for c in w.chunks():
        rows = np.repeat(np.minimum((c.t // 60).astype(int), 5), np.diff(c.cand_offsets))
        np.add.at(counts, (rows, c.cand_ids), 1)
    hot = [set(np.argsort(-row, kind="stable")[:1000].tolist()) for row in counts]
    kept = lambda a, b: len(hot[a] & hot[b]) / 1000
    assert kept(1, 3) < kept(0, 2) - 0.2 and kept(3, 5) < kept(2, 4) - 0.2


def test_session_starts_give_the_target_request_rate():
    shape = SessionShape(12.0, 3.0, 4.0)
    constant = session_starts(lambda t: np.full(np.shape(t), 600.0), shape)
    np.testing.assert_allclose(constant(np.array([-5.0, 0.0, 100.0])), 50.0, rtol=1e-9)


def test_describe_reports_phases_and_discovery_share():
    w = synthetic_workload(default_config("trend+burst", **TINY), seed=1)
    s, _ = describe(w.chunks(), w.duration_s, w.n_items, phases=w.phases)
    assert s["phases"] == dict(Counter(p.kind for p in w.phases)) and s["phases"]["burst"] == len(w.bursts) >= 2
    assert set(s["phase_rps"]) == set(s["phase_discovery_share"]) == {"burst", "discovery", "feed"}
    assert 0.2 < s["discovery_share"] < 0.45
    assert s["phase_discovery_share"]["discovery"] > 0.4 > 0.15 > s["phase_discovery_share"]["feed"]
    assert s["phase_rps"]["burst"] > 1.3 * s["phase_rps"]["feed"]


def test_a_compressed_regime_keeps_its_whole_shape():
    """Twice shorter: 180 s, trend's phases 60 s (feed, discovery, feed) with 5-s ramps, the day
    the run; the bursts' first start in 15-30 s, gaps 50 s x U(0.5, 1.5), lengths 10-45 s."""
    trend = default_config("trend").compressed(2.0)
    assert (trend.duration_s, trend.trend_phase_s, trend.trend_ramp_s, trend.day) == (180.0, 60.0, 5.0, 180.0)
    assert trend.rps == 2200.0 and trend.session == default_config("trend").session
    burst = default_config("burst").compressed(2.0)
    assert (burst.burst_first_s, burst.burst_every_s, burst.burst_len_s) == ((15.0, 30.0), 50.0, (10.0, 45.0))
    w = WorkloadSpec("trend", seed=1, rps=100.0, time_compression=2.0).build()
    assert w.duration_s == 180.0 and [(p.start, p.end, p.kind) for p in w.phases] == [
        (0.0, 60.0, "feed"), (60.0, 120.0, "discovery"), (120.0, 180.0, "feed")]
    assert WorkloadSpec("burst", 90.0, seed=1, rps=100.0, time_compression=2.0).build().duration_s == 90.0
    with pytest.raises(HelmInputError, match="time-compression"):
        default_config("steady").compressed(0.0)
