"""Optional extras: the core commands run without torch, Ray, Gymnasium or SB3; a command that
needs an extra exits 2 with one line naming it (helmgr.core.extras)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helmgr.core.errors import HelmInputError
from helmgr.core.extras import EXTRAS, missing, require

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "ray", "gymnasium", "stable_baselines3", "fastapi", "pydantic", "starlette", "uvicorn",
         "prometheus_client", "aiohttp", "redis")

# Runs the CLI as a core-only install sees it: a meta-path finder refuses every HEAVY module (and
# records each try), then the CLI runs; the last stderr line is the JSON list of modules it tried.
WRAPPER = """
import json, sys
HEAVY = set(sys.argv[1].split(","))
tried = []
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HEAVY:
            tried.append(name)
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None
sys.meta_path.insert(0, Block())
from helmgr.cli import main
code = main(sys.argv[2:])
sys.stderr.write("\\n" + json.dumps(sorted(set(tried))) + "\\n")
sys.exit(code)
"""


def blocked(*argv: str, cwd: Path) -> tuple[int, str, str, list[str]]:
    env = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run([sys.executable, "-c", WRAPPER, ",".join(HEAVY), *argv], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=120)
    err, _, tried = p.stderr.rstrip("\n").rpartition("\n")
    return p.returncode, p.stdout, err.strip("\n"), json.loads(tried)


def test_require_names_the_extra():
    with pytest.raises(HelmInputError) as e:
        require("train", "numpy", "no_such_module_helmgr_xyz", what="helmgr train")
    msg = str(e.value)
    assert "[train]" in msg and "pip install 'helmgr[train]'" in msg and "no_such_module_helmgr_xyz" in msg
    assert "numpy" not in msg.split("not installed:")[1]
    assert msg.startswith("helmgr train needs the [train] extra")


def test_require_passes_when_present_and_checks_the_extras_own_modules():
    require("core", "numpy", "click.testing")           # present: no error, dotted names by their top level
    assert missing("numpy", "no_such_module_helmgr_xyz") == ["no_such_module_helmgr_xyz"]
    assert set(EXTRAS) == {"train", "real", "serve", "redis"}
    with pytest.raises(KeyError):
        require("gpu")


def test_require_does_not_import():
    before = set(sys.modules)
    missing(*HEAVY)
    assert not {m for m in set(sys.modules) - before if m.partition(".")[0] in HEAVY}


CORE_COMMANDS = [
    ["simulate", "--duration", "2", "--nodes", "1", "--jobs", "1", "--json"],     # HELM beside static-best
    ["simulate", "--duration", "2", "--nodes", "2", "--policy", "helm", "--router", "helm", "--json"],
    ["sweep", "--duration", "2", "--nodes", "1", "--ratios", "0.3,0.6", "--json"],
    ["workload", "--duration", "2", "--json"],
    ["profile", "--json"],
    ["bench", "--nodes", "4", "--decisions", "100", "--repeats", "1", "--json"],
    ["bench", "--controller", "--decisions", "100", "--json"],
]


def test_simulate_runs_without_the_extras(tmp_path):
    code, out, err, tried = blocked("simulate", "--duration", "2", "--nodes", "1", "--policy", "static", "--json",
                                    cwd=tmp_path)
    assert code == 0, err
    assert json.loads(out)["requests"] > 0
    assert tried == [], f"simulate tried to import {tried}"


def test_the_core_commands_never_try_an_extra(tmp_path):
    """Without the block: each command's run leaves no heavy module in sys.modules (so none is
    imported behind a try/except either). compare is simulate and sweep's code (17 s: left out)."""
    code = ("import json, sys\nfrom helmgr.cli import main\nbad = {}\n"
            "for argv in json.loads(sys.argv[1]):\n"
            "    assert main(argv) == 0, argv\n"
            "    bad[argv[0]] = sorted(m for m in sys.modules if m.partition('.')[0] in sys.argv[2].split(','))\n"
            "sys.stderr.write(json.dumps(bad))\n")
    env = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run([sys.executable, "-c", code, json.dumps(CORE_COMMANDS), ",".join(HEAVY)], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stderr.rstrip().rpartition("\n")[2]) == {argv[0]: [] for argv in CORE_COMMANDS}


@pytest.mark.parametrize("argv,extra", [
    (["train", "--timesteps", "64"], "train"),
    (["calibrate", "--out", "hw.toml"], "real"),
    (["serve"], "serve"),
    (["loadgen", "--sim", "--duration", "1"], "serve"),
    (["history", "stat", "--redis", "redis://localhost:1/0"], "redis"),
])
def test_a_command_without_its_extra_exits_2_naming_it(tmp_path, argv, extra):
    code, out, err, _ = blocked(*argv, cwd=tmp_path)
    assert code == 2, err
    assert out == ""
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert f"helmgr {argv[0]} needs the [{extra}] extra" in err and f"pip install 'helmgr[{extra}]'" in err
    assert not list(tmp_path.iterdir())                  # nothing written
