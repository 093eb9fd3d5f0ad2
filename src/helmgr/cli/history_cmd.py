"""`helmgr history`: build a store of users' histories from a log, and count what it holds."""
from __future__ import annotations

from pathlib import Path

import click

from helmgr.cli.output import emit_json, json_option, stderr, stdout, table
from helmgr.core.errors import HelmInputError
from helmgr.workload import FORMATS


REDIS = click.option("--redis", "redis_url", default=None, metavar="URL",
                     help="A store in Redis (redis://host:port/db, unix:///path.sock) instead of a folder.")


@click.group("history")
def history() -> None:
    """Users' action histories in a folder or in Redis: built from a log, read by position,
    appended durably (an acknowledged append survives a crash and a restart)."""


@history.command("build")
@click.option("--trace", type=click.Path(dir_okay=False), required=True, help="The log.")
@click.option("--trace-format", type=click.Choice(FORMATS), default="inter", show_default=True,
              help="inter: RecBole atomic file; sequences: 'user item item ...' per line.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The store's folder (must not exist).")
@REDIS
@json_option
def build_cmd(trace, trace_format, out_dir, redis_url, as_json):
    """Every user's items in time order, from the log, into a folder (--out) or Redis (--redis);
    users and items are the log's dense ids.

    \b
    helmgr history build --trace ml-100k.inter --out hist/
    helmgr history build --trace amazon-beauty.txt --trace-format sequences --out hist/
    helmgr history build --trace ml-100k.inter --redis redis://localhost:6379/0
    """
    from helmgr.history import build
    from helmgr.workload.trace import read_trace

    where = _one_store(out_dir, redis_url)
    log = read_trace(trace, trace_format)
    cols = (log.user, log.item, log.time, log.n_users, log.n_items)
    if redis_url is not None:
        from helmgr.history.redis_store import build_redis, connect
        store = build_redis(connect(redis_url), *cols, source=str(trace))
    else:
        store = build(out_dir, *cols, source=str(trace))
    with store:
        _show(store.stat(), f"built {where}", as_json)


@history.command("stat")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path), required=False)
@REDIS
@json_option
def stat_cmd(folder, redis_url, as_json):
    """Users and actions the store (FOLDER, or --redis) holds: its log's, and every acknowledged
    append. It only reads: a torn journal tail is counted, and left for the next writer to cut."""
    from helmgr.history import HistoryStore

    where = _one_store(folder, redis_url, "FOLDER")
    if redis_url is not None:
        from helmgr.history.redis_store import RedisStore, connect
        store = RedisStore(connect(redis_url))
    else:
        store = HistoryStore(folder, read_only=True)
    with store:
        _show(store.stat(), where, as_json)


def _one_store(folder, redis_url, name: str = "--out") -> str:
    if (folder is None) == (redis_url is None):
        raise click.UsageError(f"name the store: {name} or --redis, one of them")
    if redis_url is not None and not redis_url.strip():
        raise HelmInputError(f"--redis {redis_url!r} is empty: give a URL (redis://host:port/db, unix:///path.sock)")
    return redis_url if redis_url is not None else str(folder)


def _show(stat: dict, title: str, as_json: bool) -> None:
    if as_json:
        emit_json(stat)
    else:
        stdout.print(table(title, stat))
        if stat["torn_bytes_left"]:
            stderr.print(f"[yellow]journal.bin ends in {stat['torn_bytes_left']} bytes that are no whole append "
                         f"(torn or corrupt, never acknowledged): left as is, the next writer cuts them[/yellow]")
