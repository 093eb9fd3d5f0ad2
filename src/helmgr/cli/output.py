"""Output shared by the commands: strict JSON and result tables on stdout, progress and
diagnostics on stderr, and result folders written whole or not at all."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from helmgr.core.errors import HelmInputError
from helmgr.core.files import check_writable, plain_mode
from helmgr.core.jsonsafe import dumps

stderr = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
stdout = Console(width=None if sys.stdout.isatty() else 160)

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout and nothing else there.")
out_option = click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                          help="Write JSON, Markdown and PNG plots to this folder.")


def emit_json(obj: dict) -> None:
    """The one strict JSON object on stdout (core.jsonsafe: non-finite numbers -> null + reason)."""
    sys.stdout.write(json_text(obj))


def json_text(obj: dict) -> str:
    """What `emit_json` prints and what result files hold."""
    return dumps(obj, indent=2) + "\n"


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _cells(v, n: int) -> list[str]:
    return [_fmt(x) for x in v] if n > 1 else [_fmt(v)]


def table(title: str, rows: dict, headers: tuple[str, ...] = ("value",)) -> Table:
    """field -> value; with several `headers`, field -> a tuple of values, one per header."""
    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("field")
    for h in headers:
        t.add_column(h, justify="right")
    for k, v in rows.items():
        t.add_row(k, *_cells(v, len(headers)))
    return t


def markdown_table(rows: dict, headers: tuple[str, ...] = ("value",)) -> str:
    lines = ["| field | " + " | ".join(headers) + " |", "|---|" + "---:|" * len(headers)]
    lines += [f"| {k} | " + " | ".join(_cells(v, len(headers))) + " |" for k, v in rows.items()]
    return "\n".join(lines) + "\n"


class LogProgress(Progress):
    """A progress bar for a log: stderr is not a terminal, so no bar is drawn; instead, once a
    run has gone on for `every_s` seconds, each update writes one plain line (at most one per
    `every_s`): "evaluating: 33/222 (15 %), 6m30s elapsed, ~38m left". A run shorter than that
    writes nothing."""

    def __init__(self, *columns, every_s: float = 30.0, **kw):
        super().__init__(*columns, **kw)
        self.every_s = every_s
        self._logged = self.get_time()

    def update(self, task_id, **kw) -> None:
        super().update(task_id, **kw)
        self._log(task_id)

    def advance(self, task_id, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._log(task_id)

    def _log(self, task_id) -> None:
        now = self.get_time()
        if now - self._logged < self.every_s:
            return
        self._logged = now
        with self._lock:
            task = self._tasks[task_id]
            done, total, elapsed, left = task.completed, task.total, task.elapsed, task.time_remaining
        line = f"{task.description}: {done:g}"
        if total:
            line += f"/{total:g} ({100.0 * done / total:.0f} %)"
        line += f", {_clock(elapsed or 0.0)} elapsed"
        if total and left is not None:
            line += f", ~{_clock(left)} left"
        print(line, file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    """1h02m, 6m30s or 42s."""
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


def progress(description: str, total: float | None) -> Progress:
    """A progress bar on stderr; when stderr is not a terminal (a log), a plain line every 30 s
    of a long run instead (`LogProgress`)."""
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    if sys.stderr.isatty():
        return Progress(*columns, console=stderr, transient=True)
    return LogProgress(*columns, console=stderr, transient=True, disable=True)


def check_out(out_dir: Path | None, option: str = "--out") -> None:
    """Refuse, before any work, a results folder that cannot be written whole: one that exists
    and is not a folder, whose parent is missing or not writable, a mount point, or the current
    folder (or one holding it), which the swap in `result_dir` would move aside."""
    if out_dir is None:
        return
    name = f"{option} {str(out_dir)!r}"
    if out_dir.exists() and not out_dir.is_dir():
        raise HelmInputError(f"{name} exists and is not a folder")
    target = Path(os.path.realpath(out_dir))
    parent = target.parent
    if not parent.is_dir():
        raise HelmInputError(f"{name}: parent folder {str(parent)!r} "
                             + ("is a file" if parent.exists() else "does not exist"))
    if target.is_dir() and (target == parent or os.path.ismount(target)):
        raise HelmInputError(f"{name} is a mount point; name a folder inside it")
    if Path.cwd().resolve().is_relative_to(target):
        raise HelmInputError(f"{name} is the current folder or holds it; name a results folder")
    check_writable(option, out_dir, parent, "a folder")  # what result_dir will do: a scratch folder beside it


@contextmanager
def result_dir(out_dir: Path | None) -> Iterator[Path | None]:
    """Yield a scratch folder beside `out_dir`; on success it becomes `out_dir`, on any error it
    is removed and `out_dir` is untouched. An existing `out_dir`'s other entries are carried over
    (hard links where possible), it is renamed aside, the scratch folder renamed into its place,
    and the old one removed; if the rename fails the old folder is put back."""
    if out_dir is None:
        yield None
        return
    check_out(out_dir)
    target = Path(os.path.realpath(out_dir))             # through a symlink: write where it points
    scratch = Path(tempfile.mkdtemp(prefix=".helmgr-", dir=target.parent))
    try:
        yield scratch
        _swap_in(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _swap_in(scratch: Path, target: Path) -> None:
    if not target.exists():
        scratch.chmod(plain_mode(0o777))                 # mkdtemp makes it 0700
        os.rename(scratch, target)
        return
    scratch.chmod(target.stat().st_mode & 0o7777)
    _carry(target, scratch)
    aside = scratch.with_name(scratch.name + "-old")
    os.rename(target, aside)
    try:
        os.rename(scratch, target)
    except BaseException:
        os.rename(aside, target)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _carry(old: Path, new: Path) -> None:
    """Entries of `old` that `new` lacks, into `new`; `old` is left as it was."""
    for src in old.iterdir():
        dst = new / src.name
        if dst.exists() or dst.is_symlink():
            continue
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif src.is_dir():
            shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(src, dst)


def _link_or_copy(src, dst) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)
