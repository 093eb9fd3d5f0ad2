"""Real data path vs the simulator's cost model: measured request latency next to the prediction.

    PYTHONPATH=src python benchmarks/bench_realpath.py --device cpu
    PYTHONPATH=src python benchmarks/bench_realpath.py --device cuda       # small model unshrunk, 512 candidates
    PYTHONPATH=src python benchmarks/bench_realpath.py --hardware cpu.toml      # cpu.model.toml beside it

Serves requests of the synthetic steady workload (generated over the runtime's item count, with
the runtime's candidates; on CPU with shorter histories) through `NodeRuntime`, one at a time,
and for each one asks `CostModel.breakdown(...)` under the calibrated profile, with the KV hit
and the rows fetched that the runtime saw. Without `--hardware` it calibrates (as `helmgr
calibrate`, same sizes) while it serves: the calibration's steps take turns with chunks of
requests, so that both see the same load on a shared machine. Then it serves the workload's next
requests in batches (`NodeRuntime.serve_batch`), FCFS, batches of 1, 2, 4 .. `--max-batch` taken in
turn, and prices each with `predicted_batch` (what `Node.serve_batch` charges: the requests' miss
paths on an idle link, the batch's lookups, `CostModel.batch_compute_s` on the calibrated
batch-efficiency curve). Each of `--passes` passes does all of it again on a fresh runtime; the
figures to read are the medians over passes.
Needs only torch, numpy and the repo (no click, rich or numba). Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from helmgr.core.costs import CostModel
from helmgr.core.errors import HelmInputError
from helmgr.core.records import NodeConfig
from helmgr.core.profiles import MIB, NodeProfile, load_hardware, load_model
from helmgr.real.calibrate import DEVICE_DEFAULTS, CalibrateConfig, batch_sizes, calibrate, check_device, total_steps
from helmgr.real.calibrated_toml import check_out, model_path, write_profiles
from helmgr.real.runtime import PAGE_MIB, NodeRuntime, RealRequest, predicted, predicted_batch
from helmgr.workload import default_config, synthetic_workload

LEN_MEDIAN = {"cpu": 200.0, "cuda": 1000.0}     # the workload's default is 1,000 (docs/workloads.md)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--requests", type=int, default=300, help="requests timed (after --warmup more)")
    ap.add_argument("--warmup", type=int, default=20, help="requests served first, not timed")
    ap.add_argument("--hardware", type=Path, help="calibrated hardware TOML [default: calibrate now]")
    ap.add_argument("--model", type=Path, help="its model TOML [default: <hardware stem>.model.toml]")
    ap.add_argument("--save", type=Path, help="write the profile calibrated now here (and its model TOML)")
    ap.add_argument("--shrink", type=int, help="model preset 'small' widths divided by this [cpu 16, cuda 1]")
    ap.add_argument("--candidates", type=int, help="candidates per request [cpu 64, cuda 512]")
    ap.add_argument("--n-items", type=int, help="rows of the synthetic host table [cpu 100,000, cuda 200,000]")
    ap.add_argument("--pool-mib", type=float, help="the runtime's pool budget [cpu 48, cuda 2048]")
    ap.add_argument("--ratio", type=float, default=0.3, help="EMB share of the pool")
    ap.add_argument("--len-median", type=float, help="workload history length median [cpu 200, cuda 1000] ...")
    ap.add_argument("--len-cap", type=int, help="... and cap, also the longest calibrated [cpu 1024, cuda 4096]")
    ap.add_argument("--rps", type=float, default=25.0, help="request rate of the workload")
    ap.add_argument("--max-batch", type=int, default=8, help="largest batch calibrated and served (1, 2, 4, ...)")
    ap.add_argument("--batch-rounds", type=int, default=20,
                    help="batched service: rounds of one batch of each size (0: none)")
    ap.add_argument("--repeats", type=int, default=7, help="calibration: runs per point")
    ap.add_argument("--passes", type=int, default=3,
                    help="calibrate (unless --hardware) then serve, this many times: a shared machine's load drifts")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = ap.parse_args(argv)
    sizes = DEVICE_DEFAULTS.get(args.device, DEVICE_DEFAULTS["cpu"])
    for name in ("shrink", "candidates", "n_items", "pool_mib"):
        if getattr(args, name) is None:
            setattr(args, name, sizes[name])
    args.len_cap = args.len_cap or sizes["max_tokens"]
    args.len_median = args.len_median or LEN_MEDIAN.get(args.device, 200.0)
    return args


def calibrate_config(args) -> CalibrateConfig:
    return CalibrateConfig(device=args.device, model="small", shrink=args.shrink, candidates=args.candidates,
                           n_items=args.n_items, pool_mib=args.pool_mib, ratio=args.ratio, max_tokens=args.len_cap,
                           max_batch=args.max_batch, repeats=args.repeats, seed=args.seed)


def requests(args, model, n: int):
    """The first `n` requests of the steady workload, as (user, prefix_len, new ids, candidate ids)."""
    duration = 2.0 * n / args.rps + 10.0
    cfg = default_config("steady", n_items=args.n_items, candidates=model.candidates, len_median=args.len_median,
                         len_cap=args.len_cap, rps=args.rps, duration_s=duration)
    wl = synthetic_workload(cfg, args.seed)
    out = []
    for chunk in wl.chunks():
        for i in range(len(chunk)):
            out.append(RealRequest(int(chunk.user[i]), int(chunk.prefix_len[i]), chunk.items(i), chunk.candidates(i)))
            if len(out) == n:
                return wl.history, out
    return wl.history, out


def run_pass(args, device: torch.device) -> dict:
    """Serve the requests on a fresh runtime and predict each under the profile. Unless --hardware
    is given, calibrate meanwhile: the calibration's steps take turns with chunks of requests, so
    that on a shared machine both see the same load (the fits never see the served requests)."""
    cfg = None if args.hardware else calibrate_config(args).validate()
    if cfg is None:
        hw, model = load_hardware(str(args.hardware)), load_model(str(args.model or model_path(args.hardware)))
    else:
        hw, model = load_hardware("a100-80g"), cfg.model_profile      # hw: a placeholder until calibrated
    rt = NodeRuntime(NodeProfile(hw, model, PAGE_MIB), int(args.pool_mib * MIB), device, args.seed, args.n_items,
                     NodeConfig(ratio=args.ratio))
    sizes = batch_sizes(args.max_batch) if args.batch_rounds > 0 else []
    history, reqs = requests(args, model, args.warmup + args.requests + args.batch_rounds * sum(sizes))
    batched_reqs, reqs = reqs[args.warmup + args.requests:], reqs[:args.warmup + args.requests]
    pending, served = iter(enumerate(reqs)), []

    def serve(n: int) -> None:
        for k, (user, prefix_len, new_ids, cand_ids) in itertools.islice(pending, n):
            s = rt.serve(0.0, user, prefix_len, new_ids, cand_ids, history)
            if k >= args.warmup:
                served.append((prefix_len, s))

    cal = None
    if cfg is not None:
        serve(args.warmup)
        steps = total_steps(cfg)
        done = iter(range(1, steps + 1))

        def step(name: str) -> None:
            print(f"\rcalibrating {next(done)}/{steps} {name:12}", end="", file=sys.stderr, flush=True)
            serve(-(-args.requests // steps))

        cal = calibrate(cfg, step)
        print(file=sys.stderr)
        hw, model = cal.hardware, cal.model
        if args.save is not None:
            write_profiles(cal, args.save)
    serve(len(reqs))
    batches = serve_batches(rt, history, batched_reqs, sizes)
    rt.check_integrity()
    cost = CostModel.from_profile(NodeProfile(hw, model, PAGE_MIB))
    emb_fixed = cal.fits["emb_fixed_us"] * 1e-6 if cal else 0.0
    rows = [row(cost, prefix_len, s, emb_fixed) for prefix_len, s in served]
    out = summarize(args, hw, model, cal, rt, rows)
    out["batched"] = [batched_split([batch_row(cost, b, emb_fixed) for b in batches if len(b.services) == n], n)
                      for n in sizes]
    return out


def serve_batches(rt: NodeRuntime, history, reqs: list[RealRequest], sizes: list[int]) -> list:
    """`reqs` in order, in batches of each size in `sizes` taken in turn (so that a shared
    machine's drift reaches every size alike)."""
    out, at = [], 0
    while sizes and at + sum(sizes) <= len(reqs):
        for n in sizes:
            out.append(rt.serve_batch(0.0, reqs[at:at + n], history))
            at += n
    return out


def batch_row(cost: CostModel, batch, emb_fixed: float) -> dict:
    """One batch's figures; the lookup's fixed cost, paid once per batch in the launch term, moves
    back from the predicted compute to the predicted EMB when it is known."""
    p = predicted_batch(cost, batch)
    return {"requests": len(batch.services), "misses": sum(s.kv_tokens == 0 for s in batch.services),
            "rows": p.rows, "measured_s": batch.service_s, "predicted_s": p.total_s, "emb_s": batch.emb_s,
            "pred_emb_s": p.fetch_s + p.lookup_s + emb_fixed, "compute_s": batch.kv_s + batch.compute_s + batch.score_s,
            "pred_compute_s": p.compute_s - emb_fixed}


def batched_split(rows: list[dict], size: int) -> dict:
    """Per batch size: measured and predicted batch time and their ratio, the parts, and the same
    ratio over the batches of KV hits only, of KV misses only, and of both mixed."""
    med = lambda key, rs=rows: statistics.median(r[key] for r in rs) if rs else float("nan")
    m, p = [r["measured_s"] for r in rows], [r["predicted_s"] for r in rows]
    for r in rows:
        r["ratio"] = r["predicted_s"] / r["measured_s"]
    kinds = {"hit_only": [r for r in rows if r["misses"] == 0],
             "miss_only": [r for r in rows if r["misses"] == r["requests"]],
             "mixed": [r for r in rows if 0 < r["misses"] < r["requests"]]}
    return {"batch": size, "batches": len(rows), "rows_p50": med("rows"),
            "measured_p50_ms": _pct(m, 50) * 1e3, "predicted_p50_ms": _pct(p, 50) * 1e3,
            "ratio_of_medians": _pct(p, 50) / _pct(m, 50) if rows else float("nan"), "median_ratio": med("ratio"),
            "measured_per_request_ms": _pct(m, 50) * 1e3 / size, "emb_ms": med("emb_s") * 1e3,
            "pred_emb_ms": med("pred_emb_s") * 1e3, "compute_ms": med("compute_s") * 1e3,
            "pred_compute_ms": med("pred_compute_s") * 1e3,
            **{k: {"batches": len(rs), "median_ratio": med("ratio", rs)}
               for k, rs in kinds.items()}}


def row(cost: CostModel, prefix_len: int, s, emb_fixed: float) -> dict:
    """One request's figures. The lookup's fixed cost sits in the profile's launch term; when it
    is known (calibrated now) it is moved back from the predicted compute to the predicted EMB."""
    b = predicted(cost, s, prefix_len)
    return {"prefix_len": prefix_len, "cached": s.kv_tokens, "tokens": s.tokens, "ids": s.ids,
            "rows_fetched": s.rows_fetched, "measured_s": s.service_s, "predicted_s": b.total_s,
            "emb_s": s.emb_s, "kv_s": s.kv_s, "compute_s": s.compute_s, "score_s": s.score_s,
            "pred_emb_s": b.lookup_s + b.host_s + b.transfer_s + emb_fixed, "pred_compute_s": b.compute_s - emb_fixed,
            "prefill_flops": cost.prefix_flops(s.tokens, s.kv_tokens)}


def run(args) -> dict:
    device = check_device(args.device)
    if args.save is not None:
        check_out(args.save, "--save")
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    passes = [run_pass(args, device) for _ in range(args.passes)]
    ratios = [p["all"]["ratio_of_medians"] for p in passes]
    batched = {b["batch"]: statistics.median(p["batched"][i]["ratio_of_medians"] for p in passes)
               for i, b in enumerate(passes[0]["batched"])}
    return {"passes": passes, "p50_ratio_per_pass": ratios, "p50_ratio_median": statistics.median(ratios),
            "median_ratio_per_pass": [p["all"]["median_ratio"] for p in passes], "batched_p50_ratio_median": batched}


def _pct(values, q) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def _split(rows, name: str) -> dict:
    m, p = [r["measured_s"] for r in rows], [r["predicted_s"] for r in rows]
    med = lambda key: statistics.median(r[key] for r in rows) * 1e3 if rows else float("nan")
    return {"class": name, "requests": len(rows),
            "measured_p50_ms": _pct(m, 50) * 1e3, "measured_p99_ms": _pct(m, 99) * 1e3,
            "predicted_p50_ms": _pct(p, 50) * 1e3, "predicted_p99_ms": _pct(p, 99) * 1e3,
            "ratio_of_medians": _pct(p, 50) / _pct(m, 50) if rows else float("nan"),
            "median_ratio": statistics.median(a / b for a, b in zip(p, m)) if rows else float("nan"),
            "emb_ms": med("emb_s"), "pred_emb_ms": med("pred_emb_s"),
            "kv_compute_score_ms": statistics.median(r["kv_s"] + r["compute_s"] + r["score_s"] for r in rows) * 1e3
            if rows else float("nan"), "pred_compute_ms": med("pred_compute_s")}


def summarize(args, hw, model, cal, rt, rows) -> dict:
    hits = [r for r in rows if r["cached"] > 0]
    misses = [r for r in rows if r["cached"] == 0]
    out = {"device": args.device, "hardware": hw.name, "model": model.name, "threads": torch.get_num_threads(),
           "calibrated_now": cal is not None, "kv_hit_rate": rt.stats.kv_hit_rate,
           "emb_hit_rate": rt.stats.emb_hit_rate,
           "all": _split(rows, "all"), "kv_hit": _split(hits, "kv hit"), "kv_miss": _split(misses, "kv miss"),
           "profile": {k: getattr(hw, k) for k in ("hbm_bw_gbs", "pcie_bw_gbs", "pcie_latency_us", "peak_tflops",
                                                   "compute_efficiency", "launch_us", "host_lookup_ns",
                                                   "batch_efficiency", "batch_half_rows", "batch_request_us")}}
    if args.device == "cuda":
        out["gpu"] = gpu_figures(hw, misses)
    return out


def gpu_figures(hw, misses) -> dict:
    """EMB gather and H2D bandwidth against the preset of the same GPU, prefill TFLOP/s."""
    name = torch.cuda.get_device_name().lower()
    preset = next((p for p in ("h200-141g", "h100-80g", "a100-80g") if p.split("-")[0] in name), None)
    ref = load_hardware(preset) if preset else None
    n = 1 << 28
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(5):
        b.copy_(a)
    torch.cuda.synchronize()
    copy_gbs = 2 * 5 * n / (time.perf_counter() - t) / 1e9
    prefill = [r["prefill_flops"] / r["compute_s"] for r in misses if r["compute_s"] > 0]
    return {"preset": preset, "emb_gather_gbs": hw.hbm_bw_gbs, "d2d_copy_gbs": copy_gbs,
            "preset_hbm_gbs": ref.hbm_bw_gbs if ref else None, "h2d_gbs": hw.pcie_bw_gbs,
            "preset_pcie_gbs": ref.pcie_bw_gbs if ref else None,
            "prefill_tflops": statistics.median(prefill) / 1e12 if prefill else None,
            "gemm_tflops": hw.peak_tflops, "preset_peak_tflops": ref.peak_tflops if ref else None}


def report_pass(out: dict) -> None:
    print(f"{out['device']} ({out['threads']} threads), {out['hardware']} + {out['model']}: "
          f"KV hit rate {out['kv_hit_rate']:.2f}, EMB hit rate {out['emb_hit_rate']:.3f}")
    print("  " + ", ".join(f"{k} {v:.4g}" for k, v in out["profile"].items()))
    print(f"{'class':8} {'n':>4} {'meas p50':>9} {'pred p50':>9} {'meas p99':>9} {'pred p99':>9} "
          f"{'p50 ratio':>9} {'med ratio':>9}   {'emb ms meas/pred':>16} {'compute ms meas/pred':>20}")
    for key in ("all", "kv_hit", "kv_miss"):
        r = out[key]
        print(f"{r['class']:8} {r['requests']:4d} {r['measured_p50_ms']:9.3f} {r['predicted_p50_ms']:9.3f} "
              f"{r['measured_p99_ms']:9.3f} {r['predicted_p99_ms']:9.3f} {r['ratio_of_medians']:9.3f} "
              f"{r['median_ratio']:9.3f}   {r['emb_ms']:7.3f}/{r['pred_emb_ms']:<8.3f} "
              f"{r['kv_compute_score_ms']:9.3f}/{r['pred_compute_ms']:<9.3f}")
    if out["batched"]:
        print(f"{'batch':>5} {'n':>4} {'rows p50':>8} {'meas p50':>9} {'pred p50':>9} {'p50 ratio':>9} "
              f"{'med ratio':>9} "
              f"{'ms/req':>7}   {'emb ms meas/pred':>16} {'compute ms meas/pred':>20}   "
              f"{'hit-only n/ratio':>16} {'miss-only n/ratio':>17} {'mixed n/ratio':>13}")
    for r in out["batched"]:
        kinds = "".join(f" {r[k]['batches']:5d} {r[k]['median_ratio']:6.3f}  " for k in ("hit_only", "miss_only", "mixed"))
        print(f"{r['batch']:5d} {r['batches']:4d} {r['rows_p50']:8.0f} {r['measured_p50_ms']:9.3f} "
              f"{r['predicted_p50_ms']:9.3f} {r['ratio_of_medians']:9.3f} {r['median_ratio']:9.3f} "
              f"{r['measured_per_request_ms']:7.3f}   {r['emb_ms']:7.3f}/{r['pred_emb_ms']:<8.3f} "
              f"{r['compute_ms']:9.3f}/{r['pred_compute_ms']:<9.3f} {kinds}")
    if "gpu" in out:
        g = out["gpu"]
        print(f"GPU ({g['preset'] or 'no matching preset'}): EMB gather {g['emb_gather_gbs']:.1f} GB/s "
              f"(D2D copy {g['d2d_copy_gbs']:.0f}, preset HBM {g['preset_hbm_gbs']}); H2D {g['h2d_gbs']:.1f} GB/s "
              f"(preset PCIe {g['preset_pcie_gbs']}); prefill {g['prefill_tflops'] or float('nan'):.2f} TFLOP/s "
              f"(fp32 GEMM {g['gemm_tflops']:.1f}, preset peak {g['preset_peak_tflops']})")


def report(out: dict) -> None:
    for i, p in enumerate(out["passes"]):
        print(f"-- pass {i + 1}")
        report_pass(p)
    if not out["passes"][0]["calibrated_now"]:
        print("(predicted compute includes the EMB lookup's fixed cost: a loaded profile does not split it out)")
    print(f"predicted / measured p50, per pass: {', '.join(f'{r:.3f}' for r in out['p50_ratio_per_pass'])}; "
          f"median {out['p50_ratio_median']:.3f}")
    if out["batched_p50_ratio_median"]:
        print("batched, predicted / measured p50 batch time, median over passes: " +
              ", ".join(f"b={b} {r:.3f}" for b, r in out["batched_p50_ratio_median"].items()))


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        out = run(args)
    except HelmInputError as exc:
        print(f"bench_realpath: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
