"""Output shared by the commands: JSON on stdout, tables and progress on stderr, and result
folders written whole or not at all."""
from __future__ import annotations

import json
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

stderr = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
stdout = Console()

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout and nothing else there.")
out_option = click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                          help="Write JSON, Markdown and PNG plots to this folder.")


def emit_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def _fmt(v) -> str:
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


def progress(description: str, total: float | None) -> Progress:
    """A progress bar on stderr; silent when stderr is not a terminal."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=stderr, transient=True,
                    disable=not sys.stderr.isatty())


@contextmanager
def result_dir(out_dir: Path | None) -> Iterator[Path | None]:
    """Yield a scratch folder; on success its files move into `out_dir` (created if needed).
    On any error nothing is written there."""
    if out_dir is None:
        yield None
        return
    if out_dir.exists() and not out_dir.is_dir():
        raise HelmInputError(f"--out {str(out_dir)!r} exists and is not a folder")
    parent = out_dir.resolve().parent
    if not parent.exists():
        raise HelmInputError(f"--out {str(out_dir)!r}: parent folder {str(parent)!r} does not exist")
    scratch = Path(tempfile.mkdtemp(prefix=".helmgr-", dir=parent))
    try:
        yield scratch
        out_dir.mkdir(exist_ok=True)
        for f in scratch.iterdir():
            os.replace(f, out_dir / f.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
