"""`helmgr train --trace`: the base policy's episodes drawn from a log's replay, never from its
held-out tail, and the policy validated on that tail alone."""
from __future__ import annotations

import numpy as np
import pytest

from helmgr.cli import main
from helmgr.controller.controller import default_policy_file
from helmgr.sim import SimConfig, simulate
from helmgr.workload import WorkloadSpec

pytest.importorskip("gymnasium")


def write_log(path, users: int = 60, items: int = 300, length: int = 40, seed: int = 0):
    """A 'sequences' log: each user a run of Zipf-popular items."""
    rng = np.random.default_rng(seed)
    lines = [" ".join(map(str, [u] + list(rng.zipf(1.4, length) % items))) for u in range(users)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def spec(log: str, duration: float = 60.0) -> dict:
    return {"trace": log, "trace_format": "sequences", "duration_s": duration, "seed": 3}


def test_episodes_stay_before_the_held_out_tail(tmp_path):
    from helmgr.learn.env import HelmEnv
    log = write_log(tmp_path / "log.txt")
    env = HelmEnv(trace=spec(log), holdout=0.25, episode_s=20.0, warmup_s=5.0, model="small")
    starts = set()
    for seed in range(12):
        obs, info = env.reset(seed=seed)
        assert info["regime"] == "trace" and np.isfinite(obs).all()
        assert 0 <= info["start_s"] and info["start_s"] + 5.0 + 20.0 <= 45.0      # 60 s, the last 15 held out
        starts.add(info["start_s"])
    assert len(starts) > 3
    obs, pay, done, _, _ = env.step(np.zeros(1, np.float32))
    assert np.isfinite(obs).all() and np.isfinite(pay) and not done
    with pytest.raises(ValueError, match="shorter than an episode"):
        HelmEnv(trace=spec(log), holdout=0.5, episode_s=30.0, warmup_s=5.0, model="small").reset(seed=0)


def test_the_held_out_tail_alone_is_measured(tmp_path):
    """`measure_from_s`: the summary's figures cover the arrivals from then on only (counted by
    hand from the replay), and validation runs the trained and the shipped policy on that tail."""
    from helmgr.experiments.training import validate_trace
    log = write_log(tmp_path / "log.txt")
    w = WorkloadSpec(**spec(log)).build()
    arrivals = np.concatenate([c.t for c in w.chunks(1.0)])
    summary = simulate(SimConfig(nodes=2, router="helm", model="small", policy="static"), w,
                       measure_from_s=45.0).summary
    assert summary["warmup_s"] == 45.0
    assert summary["throughput_rps"] * 15.0 == pytest.approx(np.sum(arrivals >= 45.0))
    env = {"trace": spec(log), "holdout": 0.25, "nodes": 2, "model": ("small",)}
    v = validate_trace(str(default_policy_file()), env)     # the shipped file as the "trained" one
    assert v["held_out_s"] == [45.0, 60.0] and v["nodes"] == 2 and v["model"] == "small"
    assert v["trained"] == v["shipped"] and v["p99_trained_over_shipped"] == 1.0


@pytest.mark.parametrize("argv,needle", [
    (["--trace", "{tmp}/none.txt"], "does not exist"),
    (["--trace", "{log}", "--trace-format", "sequences", "--seeds", "1,2"], "give one --seed"),
    (["--trace", "{log}", "--trace-format", "sequences", "--workloads", "steady"], "trains on the log instead"),
    (["--trace", "{log}", "--trace-format", "sequences", "--duration", "100"], "cannot hold an episode of 15 + 120 s"),
    (["--trace", "{log}", "--trace-format", "sequences", "--widen-catalogue"], "--widen-catalogue needs"),
    (["--duration", "900"], "give --trace LOG"),
    (["--trace", "{log}", "--holdout", "0.9"], "'--holdout': 0.9"),
])
def test_bad_trace_options_are_refused_before_training(capsys, monkeypatch, tmp_path, argv, needle):
    pytest.importorskip("stable_baselines3")
    log = write_log(tmp_path / "log.txt")
    monkeypatch.setattr("helmgr.learn.train.train", lambda *a, **k: pytest.fail("trained"))
    code = main(["train", "--timesteps", "64", "--out", str(tmp_path / "p.npz"),
                 *[a.format(tmp=tmp_path, log=log) for a in argv]])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err, err
