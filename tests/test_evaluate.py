"""`helmgr evaluate` on a tiny configuration: units, resume, the tables, the commands, bad input."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from helmgr.cli import main
from helmgr.cli.evaluate_cmd import assemble
from helmgr.experiments import report
from helmgr.experiments import evaluate as ev_mod
from helmgr.experiments.capacity import Bracket, Probe
from helmgr.experiments.evaluate import EvalConfig, RunStore, evaluate, first_units
from helmgr.sim import SimConfig
from helmgr.sim.config import TENANCIES

TINY = EvalConfig(cluster=SimConfig(nodes=2, engine="pipelined", max_batch=8, slo_ms=20.0),
                  regimes=("steady",), seeds=(1,), policies=("helm",), routers=("least-loaded", "helm"),
                  grid=(0.4, 0.8), duration_s=5.0, check_router="least-loaded", capacity_duration_s=4.0,
                  capacity_tol=0.25)


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval")
    return folder, evaluate(TINY, folder)


def test_units_are_every_policy_router_and_grid_point():
    units = first_units(TINY)
    assert [(u.kind, u.policy, u.router, u.ratio) for u in units] == [
        ("run", "helm", "least-loaded", None), ("run", "helm", "helm", None),
        ("point", "static", "least-loaded", 0.4), ("point", "static", "least-loaded", 0.8),
        ("point", "static", "helm", 0.4), ("point", "static", "helm", 0.8)]
    assert len({u.key for u in units}) == len(units)


def test_a_retrained_base_policy_is_a_new_unit_for_helm_runs_only(monkeypatch):
    from helmgr.controller import controller
    units = first_units(TINY)
    before = [u.key for u in units]
    monkeypatch.setattr(controller, "default_policy_digest", lambda: "another policy")
    after = [u.key for u in units]
    assert [a != b for a, b in zip(before, after)] == [u.policy == "helm" for u in units] == [True, True] + [False] * 4


def test_a_new_definition_of_the_class_figures_is_a_new_unit_for_class_units_only(monkeypatch):
    from helmgr.sim import class_metrics
    ev = replace(TINY, seeds=(1,), routers=("helm",), classes="surfaces")
    units = first_units(ev) + ev_mod.tenancy_units(ev) + ev_mod.capacity_units(ev, {})
    before = [u.key for u in units]
    monkeypatch.setattr(class_metrics, "FIGURES_REVISION", class_metrics.FIGURES_REVISION + 1)
    changed = [a != b for a, b in zip(before, (u.key for u in units))]
    assert changed == [u.kind in ("tenancy", "class-capacity") for u in units]
    assert {u.kind for u in units} == {"run", "point", "capacity", "tenancy", "class-capacity"}


def test_first_run_runs_every_unit_and_stores_it(done):
    folder, out = done
    kinds = sorted(u.kind for u in out["results"])
    # 2 runs + 4 points, capacity of helm@helm and static-best@least-loaded, one oracle (HELM router)
    assert kinds == ["capacity"] * 2 + ["oracle"] + ["point"] * 4 + ["run"] * 2
    assert out["ran"] == 9
    assert len(list((folder / "runs").glob("*.pkl"))) == 9


def test_a_rerun_reruns_nothing(done, monkeypatch):
    folder, first = done

    def refuse(unit):
        raise AssertionError(f"{unit.name} was rerun")
    monkeypatch.setattr(ev_mod, "_execute", refuse)
    monkeypatch.setattr(ev_mod, "run_oracle_unit", refuse)
    again = evaluate(TINY, folder)
    assert again["ran"] == 0
    assert assemble(TINY, again["results"], "whole")["rows"] == assemble(TINY, first["results"], "whole")["rows"]
    # the serial time is the units' own seconds, kept with them: a rerun that runs nothing reads it back
    assert first["cpu_s"] > 0 and again["cpu_s"] == first["cpu_s"]


def test_an_unreadable_unit_is_run_again(done, tmp_path):
    folder, first = done
    copy = tmp_path / "copy"
    (copy / "runs").mkdir(parents=True)
    for f in (folder / "runs").glob("*.pkl"):
        (copy / "runs" / f.name).write_bytes(f.read_bytes())
    unit = first_units(TINY)[0]
    RunStore(copy).path(unit).write_bytes(b"half a pickle")
    again = evaluate(TINY, copy)
    assert again["ran"] == 1
    assert again["results"][unit]["summary"]["p99_ms"] == first["results"][unit]["summary"]["p99_ms"]


def test_tables_by_hand(done):
    _, out = done
    result = assemble(TINY, out["results"], "whole")
    rows = {(r["policy"], r["router"]): r for r in result["rows"]}
    points = [r for u, r in out["results"].items() if u.kind == "point" and u.router == "helm"]
    best = min(points, key=lambda p: p.summary["p99_ms"])
    assert rows[("static-best", "helm")]["p99_ms"] == best.summary["p99_ms"]
    assert rows[("static-best", "helm")]["ratio"] == best.ratio
    ctrl = result["controller"][0]
    assert ctrl["p99_reduction"] == pytest.approx(1 - rows[("helm", "helm")]["p99_ms"] / best.summary["p99_ms"])
    assert rows[("oracle", "helm")]["regret"] == 0.0
    assert rows[("helm", "helm")]["regret"] == pytest.approx(
        rows[("helm", "helm")]["p99_ms"] / rows[("oracle", "helm")]["p99_ms"] - 1)
    assert "oracle_distance" in rows[("helm", "helm")] and rows[("helm", "least-loaded")]["regret"] is None
    # no lookahead: every block is judged in its own phase
    assert rows[("helm", "helm")]["band_distance_in_phase"] == pytest.approx(rows[("helm", "helm")]["band_distance"])
    assert ctrl["band_distance_in_phase"] == pytest.approx(ctrl["band_distance"])
    full = rows[("helm", "helm")]                         # what its P99 is made of, from its summary
    assert full["tail_wait_ms"] >= 0 and full["tail_service_ms"] > 0
    assert full["tail_wait_ms"] + full["tail_service_ms"] >= full["p99_ms"] - 1e-9   # the tail's mean: at or past it
    system = {r["baseline"]: r for r in result["system"]}
    assert list(system) == ["static-best@least-loaded"]          # prefix-aware is not among the routers
    caps = {c["config"]: c for c in result["capacity"]}
    assert set(caps) == {"helm@helm", "static-best@least-loaded"}
    assert caps["static-best@least-loaded"]["static_ratio"] == rows[("static-best", "least-loaded")]["ratio"]
    assert result["scenario_check"]["steady"]["summary"]["S1"]["threshold"] == 1.3
    p99 = {(u.router, u.ratio): r.summary["p99_ms"] for u, r in out["results"].items() if u.kind == "point"}
    assert [(r["ratio"], r["helm"], r["least-loaded"], r["vs_least-loaded"], r["below_all"]) for r in result["routers"]] == [
        (x, p99[("helm", x)], p99[("least-loaded", x)], p99[("helm", x)] / p99[("least-loaded", x)] - 1,
         int(p99[("helm", x)] < p99[("least-loaded", x)])) for x in TINY.grid]


def test_the_oracle_blocks_table_by_hand():
    """Blocks of a 60-s burst run (warm-up 15 s): the first ends inside it and is left out; per
    kind, r*'s spread, the bands' intersection and how many bands hold static-best's split (the
    helm router's best point, 0.6 here)."""
    from types import SimpleNamespace

    from helmgr.experiments.evaluate import Unit
    from helmgr.experiments.report import oracle_table

    def block(start, kind, r, lo, hi):
        return {"start": start, "end": start + 10.0, "kind": kind, "r_star": r, "band": [lo, hi]}
    blocks = [block(0, "steady", 0.9, 0.8, 0.95),                 # ends at 10 s, inside the warm-up
              block(10, "steady", 0.55, 0.50, 0.65), block(20, "burst", 0.95, 0.85, 0.95),
              block(30, "burst", 0.90, 0.80, 0.95), block(40, "steady", 0.60, 0.58, 0.70),
              block(50, "steady", 0.50, 0.40, 0.57)]
    point = lambda ratio, p99: SimpleNamespace(summary={"p99_ms": p99}, ratio=ratio)
    results = {Unit("oracle", "burst", 1, "oracle", "helm"): {"blocks": blocks},
               Unit("point", "burst", 1, "static", "helm", 0.3): point(0.3, 9.0),
               Unit("point", "burst", 1, "static", "helm", 0.6): point(0.6, 7.0),
               Unit("point", "burst", 1, "static", "least-loaded", 0.9): point(0.9, 5.0)}
    ev = EvalConfig(cluster=SimConfig(warmup_s=15.0), regimes=("burst",), seeds=(1,), grid=(0.3, 0.6))
    rows = {r["kind"]: r for r in oracle_table(ev, results)}
    steady, burst = rows["steady"], rows["burst"]
    assert (steady["blocks"], steady["r_star_min"], steady["r_star_max"]) == (3, 0.50, 0.60)
    assert steady["spread"] == pytest.approx(0.10)
    assert steady["common_lo"] is None and steady["common_hi"] is None      # 0.58 > 0.57: no ratio in all three
    assert steady["static_best"] == 0.6 and steady["static_best_in_band"] == pytest.approx(2 / 3)
    assert (burst["blocks"], burst["spread"]) == (2, pytest.approx(0.05))
    assert (burst["common_lo"], burst["common_hi"]) == (0.85, 0.95) and burst["static_best_in_band"] == 0.0


def test_the_report_links_every_plot_it_writes(done, tmp_path):
    from helmgr.cli.evaluate_cmd import _write
    _, out = done
    result = assemble(TINY, out["results"], "whole") | {"wall_s": 1.0, "ran": 9, "kept": 0,
                                                        "duration_s": {"steady": 5.0}, "command": "helmgr evaluate"}
    _write(result, TINY, out["results"], tmp_path)
    md = (tmp_path / "evaluate.md").read_text()
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["evaluate_capacity.png", "evaluate_p99.png", "evaluate_ratios.png", "evaluate_routers.png"]
    assert all(f"({p})" in md for p in pngs) and "## Routers at each static split" in md


def test_every_figure_has_its_command(done):
    _, out = done
    cmds = assemble(TINY, out["results"], "whole")["commands"]
    assert cmds["steady seed 1: helm @ helm"] == (
        "helmgr simulate --workload steady --duration 5 --seed 1 --nodes 2 --policy helm --router helm --json")
    assert cmds["steady seed 1: oracle @ helm"].startswith("helmgr compare ")
    assert "--policies oracle --routers helm --ratios 0.4,0.8" in cmds["steady seed 1: oracle @ helm"]
    assert cmds["steady seed 1: capacity helm @ helm"].startswith("helmgr capacity ")
    assert cmds["steady: scenario check"].startswith("helmgr scenario --check ")


def test_the_command_of_a_run_reproduces_it(done, capsys):
    _, out = done
    unit = next(u for u in out["results"] if u.kind == "run" and u.router == "least-loaded")
    cmd = assemble(TINY, out["results"], "whole")["commands"][unit.name].split()[1:]
    assert main(cmd) == 0
    printed = json.loads(capsys.readouterr().out)
    kept = out["results"][unit]["summary"]
    assert (printed["requests"], printed["p99_ms"], printed["mean_ratio"]) == (
        kept["requests"], kept["p99_ms"], kept["mean_ratio"])


@pytest.mark.parametrize("argv,needle", [
    (["evaluate", "--workloads", "calm"], "--workloads 'calm'"),
    (["evaluate", "--ratios", "0.5"], "at least two ratios"),
    (["evaluate", "--seeds", "1,x"], "--seeds '1,x'"),
    (["evaluate", "--routers", "fastest"], "--routers 'fastest'"),
    (["evaluate", "--policy", "helm"], "evaluate runs the online policies of --policies"),
    (["plan", "--rps", "100", "--policy", "helm"], "plan weighs the POLICY@ROUTER pairs"),
    (["plan", "--rps", "100", "--candidates", "helm@nowhere"], "'helm@nowhere' is not POLICY@ROUTER"),
    (["plan", "--rps", "-1"], "'--rps': -1"),
    (["evaluate", "--rate-scale", "0"], "'--rate-scale': 0"),
    (["evaluate", "--classes", "gold"], "unknown class table 'gold'"),
    (["evaluate", "--classes", "surfaces", "--class-loads", "1,-2"], "--class-loads '1,-2'"),
    (["evaluate", "--classes", "surfaces", "--nodes", "2"], "--tenancy pools needs a node per class: 2 nodes"),
    (["evaluate", "--class-loads", "2"], "--class-loads '2' sets the rates of the multi-tenant runs: give --classes"),
    (["evaluate", "--workloads", "steady", "--classes", "surfaces", "--class-loads", "1,1e6"],
     "steady: 1300 req/s x --rate-scale 1 x --class-loads 1e+06 x 360 s asks for ~4.68e+11 requests"),
    (["evaluate", "--workloads", "steady", "--rate-scale", "1e5"], "asks for ~4.68e+10 requests (limit 20,000,000)"),
    (["capacity", "--seeds", ""], "--seeds ''"),
    (["capacity", "--tol", "1.5"], "'--tol': 1.5"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, needle):
    code = main(argv + (["--out", str(tmp_path / "out")] if argv[0] != "plan" else []))
    out, err = capsys.readouterr()
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and not out
    assert not (tmp_path / "out").exists()


def test_the_default_grid_spans_the_controllers_range():
    """static-best is chosen over every ratio a controller may set: the grid's ends are SimConfig's
    r_min and r_max (on trend least-loaded's best split is 0.95, outside a 0.1-0.9 grid)."""
    from helmgr.experiments.evaluate import DEFAULT_GRID
    from helmgr.sim import SimConfig
    ev = EvalConfig(cluster=SimConfig())
    assert ev.grid == DEFAULT_GRID
    assert min(ev.grid) == SimConfig().r_min and max(ev.grid) == SimConfig().r_max
    assert list(ev.grid) == sorted(set(ev.grid))
    from helmgr.cli.scenario_cmd import scenario_cmd          # the scenario check's S-properties too
    from helmgr.cli.types import ratio_grid
    default = next(p.default for p in scenario_cmd.params if p.name == "ratios")
    assert tuple(ratio_grid(default)) == DEFAULT_GRID


def test_a_scaled_rate_reaches_every_unit_and_its_command():
    """--rate-scale 4 (32 nodes at the 8-node load per node): steady's 1,300 req/s and trend's
    2,200 become 5,200 and 8,800; every command names the rate, capacity once (its start)."""
    from dataclasses import replace

    from helmgr.experiments import commands
    from helmgr.experiments.evaluate import Unit
    ev = replace(TINY, regimes=("steady", "trend"), rate_scale=4.0)
    assert (ev.rps("steady"), ev.rps("trend")) == (5200.0, 8800.0)
    assert TINY.rps("steady") is None and TINY.spec("steady", 1).rps is None
    arrivals = [sum(len(c.t) for c in e.spec("steady", 1).build().chunks(1.0)) for e in (TINY, ev)]
    assert arrivals[1] / arrivals[0] == pytest.approx(4.0, rel=0.05)     # 6,500 against 26,000 expected
    units = first_units(ev)
    assert {u.payload[0].rps for u in units if u.kind in ("run", "point")} == {5200.0, 8800.0}
    assert {u.key for u in units}.isdisjoint(u.key for u in first_units(replace(ev, rate_scale=1.0)))
    run = next(u for u in units if u.kind == "run" and u.regime == "trend")
    assert "--workload trend --duration 5 --rps 8800 --seed 1" in commands.unit_command(ev, run)
    cap = commands.unit_command(ev, Unit("capacity", "steady", 1, "helm", "helm",
                                         payload=ev_mod.CapacityTask(ev.spec("steady", 1), ev.cfg("helm", "helm", 1),
                                                                     5200.0, 0.02)))
    assert cap.count("--rps") == 1 and "--rps 5200 --tol 0.02" in cap
    assert "--duration 5 --rps 8800 " in commands.check_command(ev, "trend")


def test_allow_large_reaches_the_capacity_searches_and_every_command():
    """--allow-large lifts the capacity searches' ceiling to CEILING (else: the limits') and is
    in every command quoted, so each reproduces past the same limits."""
    from dataclasses import replace

    from helmgr.experiments import commands
    large = replace(TINY, allow_large=True)
    for ev, lifted in ((TINY, False), (large, True)):
        assert {u.payload.allow_large for u in ev_mod.capacity_units(replace(ev, routers=("helm",)), {})} == {lifted}
        quoted = [commands.unit_command(ev, u) for u in first_units(ev)] + [commands.check_command(ev, "steady"),
                                                                            commands.static_best_command(ev, "steady", 1, "helm")]
        assert all(("--allow-large" in q) == lifted for q in quoted)
    assert "allow_large" not in ev_mod.config_dict(TINY) and ev_mod.config_dict(large)["allow_large"] is True


def test_burst_violations_are_judged_on_the_bursts_static_best_under_helm_provisions():
    """Two bursts; static-best under the HELM router peaks at 0.80 and 0.90 in them (the second
    beyond the provisioned 0.85), under prefix-aware at 0.70 and 0.80 (not the reference). A run
    violating only the second burst violates no provisioned one; one violating the first, half
    of all and all of the provisioned."""
    from helmgr.experiments.report import _provisioned
    from helmgr.sim.bursts import violation_share
    ref = {"summary": {"burst_peak_utilization": [0.8, 0.9]}}
    other = {"summary": {"burst_peak_utilization": [0.7, 0.8]}}
    found = [(other, "static-best", "prefix-aware"), (ref, "static-best", "helm")]
    keep = _provisioned(found)
    assert keep == [True, False]
    second = {"slo_ms": 20.0, "burst_worst_p99_ms": [12.0, 31.0]}
    first = {"slo_ms": 20.0, "burst_worst_p99_ms": [25.0, 15.0]}
    assert violation_share(second, keep) == 0.0 and violation_share(second) == 0.5
    assert violation_share(first, keep) == 1.0 and violation_share(first) == 0.5
    assert _provisioned([(other, "static-best", "prefix-aware")]) == [True, True]     # no HELM sweep: the first
    assert _provisioned([({"summary": {}}, "static-best", "helm")]) is None           # stored before the fields


def _group(p99, win, requests=10, completed=10, shed=0, burst=None, goodput=1.0):
    return {"p99_ms": p99, "window_slo_satisfaction": win, "requests": requests, "completed": completed, "shed": shed,
            "goodput_rps": goodput} | ({} if burst is None else {"burst_window_slo_satisfaction": burst})


def test_the_tenancy_table_by_hand():
    ev = replace(TINY, regimes=("burst",), seeds=(1, 2), classes="surfaces")
    units = ev_mod.tenancy_units(ev)
    assert len(units) == 2 * 5 and units[0].name == "burst seed 1: helm, tenancy blind at 1x @ helm"
    assert [u.payload[1].tenancy for u in units[:5]] == ["blind", "strict", "quota", "pools", "helm"]
    assert units[0].payload[0].rps == 1300.0 and units[0].payload[1].classes.class_names == ["feed", "interactive",
                                                                                            "refresh"]
    tenants = ["home", "search", "notifications", "trending", "refresh"]

    def summary(feed, burst, shed=0, gap=0.05):
        return {"requests": 30, "completed": 30 - shed, "shed": shed, "fairness": {"jain": 0.9, "max_gap_s": gap},
                "classes": {"feed": _group(feed, 0.5, goodput=100.0), "interactive": _group(10.0, 1.0, goodput=50.0),
                            "refresh": _group(20.0, 1.0, requests=10, completed=10 - shed, shed=shed, goodput=5.0)},
                "tenants": {t: _group(1.0, 1.0, burst=burst if t != "search" else 0.25 + burst) for t in tenants}}
    results = {units[0]: {"summary": summary(12.0, 0.75)}, units[5]: {"summary": summary(16.0, 0.5, shed=2, gap=0.12)}}
    row, = report.tenancy_table(ev, results)
    assert row == {"regime": "burst", "load": 1.0, "rps": 1300.0, "tenancy": "blind", "seeds": 2,
                   "feed_p99_ms": 14.0, "feed_window_slo": 0.5, "interactive_p99_ms": 10.0, "interactive_window_slo": 1.0,
                   "refresh_p99_ms": 20.0, "refresh_window_slo": 1.0, "goodput_rps": 155.0, "shed": 1.0, "jain": 0.9,
                   "max_gap_s": 0.12, "others_burst_window_slo": 0.5, "unaccounted": 0}
    results[units[5]]["summary"]["tenants"]["home"]["completed"] = 8          # two requests lost: counted
    assert report.tenancy_table(ev, results)[0]["unaccounted"] == 2


def test_the_class_capacity_table_by_hand():
    ev = replace(TINY, seeds=(1, 2), routers=("helm",), classes="surfaces")
    units = [u for u in ev_mod.capacity_units(ev, {}) if u.kind == "class-capacity"]
    assert [(u.seed, u.payload.cfg.tenancy) for u in units[:5]] == [(1, t) for t in TENANCIES] and len(units) == 10
    assert units[0].name == "steady seed 1: capacity per class, helm, tenancy blind @ helm"
    assert units[0].payload.cfg.classes.class_names == ["feed", "interactive", "refresh"]

    def bracket(cap, fails, sat, worst):
        return Bracket(cap, fails, (Probe(cap or 1.0, cap is not None, 0.97, worst_class="refresh"),
                                    Probe(fails, False, sat, worst_class=worst), Probe(fails * 2, False, 0.1,
                                                                                      worst_class="refresh")))
    results = {units[0]: bracket(3000.0, 3200.0, 0.90, "feed"), units[5]: bracket(2800.0, 3000.0, 0.80, "interactive"),
               units[4]: bracket(3300.0, 3500.0, 0.93, "feed"), units[9]: bracket(3500.0, 3700.0, 0.94, "feed"),
               units[3]: bracket(None, 1500.0, 0.5, "refresh")}
    blind, pools, helm = report.class_capacity_table(ev, results)
    assert blind == {"regime": "steady", "tenancy": "blind", "capacity_rps": 2800.0,
                     "per_seed": {"1": 3000.0, "2": 2800.0}, "binding_class": "interactive", "vs_blind": 1.0}
    assert helm["capacity_rps"] == 3300.0 and helm["binding_class"] == "feed" and helm["vs_blind"] == 3300.0 / 2800.0
    assert pools["capacity_rps"] is None and pools["vs_blind"] is None and pools["binding_class"] == "refresh"


def test_evaluate_with_a_class_table_runs_every_tenancy_and_reproduces_one(tmp_path, capsys):
    ev = replace(TINY, cluster=replace(TINY.cluster, nodes=3), routers=("helm",), oracle_routers=(),
                 check_router="helm", classes="surfaces")
    out = evaluate(ev, tmp_path)
    result = assemble(ev, out["results"], "whole")
    assert [r["tenancy"] for r in result["tenancy"]] == ["blind", "strict", "quota", "pools", "helm"]
    assert all(r["unaccounted"] == 0 and r["seeds"] == 1 for r in result["tenancy"])
    assert [r["tenancy"] for r in result["class_capacity"]] == ["blind", "strict", "quota", "pools", "helm"]
    unit = next(u for u in out["results"] if u.kind == "class-capacity" and u.payload.cfg.tenancy == "helm")
    cmd = result["commands"][unit.name]
    assert cmd == ("helmgr capacity --workload steady --duration 4 --seeds 1 --nodes 3 --policy helm --router helm "
                   f"--classes surfaces --tenancy helm --rps {unit.payload.start:g} --tol 0.25 --json")
    assert main(cmd.split()[1:]) == 0
    assert json.loads(capsys.readouterr().out)["capacity_rps"] == out["results"][unit].capacity == \
        result["class_capacity"][-1]["capacity_rps"]
    unit = next(u for u in out["results"] if u.kind == "tenancy" and u.payload[1].tenancy == "pools")
    cmd = result["commands"][unit.name]
    assert cmd == ("helmgr simulate --workload steady --duration 5 --rps 1300 --seed 1 --nodes 3 --policy helm "
                   "--router helm --classes surfaces --tenancy pools --json")
    assert main(cmd.split()[1:]) == 0
    printed = json.loads(capsys.readouterr().out)
    kept = out["results"][unit]["summary"]
    assert printed["pools"] == {"feed": 1, "interactive": 1, "refresh": 1}
    assert printed["classes"] == kept["classes"] and printed["p99_ms"] == kept["p99_ms"]
