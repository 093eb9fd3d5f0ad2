"""`helmgr serve` (the app on a Ray cluster) and `helmgr loadgen` (replay a workload against it)."""
from __future__ import annotations

import os
import signal
import time

import click

from helmgr.cli.output import (check_out, emit_json, json_option, json_text, markdown_table, out_option, progress,
                               result_dir, stderr, table)
from helmgr.cli.simulate_cmd import GROUP_SHOWN, fairness_line, group_rows
from helmgr.cli.types import NON_NEGATIVE, POSITIVE, SEED, Finite
from helmgr.core.classes import load_table
from helmgr.core.errors import HelmInputError
from helmgr.core.profiles import MIB
from helmgr.core.validate import check_host_memory
from helmgr.core.extras import require
from helmgr.serve.config import ServeConfig


@click.command("serve")
@click.option("--replicas", type=click.IntRange(min=1), default=2, show_default=True,
              help="Backend replicas: one per node (CPU process here, GPU on a GPU cluster).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="HTTP port.")
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP host (0.0.0.0: every interface).")
@click.option("--address", default=None,
              help="Join this Ray cluster (e.g. auto, or ray://head:10001) instead of starting a local one.")
@click.option("--num-cpus", type=click.IntRange(min=1), default=None,
              help="Logical CPUs of the local Ray cluster [default: this machine's].")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="Ray's own Prometheus export port (local cluster) [default: random]; "
                   "the app's metrics are at URL/metrics.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cuda: each replica takes one GPU.")
@click.option("--replica-cpus", type=NON_NEGATIVE, default=0.25, show_default=True,
              help="Ray logical CPUs per replica.")
@click.option("--pool-mib", type=POSITIVE, default=48.0, show_default=True,
              help="Each node's pool, EMB + KV.")
@click.option("--ratio", type=Finite(0.05, 0.95), default=0.3, show_default=True,
              help="Initial EMB share of each pool.")
@click.option("--hardware", default=None,
              help="Hardware preset or calibrated TOML (helmgr calibrate) for the router's cost model "
                   "[default: cpu-ref, a CPU profile measured on the development VM, on CPU; a100-80g on cuda].")
@click.option("--slo-ms", type=POSITIVE, default=50.0, show_default=True,
              help="The controllers' latency objective.")
@click.option("--deadline-ms", type=POSITIVE, default=None,
              help="A request not answered by then is cut: 504, and its replica does not start it "
                   "[default: 20 x --slo-ms].")
@click.option("--max-cost-ms", type=POSITIVE, default=None,
              help="Refuse (422) a request whose predicted service with nothing cached is above this "
                   "[default: 2 x --slo-ms].")
@click.option("--max-body-kib", type=click.IntRange(1, 1 << 20), default=1024, show_default=True,
              help="Refuse (413) a larger request body before reading it.")
@click.option("--no-controller", is_flag=True, help="Keep every ratio fixed.")
@click.option("--seed", type=SEED, default=0, show_default=True,
              help="Model weights and item table (without --model), the synthetic users' histories (without a store).")
@click.option("--history", "history_dir", type=click.Path(file_okay=False), default=None,
              help="Users' histories from this store (helmgr history build); each served request's new items "
                   "are appended to it [default: the synthetic population].")
@click.option("--redis", "redis_url", default=None, metavar="URL", help="... or from the store in this Redis.")
@click.option("--model", "model_dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Model weights and item table from this checkpoint (helmgr model train) [default: seeded random].")
@click.option("--base-policy", type=click.Path(exists=True, dir_okay=False), default=None, metavar="FILE",
              help="The controllers' base policy from this file (helmgr train, e.g. --trace on your log) "
                   "[default: the shipped one].")
@click.option("--classes", default=None, metavar="NAME|FILE", callback=lambda ctx, param, value: _table_name(value),
              help="SLO classes and tenants (a shipped table, e.g. surfaces, or a TOML file): a request may name its "
                   "tenant or class (unknown: 422); a sheddable class's request its replica cannot serve within "
                   "the class's target is refused, 429; metrics labelled by class.")
def serve_cmd(replicas, port, host, address, num_cpus, metrics_port, device, replica_cpus, pool_mib, ratio, hardware,
              slo_ms, deadline_ms, max_cost_ms, max_body_kib, no_controller, seed, history_dir, redis_url, model_dir,
              base_policy, classes):
    """Serve recommendations over HTTP: backend replicas with real caches, the HELM router, an
    ingress at POST /v1/recommend. Blocks until Ctrl-C.

    \b
    helmgr serve --replicas 2 --port 8000
    curl -s localhost:8000/v1/recommend -H 'content-type: application/json' \\
         -d '{"user_id": 5, "new_items": [1, 2], "candidates": [3, 4, 5]}'
    """
    require("serve", what="helmgr serve")
    from helmgr.core.profiles import load_hardware
    from helmgr.serve.app import check_listen, start, stop

    hardware = hardware or ("cpu-ref" if device == "cpu" else "a100-80g")
    load_hardware(hardware)                         # an unknown name or bad file: exit 2 now, not in a replica
    if address is None:
        check_listen(host, port)                    # an unknown host or a port in use: exit 2 before Ray starts
    cfg = ServeConfig(replicas=replicas, device=device, replica_cpus=replica_cpus, pool_mib=pool_mib, ratio=ratio,
                      hardware=hardware, slo_ms=slo_ms, deadline_ms=deadline_ms, max_cost_ms=max_cost_ms,
                      max_body_bytes=max_body_kib * 1024, controller=not no_controller, seed=seed,
                      history=history_dir, redis=redis_url, checkpoint=model_dir,
                      base_policy=base_policy, classes=classes).with_sources().validate()
    if address is None:
        check_fits_here(cfg, num_cpus)            # a local cluster that could not place its replicas would hang
    if not hardware.endswith(".toml"):                # (after every check: an error stays one line)
        stderr.print(f"note: the router prices requests with the {hardware} preset; for this machine's own figures "
                     f"run helmgr calibrate --device {device} --out hw.toml and pass --hardware hw.toml")
    stderr.print(f"starting {replicas} replicas ({device}) ...")
    try:
        url = start(cfg, port=port, host=host, address=address, num_cpus=num_cpus, metrics_port=metrics_port)
        # stop cleanly on SIGTERM too (background jobs ignore Ctrl-C); after ray.init, which sets its own
        signal.signal(signal.SIGTERM, _interrupt)
        stderr.print(f"limits: deadline {cfg.deadline_s * 1e3:g} ms, cost cap {cfg.max_cost_s * 1e3:g} ms, "
                     f"body {cfg.max_body_bytes} bytes; replicas warm")
        stderr.print(f"serving at {url}  (POST {url}/v1/recommend, GET {url}/healthz, {url}/metrics); Ctrl-C stops")
        click.echo(url)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        stderr.print("stopping ...")
    finally:
        stop()


def check_fits_here(cfg: ServeConfig, num_cpus: int | None) -> None:
    """A local Ray cluster can place the app: a GPU for each replica with --device cuda, Ray CPUs
    for the replicas and the ingress, and host memory for the replicas' pools on CPU."""
    cpus = num_cpus or os.cpu_count() or 1
    if (cfg.replicas + 1) * cfg.replica_cpus > cpus:
        raise HelmInputError(f"--replicas {cfg.replicas} and the ingress at --replica-cpus {cfg.replica_cpus:g} need "
                             f"{(cfg.replicas + 1) * cfg.replica_cpus:g} Ray CPUs; this local cluster has {cpus}")
    if cfg.device == "cuda":
        import torch
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < cfg.replicas:
            raise HelmInputError(f"--device cuda takes a GPU a replica: {cfg.replicas} replicas, this machine has "
                                 f"{gpus}")
    else:
        check_host_memory(cfg.replicas * cfg.pool_mib * MIB, f"--replicas {cfg.replicas} x --pool-mib {cfg.pool_mib:g}")


def _table_name(name_or_path: str | None) -> str | None:
    """`--classes`: the table checked while the options are parsed (a bad one: exit 2 before any
    work), named as the replicas will read it (a file by its absolute path)."""
    if name_or_path is None:
        return None
    load_table(name_or_path)
    return os.path.abspath(name_or_path) if name_or_path.endswith(".toml") else name_or_path


def _interrupt(signum, frame):
    raise KeyboardInterrupt


SHOWN = ("requests", "completed", "shed", "errors", "p50_ms", "p95_ms", "p99_ms", "p999_ms", "slo_ms", "slo_attainment",
         "throughput_rps", "goodput_rps", "emb_hit_rate", "kv_hit_rate", "mean_ratio", "appended", "wall_s")
CHECKED = ("score_checked", "score_mismatch", "score_unchecked", "score_max_diff")     # with --model


@click.command("loadgen")
@click.option("--url", default="http://127.0.0.1:8000", show_default=True, help="The app (helmgr serve).")
@click.option("--workload", "regime", default="steady", show_default=True,
              help="Synthetic regime: steady, trend, burst, or trend+burst.")
@click.option("--duration", type=POSITIVE, default=20.0, show_default=True,
              help="Seconds of arrivals.")
@click.option("--rps", type=POSITIVE, default=20.0, show_default=True,
              help="Base request rate.")
@click.option("--concurrency", type=click.IntRange(min=1), default=32, show_default=True,
              help="Requests out at once, at most.")
@click.option("--max-requests", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Stop after this many requests.")
@click.option("--slo-ms", type=POSITIVE, default=50.0, show_default=True)
@click.option("--timeout", "timeout_s", type=POSITIVE, default=30.0,
              show_default=True, help="Seconds a request may take before it counts as an error.")
@click.option("--seed", type=SEED, default=None,
              help="Seed of the request stream [default: the app's: its users' own next requests]; another "
                   "seed replays other requests of the same users (e.g. to load a warmed app with new ones).")
@click.option("--sim", "with_sim", is_flag=True,
              help="Also run the same requests through the simulator (the app's nodes, cost profile and "
                   "controller) and show the two side by side.")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Replay this log's requests in its time order at --rps (an app serving a history store).")
@click.option("--trace-format", type=click.Choice(["inter", "sequences"]), default="inter", show_default=True,
              help="inter: RecBole atomic file; sequences: 'user item item ...' per line.")
@click.option("--model", "model_dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="With --trace: the checkpoint the app serves (helmgr serve --model); every answer's scores are "
                   "checked against the model computed from scratch (score_mismatch).")
@click.option("--resume", is_flag=True,
              help="With --trace: continue a replay that stopped (the app or loadgen killed): skip the requests "
                   "whose items the app's store already holds, send the rest.")
@json_option
@out_option
def loadgen_cmd(url, regime, duration, rps, concurrency, max_requests, slo_ms, timeout_s, seed, with_sim, trace,
                trace_format, model_dir, resume, as_json, out_dir):
    """Replay the synthetic workload (or a log, --trace) against a serving app over HTTP; report
    latency, SLO attainment, throughput, hit rates, errors and the actions appended to its store.

    \b
    helmgr loadgen --url http://127.0.0.1:8000 --workload steady --duration 20 --rps 20 --json
    helmgr loadgen --duration 30 --rps 8 --sim        # next to the simulator on the same requests
    helmgr loadgen --trace ml-100k.inter --duration 60 --rps 20   # against helmgr serve --history DIR
    helmgr loadgen --trace ml-100k.inter --model model/ --sim     # ... --model model/: scores checked
    """
    require("serve", "aiohttp", what="helmgr loadgen")       # the HTTP client; --sim runs the simulator as well
    from helmgr.serve.answers import PARTS
    from helmgr.serve.loadgen import LoadConfig, loadgen, server_config, sim_base_policy, simulated
    from helmgr.workload import parse_regime

    parse_regime(regime)
    check_out(out_dir)                            # before the load: a run cannot be sent twice to a store
    if resume and with_sim:
        raise click.UsageError("--sim simulates a whole replay; it cannot go with --resume")
    load = LoadConfig(url, regime, duration, rps, concurrency, max_requests, slo_ms, timeout_s, seed, trace, trace_format,
                      model_dir, resume)
    cfg = server_config(url)
    if with_sim:
        sim_base_policy(cfg)                      # the app's base policy must be readable here: exit 2 now
    with progress("loadgen", None) as bar:
        task = bar.add_task(f"loadgen {trace or regime} at {rps:g} req/s", total=None)
        result = loadgen(load, lambda n: bar.update(task, total=n), lambda: bar.advance(task), cfg)
    if with_sim:
        sim = simulated(cfg, load)
        if sim["requests"] != result["requests"]:
            stderr.print(f"[yellow]note: the simulator ran all {sim['requests']} requests of the workload, "
                         f"loadgen sent {result['requests']} (--max-requests)[/yellow]")
        result["simulated"] = {k: sim.get(k) for k in SHOWN if k in sim} | {"policy": sim["policy"],
                                                                              "router": sim["router"],
                                                                              "base_policy": sim["base_policy"]}
    shown = {k: result[k] for k in SHOWN + CHECKED if k in result}
    headers = ("value",)
    if with_sim:
        shown = {k: (v, result["simulated"].get(k, float("nan"))) for k, v in shown.items()}
        headers = ("served", "simulated")
    title = f"loadgen {trace or regime}, {rps:g} req/s for {duration:g} s"
    with result_dir(out_dir) as scratch:
        if scratch is not None:
            (scratch / "loadgen.json").write_text(json_text(result))
            groups = ("" if "classes" not in result else "\n" + markdown_table(group_rows(result), GROUP_SHOWN)
                      + f"\n{fairness_line(result['fairness'])}\n")
            (scratch / "loadgen.md").write_text(f"# {title} against {url}\n\n" + markdown_table(shown, headers) + groups)
    if as_json:
        emit_json(result)
    else:
        stderr.print(table(title, shown, headers))
        if "classes" in result:
            stderr.print(table("per class and tenant", group_rows(result), GROUP_SHOWN))
            stderr.print(fairness_line(result["fairness"]))
        stderr.print(f"requests per node: {result['requests_per_node']}")
        if result["split_ms"]:
            stderr.print("a request's time, ms (p50 / p99 of each part): " + ", ".join(
                f"{part[:-3]} {result['split_ms']['p50'][part]:.1f} / {result['split_ms']['p99'][part]:.1f}"
                for part in PARTS))
