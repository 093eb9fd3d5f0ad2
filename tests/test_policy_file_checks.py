"""A base-policy file (.npz) that is broken is refused as it loads, by one line naming the file and
what is wrong: not a zip archive, cut short, empty, a scalar stored as an array, meta that is no
JSON object, a value the forward pass cannot run on (NaN, inf, a negative variance, a std of 0)."""
import json

import numpy as np
import pytest

from helmgr.cli import main
from helmgr.controller.mlp import MLPPolicy
from helmgr.core.errors import HelmInputError

N_OBS = 3


def good_arrays() -> dict:
    """A small valid policy's arrays (3 inputs, 4 hidden, 1 output), as `MLPPolicy.save` writes them."""
    rng = np.random.default_rng(0)
    return {"w0": rng.normal(0, 1, (4, N_OBS)), "b0": rng.normal(0, 1, 4), "w1": rng.normal(0, 1, (1, 4)),
            "b1": np.zeros(1), "obs_mean": np.zeros(N_OBS), "obs_var": np.ones(N_OBS), "obs_clip": np.float64(10.0),
            "obs_eps": np.float64(1e-8), "max_step": np.float64(0.05), "meta": np.array(json.dumps({"seed": 1}))}


def write(path, **changes):
    """The good policy with `changes` (a value of None drops that array) written to `path`."""
    arrays = {k: v for k, v in (good_arrays() | changes).items() if v is not None}
    np.savez(path, **arrays)
    return path


def with_nan(name: str, at: int = 0, value: float = np.nan) -> np.ndarray:
    a = good_arrays()[name].copy()
    a.flat[at] = value
    return a


@pytest.mark.parametrize("changes,needle", [
    ({"obs_clip": np.array([1.0, 2.0])}, "obs_clip must be one number, it is float64 of shape (2,)"),
    ({"max_step": np.array("0.05")}, "max_step must be one number"),
    ({"meta": np.array("[1, 2]")}, "meta must be a JSON object, it is a JSON list"),
    ({"meta": np.array("{not json")}, "meta is not JSON"),
    ({"meta": np.array([1.0, 2.0])}, "meta must be a JSON string"),
    ({"w1": with_nan("w1", 2)}, "w1 has 1 value(s) that are not finite"),
    ({"b0": with_nan("b0", 1, np.inf)}, "b0 has 1 value(s) that are not finite"),
    ({"obs_mean": with_nan("obs_mean")}, "obs_mean has 1 value(s) that are not finite"),
    ({"obs_var": with_nan("obs_var", 1, -0.5)}, "obs_var must be >= 0, it has 1 negative (min -0.5)"),
    ({"obs_var": np.zeros(N_OBS), "obs_eps": np.float64(0.0)}, "obs_var + obs_eps must be > 0"),
    ({"obs_eps": np.float64(-1.0)}, "obs_eps must be a finite number >= 0, got -1.0"),
    ({"obs_clip": np.float64(np.nan)}, "obs_clip must be a positive number, got nan"),
    ({"max_step": np.float64(-0.05)}, "max_step must be a positive number, got -0.05"),
    ({"w0": np.full((4, N_OBS), "x")}, "w0 holds <U1 values, not numbers"),
])
def test_bad_values_are_refused_naming_the_file(tmp_path, changes, needle):
    path = write(tmp_path / "bad.npz", **changes)
    with pytest.raises(HelmInputError) as err:
        MLPPolicy.load(path)
    msg = str(err.value)
    assert needle in msg and f"policy file {str(path)!r} is not a HELM policy" in msg and "\n" not in msg, msg


@pytest.mark.parametrize("damage,needle", [
    ("truncated", "File is not a zip file"),
    ("garbage", "it is not an .npz (zip) archive"),
    ("empty", "the file is empty"),
    ("npy", "it is not an .npz (zip) archive"),
])
def test_a_file_that_is_no_npz_archive_is_refused(tmp_path, damage, needle):
    whole = write(tmp_path / "good.npz").read_bytes()
    path = tmp_path / "bad.npz"
    if damage == "npy":
        with open(path, "wb") as f:
            np.save(f, np.zeros(3))                          # one array, no archive
    else:
        path.write_bytes({"truncated": whole[:len(whole) // 2], "garbage": b"\x07not a policy" * 80,
                          "empty": b""}[damage])
    with pytest.raises(HelmInputError, match="is not a HELM policy") as err:
        MLPPolicy.load(path)
    assert needle in str(err.value) and str(path) in str(err.value)


def test_only_values_the_pass_can_run_on_make_a_policy(tmp_path):
    """A file with a NaN weight is refused; a good policy saved, and the shipped one, still load."""
    from helmgr.controller.controller import Controller
    a = good_arrays()
    nan = MLPPolicy([with_nan("w0"), a["w1"]], [a["b0"], a["b1"]], a["obs_mean"], a["obs_var"])
    nan.save(tmp_path / "nan.npz")                   # (in memory it may be built: the safety tier's test)
    with pytest.raises(HelmInputError, match="w0 has 1 value"):
        MLPPolicy.load(tmp_path / "nan.npz")
    good = MLPPolicy([a["w0"], a["w1"]], [a["b0"], a["b1"]], a["obs_mean"], a["obs_var"], meta={"x": 1})
    good.save(tmp_path / "p.npz")
    back = MLPPolicy.load(tmp_path / "p.npz")
    assert back.meta == {"x": 1} and np.array_equal(back.w[0], a["w0"]) and np.isfinite(back.action(np.ones(N_OBS)))
    assert Controller.default().base is not None


def test_bench_refuses_a_nan_policy_in_one_line(capsys, tmp_path):
    path = write(tmp_path / "nan.npz", obs_mean=with_nan("obs_mean"))
    code = main(["bench", "--controller", "--policy", str(path), "--decisions", "100"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("helmgr: error: ")
    assert str(path) in err and "obs_mean has 1 value(s) that are not finite" in err


def test_serve_refuses_a_bad_base_policy_before_any_replica(tmp_path):
    from helmgr.serve.config import ServeConfig
    path = write(tmp_path / "neg.npz", obs_var=with_nan("obs_var", 0, -1.0))
    with pytest.raises(HelmInputError, match="obs_var must be >= 0"):
        ServeConfig(controller=True, base_policy=str(path)).validate()


def test_train_init_refuses_an_empty_file(capsys, tmp_path):
    pytest.importorskip("stable_baselines3")
    path = tmp_path / "empty.npz"
    path.write_bytes(b"")
    code = main(["train", "--timesteps", "64", "--init", str(path), "--out", str(tmp_path / "p.npz"),
                 "--runs-dir", str(tmp_path / "runs")])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "the file is empty" in err and str(path) in err
    assert not (tmp_path / "p.npz").exists() and not (tmp_path / "runs").exists()
