"""Strict JSON (core.jsonsafe) and result folders written whole or not at all (cli.output)."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

from helmgr.cli import output
from helmgr.cli.output import check_out, emit_json, result_dir
from helmgr.core import jsonsafe
from helmgr.core.errors import HelmInputError
from helmgr.core.jsonsafe import dumps, strict


def strict_loads(text: str):
    def refuse(name):
        raise ValueError(f"non-strict JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def test_strict_nulls_every_non_finite_number_and_names_why():
    nan, inf = float("nan"), float("inf")
    obj = {"a": nan, "b": [1.0, inf, {"c": -inf, "d": 2}], "e": np.float32("nan"), "f": np.int64(3),
           "g": np.array([[1.0, np.nan]]), "h": (np.float64(2.5), np.bool_(True)), "i": None,
           "nulls": {"a": "no request completed"}}
    assert strict(obj) == {
        "a": None, "b": [1.0, None, {"c": None, "d": 2, "nulls": {"c": "not a finite number (-inf)"}}],
        "e": None, "f": 3, "g": [[1.0, None]], "h": [2.5, True], "i": None,
        "nulls": {"a": "no request completed", "b[1]": "not a finite number (inf)",
                  "e": "not a finite number (nan)", "g[0][1]": "not a finite number (nan)"}}
    assert type(strict(obj)["f"]) is int and obj["a"] != obj["a"]          # a copy; the input is unchanged


def test_strict_adds_no_nulls_map_when_every_number_is_finite():
    obj = {"x": 1.5, "rows": [{"y": 0}], "name": "s"}
    assert strict(obj) == obj


def test_dumps_is_strict_json():
    text = dumps({"p99_ms": float("nan"), "r": [float("inf")]})
    assert strict_loads(text) == {"p99_ms": None, "r": [None], "nulls": {"p99_ms": "not a finite number (nan)",
                                                                      "r[0]": "not a finite number (inf)"}}


def test_dumps_refuses_nan_that_gets_past_strict(monkeypatch):
    monkeypatch.setattr(jsonsafe, "strict", lambda obj: obj)
    with pytest.raises(ValueError, match="not JSON compliant"):
        dumps({"x": float("nan")})


def test_emit_json_prints_strict_json(capsys):
    emit_json({"p99_ms": float("nan"), "slo_ms": float("inf"), "requests": 0})
    out = capsys.readouterr().out
    assert "NaN" not in out and "Infinity" not in out
    assert strict_loads(out) == {"p99_ms": None, "slo_ms": None, "requests": 0,
                                 "nulls": {"p99_ms": "not a finite number (nan)", "slo_ms": "not a finite number (inf)"}}


def test_check_out_refuses_what_cannot_be_written(tmp_path, monkeypatch):
    check_out(None)
    check_out(tmp_path / "new")                           # a new folder in a writable one: fine
    check_out(tmp_path)                                   # an existing folder: fine
    (tmp_path / "file").write_text("x")
    cases = [(tmp_path / "file", "exists and is not a folder"),
             (tmp_path / "missing" / "res", "does not exist"), (tmp_path / "file" / "res", "is a file")]
    if Path("/proc/self").exists():
        cases.append((Path("/proc/x"), "cannot create a folder in '/proc'"))
    for path, needle in cases:
        with pytest.raises(HelmInputError, match=needle):
            check_out(path)
    (tmp_path / "new").mkdir()
    monkeypatch.chdir(tmp_path / "new")
    for path in (Path("."), tmp_path):                    # swapping these would move the working folder aside
        with pytest.raises(HelmInputError, match="current folder"):
            check_out(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "new"]


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def old_folder(tmp_path: Path) -> Path:
    out = tmp_path / "res"
    (out / "sub").mkdir(parents=True)
    (out / "summary.json").write_text("old json")
    (out / "summary.md").write_text("old md")
    (out / "notes.txt").write_text("mine")
    (out / "sub" / "a.txt").write_text("a")
    return out


def leftovers(tmp_path: Path) -> list[str]:
    return [p.name for p in tmp_path.iterdir() if p.name.startswith(".helmgr-")]


def test_result_dir_makes_a_new_folder_with_the_usual_mode(tmp_path):
    with result_dir(tmp_path / "res") as scratch:
        (scratch / "summary.json").write_text("{}")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "res" / "summary.json").read_text() == "{}"
    assert (tmp_path / "res").stat().st_mode & 0o777 == 0o777 & ~umask
    assert leftovers(tmp_path) == []


def test_result_dir_replaces_its_files_and_keeps_the_others(tmp_path):
    out = old_folder(tmp_path)
    with result_dir(out) as scratch:
        (scratch / "summary.json").write_text("new json")
        (scratch / "plot.png").write_bytes(b"png")
    assert snapshot(out) == {"notes.txt": b"mine", "plot.png": b"png", "sub": None, "sub/a.txt": b"a",
                             "summary.json": b"new json", "summary.md": b"old md"}
    assert leftovers(tmp_path) == []


def test_result_dir_failure_mid_write_leaves_the_folder_untouched(tmp_path):
    out = old_folder(tmp_path)
    before = snapshot(out)
    with pytest.raises(RuntimeError):
        with result_dir(out) as scratch:
            (scratch / "summary.json").write_text("new json")
            (scratch / "summary.md").write_text("new md")
            raise RuntimeError("a plot failed")
    assert snapshot(out) == before and leftovers(tmp_path) == []


def test_result_dir_failed_rename_puts_the_old_folder_back(tmp_path, monkeypatch):
    out = old_folder(tmp_path)
    before = snapshot(out)
    rename = os.rename

    def fail_moving_scratch_in(src, dst):
        if Path(dst) == out and not str(src).endswith("-old"):
            raise OSError(28, "No space left on device")
        rename(src, dst)
    monkeypatch.setattr(output.os, "rename", fail_moving_scratch_in)
    with pytest.raises(OSError):
        with result_dir(out) as scratch:
            (scratch / "summary.json").write_text("new json")
    assert snapshot(out) == before and leftovers(tmp_path) == []


def test_result_dir_writes_through_a_symlinked_folder(tmp_path):
    real = old_folder(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(real)
    with result_dir(link) as scratch:
        (scratch / "summary.json").write_text("new json")
    assert link.is_symlink() and (real / "summary.json").read_text() == "new json"
    assert (real / "notes.txt").read_text() == "mine" and leftovers(tmp_path) == []


def test_a_log_gets_a_progress_line_every_30_s_of_a_long_run(capsys):
    now = [0.0]
    bar = output.LogProgress(get_time=lambda: now[0], disable=True)
    with bar:
        task = bar.add_task("evaluating", total=10)
        quiet = bar.add_task("stage", total=None)
        for t, k in ((20.0, task), (40.0, task), (50.0, task), (75.0, quiet)):
            now[0] = t
            bar.advance(k)
    # t=20: under 30 s, nothing. t=40: 2 done; rich's speed: 1 step between the samples at 20 and
    # 40 s, so 8 left take 160 s. t=50: 10 s since the last line. t=75: a task without a total.
    assert capsys.readouterr().err.splitlines() == ["evaluating: 2/10 (20 %), 40s elapsed, ~2m40s left",
                                                    "stage: 1, 1m15s elapsed"]


def test_progress_draws_no_bar_into_a_log():
    assert isinstance(output.progress("x", None), output.LogProgress)     # pytest's stderr is no terminal
    assert output._clock(3725.0) == "1h02m" and output._clock(59.6) == "1m00s"
