"""The no-tuning study's figures, worked out by hand, and a tiny grid end to end."""
import json

import numpy as np
import pytest

from helmgr.cli import main
from helmgr.experiments.notuning import summarize


def test_regrets_by_hand():
    """Three conditions x splits 0.3 / 0.6 / 0.9 (P99 ms). Hindsight: 0.3 (10), 0.6 (10), 0.9 (8).
    Regrets: 0.3 -> 0, 0.2, 0.5; 0.6 -> 0.1, 0, 0.25; 0.9 -> 0.4, 0.3, 0. Worst 0.5 / 0.25 / 0.4:
    the minimax split is 0.6; the default-tuned split is the first condition's best, 0.3. HELM at
    10.5, 10.5, 8.4: regret 0.05 each."""
    p99 = np.array([[10.0, 11.0, 14.0], [12.0, 10.0, 13.0], [12.0, 10.0, 8.0]])
    out = summarize(p99, np.array([10.5, 10.5, 8.4]), [0.3, 0.6, 0.9])
    assert out["best_ratio"] == [0.3, 0.6, 0.9]
    assert out["fixed"]["0.3"] == pytest.approx({"worst": 0.5, "mean": 0.7 / 3})
    assert out["fixed"]["0.6"] == pytest.approx({"worst": 0.25, "mean": 0.35 / 3})
    assert out["fixed"]["0.9"] == pytest.approx({"worst": 0.4, "mean": 0.7 / 3})
    assert out["minimax"] == pytest.approx({"ratio": 0.6, "worst": 0.25, "mean": 0.35 / 3})
    assert out["default_tuned"] == pytest.approx({"ratio": 0.3, "worst": 0.5, "mean": 0.7 / 3})
    assert out["helm"] == pytest.approx({"worst": 0.05, "mean": 0.05})


def test_a_tiny_grid_end_to_end(capsys):
    rc = main(["no-tuning", "--hardware", "a100-80g", "--models", "large,small", "--workloads", "steady",
               "--ratios", "0.3,0.8", "--time-compression", "60", "--jobs", "1", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    r = json.loads(out)
    assert [c["condition"] for c in r["conditions"]] == ["a100-80g/large/steady", "a100-80g/small/steady"]
    for c in r["conditions"]:
        best = min(c["p99_ms"].values())
        assert c["p99_ms"][f"{c['best_ratio']:g}"] == best
        assert c["helm_regret"] == pytest.approx(c["helm_p99_ms"] / best - 1)
    assert r["minimax"]["ratio"] in (0.3, 0.8) and r["default_tuned"]["ratio"] == r["conditions"][0]["best_ratio"]


def test_bad_input_is_one_line_and_exit_2(capsys):
    assert main(["no-tuning", "--hardware", "tpu"]) == 2
    assert "tpu" in capsys.readouterr().err


def test_a_widened_log_alone(capsys):
    """A log as the grid's one condition: 8 users x 3 clones over their own item ranges."""
    import pathlib
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        log = pathlib.Path(d) / "log.txt"
        log.write_text("".join(f"{u} " + " ".join(str((u * 7 + k) % 50) for k in range(20)) + "\n" for u in range(8)))
        rc = main(["no-tuning", "--hardware", "a100-80g", "--models", "small", "--workloads", "", "--trace", str(log),
                   "--trace-format", "sequences", "--clone-users", "3", "--trace-duration", "4", "--ratios", "0.3,0.8",
                   "--jobs", "1", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    (c,) = json.loads(out)["conditions"]
    assert c["condition"] == "a100-80g/small/trace log.txt" and set(c["p99_ms"]) == {"0.3", "0.8"}


def test_allow_large_reaches_every_capacity_search(monkeypatch):
    """--allow-large lifts the capacity searches' ceiling as it does capacity's and evaluate's: each
    search of the study is handed it (the runner stands in; the searches are capacity's own)."""
    from helmgr.experiments import notuning
    from helmgr.experiments.capacity import Bracket
    conditions = notuning.grid_conditions(["a100-80g"], ["small"], ["steady"], time_compression=36.0)
    out = {"best_ratio": [0.4], "minimax": {"ratio": 0.5}, "default_tuned": {"ratio": 0.4}}
    for allow in (False, True):
        handed = []
        monkeypatch.setattr(notuning, "run_all", lambda fn, tasks, *a, **k: handed.extend(tasks) or
                            [Bracket(100.0, 110.0, ()) for _ in tasks])
        rows = notuning._capacities(conditions, out, notuning.SimConfig(), ("steady",), 1, None, 0.05, None, None,
                                    allow)
        assert len(handed) == 4 and {t.allow_large for t in handed} == {allow} and rows[0]["helm"] == 100.0
