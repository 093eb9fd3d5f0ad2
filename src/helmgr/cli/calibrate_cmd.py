"""`helmgr calibrate`: measure the real data path on this device and write a profile the simulator loads."""
from __future__ import annotations

from pathlib import Path

import click

from helmgr.cli.output import emit_json, json_option, progress, stderr, stdout, table
from helmgr.cli.types import POSITIVE, SEED, Finite
from helmgr.core.extras import require


@click.command("calibrate")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where to measure (cuda: the current CUDA device).")
@click.option("--out", "out_path", type=click.Path(path_type=Path), required=True,
              help="Hardware profile to write (.toml); the model profile goes beside it as <name>.model.toml.")
@click.option("--model", default="small", show_default=True, help="Model preset the runtime runs ...")
@click.option("--shrink", type=click.IntRange(min=1), default=None,
              help="... with d_qk, d_v, d_model and emb_dim divided by this [default: cpu 16, cuda 1].")
@click.option("--candidates", type=click.IntRange(1, 1 << 20), default=None,
              help="Candidates per request [default: cpu 64, cuda 512].")
@click.option("--n-items", type=click.IntRange(min=1), default=None,
              help="Rows of the synthetic host embedding table [default: cpu 100,000, cuda 200,000].")
@click.option("--pool-mib", type=POSITIVE, default=None,
              help="The runtime's pool budget, EMB + KV [default: cpu 48, cuda 2048].")
@click.option("--ratio", type=Finite(0.05, 0.95), default=0.3, show_default=True,
              help="EMB share of the pool.")
@click.option("--max-tokens", type=click.IntRange(min=8), default=None,
              help="Longest history measured [default: cpu 1024, cuda 4096].")
@click.option("--max-batch", type=click.IntRange(min=1, max=1024), default=8, show_default=True,
              help="Largest batch measured for the batch-efficiency curve (batches of 1, 2, 4, ... up to it).")
@click.option("--repeats", type=click.IntRange(1, 1000), default=7, show_default=True,
              help="Timed runs per point (median); lookups, copies and gathers take at least 15.")
@click.option("--warmup", type=click.IntRange(0, 1000), default=2, show_default=True, help="Untimed runs first.")
@click.option("--threads", type=click.IntRange(1, 256), default=1, show_default=True, help="torch CPU threads.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@json_option
def calibrate_cmd(device, out_path, model, shrink, candidates, n_items, pool_mib, ratio, max_tokens, max_batch,
                  repeats, warmup, threads, seed, as_json):
    """Measure EMB lookups, H2D copies, host gathers, request compute and batched compute on this
    device, fit the cost model's constants (the batch-efficiency curve included), and write a
    hardware profile (+ its model profile) for the simulator.

    \b
    helmgr calibrate --device cpu --out cpu.toml
    helmgr simulate --hardware cpu.toml --model cpu.model.toml
    """
    require("real", what="helmgr calibrate")
    import torch

    from helmgr.real.calibrate import CalibrateConfig, calibrate, total_steps
    from helmgr.real.calibrated_toml import check_out, write_profiles

    check_out(out_path)
    cfg = CalibrateConfig.for_device(device, model=model, shrink=shrink, candidates=candidates, n_items=n_items,
                                     pool_mib=pool_mib, ratio=ratio, max_tokens=max_tokens, max_batch=max_batch,
                                     repeats=repeats, warmup=warmup, seed=seed).validate()
    torch.set_num_threads(threads)
    with progress("calibrate", None) as bar:
        task = bar.add_task(f"calibrate on {device}", total=total_steps(cfg))
        cal = calibrate(cfg, lambda name: bar.update(task, advance=1, description=f"calibrate: {name}"))
    hw_path, model_path = write_profiles(cal, out_path)
    if as_json:
        emit_json(cal.summary() | {"out": str(hw_path), "model_out": str(model_path)})
        return
    stdout.print(table(f"{cal.hardware.name}: {cal.device_name}", {
        k: getattr(cal.hardware, k) for k in ("hbm_bw_gbs", "pcie_bw_gbs", "pcie_latency_us", "peak_tflops",
                                              "compute_efficiency", "launch_us", "host_lookup_ns", "batch_efficiency",
                                              "batch_half_rows", "batch_request_us")}))
    stderr.print(f"wrote {hw_path} and {model_path}:  helmgr simulate --hardware {hw_path} --model {model_path}")
