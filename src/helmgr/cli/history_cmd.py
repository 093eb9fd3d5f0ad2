"""`helmgr history`: build a store of users' histories from a log, and count what it holds."""
from __future__ import annotations

from pathlib import Path

import click

from helmgr.cli.output import emit_json, json_option, stderr, stdout, table
from helmgr.workload import FORMATS


@click.group("history")
def history() -> None:
    """Users' action histories on disk (a folder): built from a log, read by position, appended
    durably (an acknowledged append survives a crash and a restart)."""


@history.command("build")
@click.option("--trace", type=click.Path(dir_okay=False), required=True, help="The log.")
@click.option("--trace-format", type=click.Choice(FORMATS), default="inter", show_default=True,
              help="inter: RecBole atomic file; sequences: 'user item item ...' per line.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The store's folder (must not exist).")
@json_option
def build_cmd(trace, trace_format, out_dir, as_json):
    """Every user's items in time order, from the log; users and items are the log's dense ids.

    \b
    helmgr history build --trace ml-100k.inter --out hist/
    helmgr history build --trace amazon-beauty.txt --trace-format sequences --out hist/
    """
    from helmgr.history import build
    from helmgr.workload.trace import read_trace

    log = read_trace(trace, trace_format)
    with build(out_dir, log.user, log.item, log.time, log.n_users, log.n_items, source=str(trace)) as store:
        _show(store.stat(), f"built {out_dir}", as_json)


@history.command("stat")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@json_option
def stat_cmd(folder, as_json):
    """Users and actions the store holds: its log's, and every acknowledged append."""
    from helmgr.history import HistoryStore

    with HistoryStore(folder) as store:
        _show(store.stat(), str(folder), as_json)


def _show(stat: dict, title: str, as_json: bool) -> None:
    if as_json:
        emit_json(stat)
    else:
        stdout.print(table(title, stat))
        if stat["torn_bytes_cut"]:
            stderr.print(f"[yellow]a torn last append ({stat['torn_bytes_cut']} bytes, never acknowledged) was cut[/yellow]")
