"""The two profile files `helmgr calibrate` writes: a hardware TOML and, beside it, the model TOML
of the model it measured with (`cpu.toml` -> `cpu.model.toml`), every number with a comment
saying where it came from. Both are written whole or not at all."""
from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path

import torch

from helmgr.core.errors import HelmInputError
from helmgr.core.files import check_writable, temp_beside
from helmgr.real.calibrate import Calibration
from helmgr.real.runtime import PAGE_MIB


def model_path(hardware_path: Path) -> Path:
    """Where the model TOML paired with a calibrated hardware TOML goes."""
    return hardware_path.with_name(hardware_path.stem + ".model.toml")


def check_out(path: Path, option: str = "--out") -> None:
    """Refuse, before measuring anything, an output path the profiles cannot be written to."""
    if path.is_dir():
        raise HelmInputError(f"{option} {str(path)!r}: {str(path)!r} is a folder")
    if path.suffix != ".toml" or not path.stem:
        raise HelmInputError(f"{option} {str(path)!r} must end in .toml (the simulator loads profiles from "
                             f".toml files)")
    if path.name.endswith(".model.toml"):
        raise HelmInputError(f"{option} {str(path)!r} is named as the model profile written beside a hardware "
                             f"profile ({str(path)[:-len('.model.toml')]}.toml would write it); name the hardware one")
    if model_path(path).is_dir():
        raise HelmInputError(f"{option} {str(path)!r}: {str(model_path(path))!r} is a folder")
    check_writable(option, path, path.resolve().parent)


def _value(v) -> str:
    return json.dumps(v) if isinstance(v, str) else repr(v)


def _toml(header: list[str], rows: list[tuple[str, object, str]]) -> str:
    lines = [f"# {h}" for h in header]
    for key, value, comment in rows:
        lines += [f"# {c}" for c in comment.splitlines()] + [f"{key} = {_value(value)}"]
    return "\n".join(lines) + "\n"


def _header(cal: Calibration, path: Path) -> list[str]:
    c = cal.config
    return [
        f"Measured by `helmgr calibrate --device {c.device}` on {cal.when}: not a preset.",
        f"Device: {cal.device_name} (torch {torch.__version__}, {cal.threads} CPU thread(s)).",
        f"Model: {cal.model.name} (preset {c.model!r}, widths / {c.shrink}, fp32, {c.candidates} candidates),",
        f"{c.n_items:,} synthetic item rows, a {c.pool_mib:g} MiB pool in {PAGE_MIB * 1024:g} KiB pages, "
        f"EMB share {c.ratio:g}.",
        f"Pairs with {model_path(path).name} beside it:",
        f"  helmgr simulate --hardware {path.name} --model {model_path(path).name}",
        f"Each figure: a least-squares fit (relative error) over medians of {c.repeats} runs "
        f"after {c.warmup} warm-up.",
    ]


def _batch_note(cal: Calibration) -> str:
    """How the batch-efficiency curve was measured, with every batch's rows and FLOP/s."""
    points, f = cal.points["batch"], cal.fits
    shapes = sorted({(p["prefix_len"], p["cached"], p["new_tokens"], p["candidates"]) for p in points},
                    key=lambda s: -s[1])
    named = ", ".join(f"KV {'hit' if c else 'miss'} ({n} history, {new} new, {k} candidates)"
                      for n, c, new, k in shapes)
    by_shape = ["  " + ("hit " if c else "miss") + ": " + ", ".join(
        f"b={p['batch']} {p['rows']} rows {g:.2f}" for p, g in zip(points, f["batch_gflops"])
        if (p["prefix_len"], p["cached"]) == (n, c)) for n, c, _, _ in shapes]
    sizes = ", ".join(str(b) for b in sorted({p["batch"] for p in points}))
    return (f"Batched service: batches of {sizes} requests of one shape,\n{named},\n"
            "served by NodeRuntime.serve_batch (jagged: real tokens only; KV read/write + extend + scoring).\n"
            "Time less the first request's compute intercept "
            f"({f['compute_fixed_us']:.1f} us) fitted to CostModel's FLOPs at\n"
            "peak_tflops x batch_efficiency x rows / (rows + batch_half_rows), plus batch_request_us for each\n"
            "further request (least squares, relative error; e <= 1, h >= 0, q >= 0).\n"
            "FLOPs / that time, GFLOP/s, by batch size b:\n" + "\n".join(by_shape))


def hardware_toml(cal: Calibration, path: Path) -> str:
    hw, f, p, cuda = cal.hardware, cal.fits, cal.points, cal.config.device == "cuda"
    ids = f"{p['emb_hit'][0]['ids']}..{p['emb_hit'][-1]['ids']}"
    copy = "pinned host-to-device copy" if cuda else "host-to-host copy (a CPU has no H2D link)"
    rows = [
        ("name", hw.name, "Calibrated on the device named above."),
        ("hbm_gib", hw.hbm_gib, "Device memory reported by CUDA." if cuda else
         "A CPU has no HBM: reserved + model weights + activations + the runtime's pool,\n"
         "so the simulator's pool budget is the pool measured."),
        ("hbm_bw_gbs", hw.hbm_bw_gbs,
         f"EMB hit lookups (DeviceEmbCache.lookup) of {ids} resident rows: slope of time vs bytes.\n"
         f"The lookup's fixed cost ({f['emb_fixed_us']:.1f} us) is counted in launch_us."),
        ("pcie_bw_gbs", hw.pcie_bw_gbs, f"One {copy} of 4 KiB..16 MiB: slope of time vs bytes\n"
         f"(intercept {f['copy_latency_us']:.1f} us, not used: the miss-path fit below holds the runtime's copy)."),
        ("pcie_latency_us", hw.pcie_latency_us,
         f"The runtime's miss path: lookups of {ids} absent rows minus as many resident ones\n"
         "(host gather, copy in, admission) vs rows: intercept, the fixed cost of a request's one miss\n"
         "batch (admission scans every EMB slot, so it grows with the EMB share)."),
        ("peak_tflops", hw.peak_tflops, f"A {p['gemm'][0]['n']}^3 fp32 GEMM: the practical peak at this dtype."),
        ("compute_efficiency", hw.compute_efficiency,
         f"Achieved {f['achieved_tflops'] * 1e3:.3f} GFLOP/s over {len(p['compute'])} request shapes served by\n"
         "NodeRuntime (KV read/write + prefill/extend + scoring vs CostModel's FLOPs), / peak_tflops."),
        ("launch_us", hw.launch_us,
         f"Fixed cost per request: compute intercept {f['compute_fixed_us']:.1f} us + EMB lookup intercept\n"
         f"{f['emb_fixed_us']:.1f} us, over the model's {f['launches']} launches."),
        ("host_lookup_ns", hw.host_lookup_ns,
         f"The same miss-path fit: slope per row ({f['miss_per_row_ns']:.0f} ns) minus the copy's row_bytes /\n"
         f"pcie_bw. A bare host gather (index_select into staging): {f['host_gather_ns_per_row']:.0f} ns/row."),
        ("reserved_gib", hw.reserved_gib, "Device memory in use once the CUDA context exists (mem_get_info)."
         if cuda else "A stand-in: nothing is reserved on a CPU."),
        ("batch_efficiency", hw.batch_efficiency, _batch_note(cal)),
        ("batch_half_rows", hw.batch_half_rows,
         "The same fit's half point: rows in flight (computed tokens + candidates) at which a batch\n"
         "reaches half the plateau (0: the same FLOP/s at every batch)."),
        ("batch_request_us", hw.batch_request_us,
         "The same fit: the fixed cost of each request beyond a batch's first (its own attention and\n"
         f"K/V copies). Fit error by batch: {', '.join(f'{e:+.1%}' for e in f['batch_fit_err'])}."),
    ]
    assert [r[0] for r in rows] == [x.name for x in fields(hw)]
    return _toml(["Calibrated hardware profile."] + _header(cal, path), rows)


def model_toml(cal: Calibration, path: Path) -> str:
    m, c = cal.model, cal.config
    notes = {
        "name": f"Preset {c.model!r} with d_qk, d_v, d_model and emb_dim divided by {c.shrink}, in fp32.",
        "dtype_bytes": "fp32 K/V, as the runtime stores them.",
        "emb_dtype_bytes": "fp32 embedding rows, as the runtime's host table.",
        "kernels_per_layer": "The preset's count: launch_us in the paired hardware profile is fitted per launch of\n"
                             "this count, so keep the two together.",
        "candidates": "Candidates per request measured (and in the bench's workload).",
        "weights_gib": "The model's parameters.",
        "activations_gib": "Peak memory of a request beyond the pool and weights, measured." if c.device == "cuda"
                           else "A stand-in (not measured on CPU).",
        "slo_ms": "The preset's SLO, kept.",
    }
    notes |= {w: f"The preset's, divided by {c.shrink}." for w in ("d_qk", "d_v", "d_model", "emb_dim")}
    rows = [(x.name, getattr(m, x.name), notes.get(x.name, "As in the preset.")) for x in fields(m)]
    return _toml(["Model profile of a calibrated hardware profile (see its header)."] + _header(cal, path), rows)


def write_profiles(cal: Calibration, path: Path) -> tuple[Path, Path]:
    """Write the hardware TOML at `path` and the model TOML beside it; both or neither."""
    check_out(path)
    texts = {path: hardware_toml(cal, path), model_path(path): model_toml(cal, path)}
    temps = {}
    try:
        for dest, text in texts.items():
            tmp = temp_beside(dest, ".toml")
            temps[dest] = tmp
            Path(tmp).write_text(text)
        for dest, tmp in temps.items():
            os.replace(tmp, dest)
    finally:
        for tmp in temps.values():
            if os.path.exists(tmp):
                os.unlink(tmp)
    return path, model_path(path)
