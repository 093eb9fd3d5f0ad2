"""`helmgr model`: the runtime's HSTU trained on a log (next-item prediction), saved as a checkpoint
folder that `helmgr serve --model` loads, and evaluated (HR@10, NDCG@10) beside popularity."""
from __future__ import annotations

import time
from pathlib import Path

import click

from helmgr.cli.output import check_out, emit_json, json_option, progress, stdout, table
from helmgr.cli.types import SEED, Finite
from helmgr.core.errors import HelmInputError
from helmgr.core.extras import require
from helmgr.core.validate import check_host_memory
from helmgr.workload import FORMATS

STEPS_MAX = 10_000_000       # 2,500 times the default: a typo, not a run, past it
LR_MAX = 1.0                 # Adam moves every weight by up to the rate a step: past 1 a run only diverges

TRACE = (click.option("--trace", type=click.Path(dir_okay=False), required=True, help="The log."),
         click.option("--trace-format", type=click.Choice(FORMATS), default="inter", show_default=True,
                      help="inter: RecBole atomic file; sequences: 'user item item ...' per line."))
EVAL_USERS = click.option("--eval-users", type=click.IntRange(min=1), default=2000, show_default=True,
                          help="Users evaluated (a seeded sample when the log has more).")


def _trace(f):
    for opt in reversed(TRACE):
        f = opt(f)
    return f


@click.group("model")
def model() -> None:
    """The HSTU model the serving replicas run: trained on a log, kept in a checkpoint folder."""


@model.command("train")
@_trace
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The checkpoint folder (must not exist).")
@click.option("--steps", type=click.IntRange(1, STEPS_MAX), default=4000, show_default=True,
              help=f"Optimizer steps (at most {STEPS_MAX:,}).")
@click.option("--preset", default="small", show_default=True, help="Model preset ...")
@click.option("--shrink", type=click.IntRange(min=1), default=16, show_default=True,
              help="... with every width divided by this (what `helmgr serve` runs).")
@click.option("--lr", type=Finite(min=0, max=LR_MAX, min_open=True), default=3e-3, show_default=True,
              help="Adam's learning rate (a run whose loss stops being finite is refused, naming the step).")
@click.option("--seed", type=SEED, default=0, show_default=True)
@EVAL_USERS
@json_option
def train_cmd(trace, trace_format, out_dir, steps, preset, shrink, lr, seed, eval_users, as_json):
    """Train on next-item prediction (each user's last item held out), save the weights and the
    item table, and report HR@10 / NDCG@10 on the held-out items beside popularity's.

    \b
    helmgr model train --trace ml-100k.inter --out model/
    helmgr model train --trace amazon-beauty.txt --trace-format sequences --out model/
    """
    require("real", what="helmgr model train")
    from helmgr.real import checkpoint, nextitem
    from helmgr.real.runtime import runtime_model
    from helmgr.workload.trace import read_trace

    if out_dir.exists():
        raise HelmInputError(f"checkpoint folder {str(out_dir)!r} already exists: remove it or name another")
    check_out(out_dir)
    try:
        runtime_model(preset, shrink)
    except ValueError as exc:
        raise HelmInputError(f"--preset {preset!r} --shrink {shrink}: {exc}") from None
    seqs = nextitem.Sequences.from_log(read_trace(trace, trace_format, seed))
    cfg = nextitem.TrainConfig(preset=preset, shrink=shrink, steps=steps, lr=lr, seed=seed, eval_users=eval_users)
    _check_memory(cfg, seqs.n_items)
    t0 = time.perf_counter()
    with progress("model train", steps) as bar:
        task = bar.add_task(f"next-item training on {Path(trace).name}", total=steps)
        try:
            net, items, loss = nextitem.train(seqs, cfg, lambda n, _: bar.update(task, completed=n))
        except (MemoryError, RuntimeError) as exc:          # torch's allocator: a RuntimeError naming memory
            if not isinstance(exc, MemoryError) and "memory" not in str(exc).lower():
                raise
            raise HelmInputError(f"--preset {preset} --shrink {shrink} ran out of memory while training (a process "
                                 "memory limit is below the estimate's half of the machine?): raise --shrink") from None
    train_s = time.perf_counter() - t0
    scores = nextitem.evaluate(net, items, seqs, eval_users, seed)
    info = {"trace": Path(trace).name, "trace_format": trace_format, "users": len(seqs.offsets) - 1,
            "actions": len(seqs.items), "training": {**nextitem.describe(cfg), "final_loss": round(loss, 4),
                                                      "wall_s": round(train_s, 1)},
            "held_out_last_item": scores}
    checkpoint.save(out_dir, net, items, preset, shrink, info)
    _show({"out": str(out_dir), **info}, as_json)


@model.command("eval")
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="A checkpoint folder (helmgr model train) ...")
@click.option("--url", default=None, help="... or a serving app (helmgr serve --history DIR --model DIR, the store "
                                          "built from this log): its scores, over HTTP.")
@_trace
@click.option("--seed", type=SEED, default=0, show_default=True, help="The sample of users (with --eval-users).")
@EVAL_USERS
@json_option
def eval_cmd(model_dir, url, trace, trace_format, seed, eval_users, as_json):
    """HR@10 / NDCG@10 of a checkpoint (or of a serving app's answers) on each user's last item of
    a log, beside popularity's (the model sees the rest of the user's history, as a served request
    would).

    \b
    helmgr model eval --model model/ --trace ml-100k.inter
    helmgr model eval --url http://127.0.0.1:8000 --trace ml-100k.inter     # the same through HTTP
    """
    require("real", what="helmgr model eval")
    from helmgr.real import checkpoint, nextitem
    from helmgr.workload.trace import read_trace

    if (model_dir is None) == (url is None):
        raise click.UsageError("name what to evaluate: --model DIR or --url URL, one of them")
    if url is not None:
        from helmgr.serve.loadgen import server_config
        server_config(url)                          # an app answering at the URL, before the log is read
    seqs = nextitem.Sequences.from_log(read_trace(trace, trace_format, seed))
    if url is not None:
        from helmgr.serve.verify import http_ranks
        users = nextitem.eval_users(seqs, eval_users, seed)
        held = {"model": nextitem.ranking(http_ranks(url, seqs, users)).to_dict(),
                "popularity": nextitem.ranking(nextitem.popularity_ranks(seqs, users)).to_dict()}
        _show({"url": url, "trace": Path(trace).name, "held_out_last_item": held}, as_json)
        return
    ckpt = checkpoint.load(model_dir)
    if seqs.n_items > ckpt.n_items:
        raise HelmInputError(f"the log has {seqs.n_items} items, checkpoint {str(model_dir)!r} has rows for "
                             f"{ckpt.n_items}")
    _show({"model": str(model_dir), "trace": Path(trace).name,
           "held_out_last_item": nextitem.evaluate(ckpt.model, ckpt.table, seqs, eval_users, seed)}, as_json)


def _check_memory(cfg, n_items: int) -> None:
    """Refuse, before the model is built, a training whose memory estimate is over half this
    machine's memory."""
    from helmgr.real.nextitem import train_memory_bytes
    check_host_memory(train_memory_bytes(cfg, n_items),
                      f"--preset {cfg.preset} --shrink {cfg.shrink} on {n_items:,} items")


def _show(result: dict, as_json: bool) -> None:
    if as_json:
        emit_json(result)
        return
    held = result["held_out_last_item"]
    rows = {name: (held[name]["hr@10"], held[name]["ndcg@10"], held[name]["users"]) for name in ("model", "popularity")}
    stdout.print(table(f"held-out last item, {result['trace']}", rows, ("HR@10", "NDCG@10", "users")))
    if "out" in result:
        t = result["training"]
        stdout.print(f"checkpoint -> {result['out']}  ({t['steps']} steps, {t['wall_s']:.0f} s, "
                     f"final loss {t['final_loss']:.3f})")
