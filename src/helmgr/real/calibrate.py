"""Calibration: measure the real data path on the device at hand and fit the cost
model's hardware constants to it, so that the simulator predicts the runtime with its own formula.

Measured (`helmgr.real.measure`), then fitted:
- EMB lookups of resident rows vs bytes -> `hbm_bw_gbs` (slope); the fixed cost goes to `launch_us`;
- the same lookups of absent rows, minus the hits: the runtime's miss path (host gather, copy in,
  admission) vs rows -> `pcie_latency_us` (fixed cost of a request's one miss batch) and
  `host_lookup_ns` (per row, beyond the copy's bytes / bandwidth);
- one copy into device memory (CPU: host to host; CUDA: pinned host to device) vs bytes ->
  `pcie_bw_gbs`; its own intercept and the plain host gather are recorded beside them;
- requests served by `NodeRuntime`, KV hit and miss, a range of history lengths, new tokens and
  candidates: KV + prefill/extend + scoring time vs the FLOPs `CostModel` counts for them ->
  achieved FLOP/s (= peak_tflops x compute_efficiency) and a fixed cost per request, which with
  the lookup's becomes `launch_us` x the model's launch count;
- one large GEMM -> `peak_tflops` (so `compute_efficiency` = achieved / GEMM);
- batches of 1, 2, 4 .. `max_batch` requests of one shape (a KV hit, a KV miss) served by
  `NodeRuntime.serve_batch`, less the first request's compute intercept: its FLOPs at the
  batch-efficiency curve's rate, peak x `batch_efficiency` x rows / (rows + `batch_half_rows`),
  plus `batch_request_us` for each further request (its own attention and K/V copies), fitted together.

Every fit (`real/fits.py`) is least squares on relative error (each point weighted by 1 / its
time), so short and long measurements count alike. Nothing here imports click or rich.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterator

import torch

from helmgr.core.errors import HelmInputError
from helmgr.core.records import NodeConfig
from helmgr.core.validate import check_host_memory
from helmgr.core.profiles import GIB, MIB, HardwareProfile, ModelProfile, NodeProfile, load_hardware
from helmgr.real.fits import BatchFit, Fit, fit_affine, fit_batch, fit_compute
from helmgr.real.measure import Measure, Shape, sizes
from helmgr.real.runtime import FP32, MIN_POOL_PAGES, PAGE_MIB, NodeRuntime, runtime_model

CPU_RESERVED_GIB = 0.0625          # a CPU has no HBM: a stand-in for what the context holds on a GPU
CPU_ACTIVATIONS_GIB = 0.0625       # not measured on CPU (the runtime's pool is sized apart from it)
FLOOR = 1e-3                       # the profile loader wants every constant > 0


ACTIVATION_TENSORS = 8             # live (tokens + candidates) x d_model tensors a request, in the estimate


def check_fits(cfg: "CalibrateConfig") -> None:
    """Refuse a calibration whose estimate (`CalibrateConfig.memory_bytes`) is over half the
    host's memory (`check_host_memory`), or over the CUDA device's."""
    need = cfg.memory_bytes()
    what = (f"--shrink {cfg.shrink} --n-items {cfg.n_items:,} --pool-mib {cfg.pool_mib:g} --max-batch {cfg.max_batch} "
            f"--max-tokens {cfg.max_tokens} --candidates {cfg.candidates}")
    check_host_memory(need["host"], what)
    if "device" in need and cfg.device == "cuda" and torch.cuda.is_available():
        have = torch.cuda.get_device_properties(0).total_memory
        if need["device"] > have:
            raise HelmInputError(f"{what} ask for ~{need['device'] / GIB:.3g} GiB of device memory; the GPU has "
                                 f"{have / GIB:.3g} GiB")


# CPU: the small preset shrunk so that a request takes milliseconds. CUDA: the small preset
# itself (fp32), 512 candidates and histories up to 4k, as the model is meant to be served.
DEVICE_DEFAULTS = {
    "cpu": dict(shrink=16, candidates=64, n_items=100_000, pool_mib=48.0, max_tokens=1024),
    "cuda": dict(shrink=1, candidates=512, n_items=200_000, pool_mib=2048.0, max_tokens=4096),
}


@dataclass(frozen=True, slots=True)
class CalibrateConfig:
    device: str = "cpu"
    model: str = "small"              # model preset ...
    shrink: int = 16                  # ... with widths divided by this
    candidates: int = 64              # candidates per request
    n_items: int = 100_000            # rows of the synthetic host table
    pool_mib: float = 48.0            # the runtime's pool budget
    ratio: float = 0.3                # EMB share of the pool (the miss path scans every EMB slot)
    max_tokens: int = 1024            # longest history measured
    max_batch: int = 8                # largest batch measured (batches of 1, 2, 4, ... up to it)
    repeats: int = 7
    warmup: int = 2
    seed: int = 0

    @classmethod
    def for_device(cls, device: str, **overrides) -> "CalibrateConfig":
        """The sizes that suit `device` (DEVICE_DEFAULTS), with `overrides` (None: the default)."""
        sizes = DEVICE_DEFAULTS.get(device, {}) | {k: v for k, v in overrides.items() if v is not None}
        return cls(device=device, **sizes)

    def validate(self) -> "CalibrateConfig":
        check_device(self.device)
        checks = {"shrink": self.shrink, "candidates": self.candidates, "n-items": self.n_items,
                  "pool-mib": self.pool_mib, "max-tokens": self.max_tokens, "repeats": self.repeats,
                  "max-batch": self.max_batch}
        for name, value in checks.items():
            if not value > 0:
                raise HelmInputError(f"--{name} must be > 0, got {value}")
        try:
            self.model_profile
        except HelmInputError:
            raise
        except ValueError as exc:
            raise HelmInputError(f"--shrink {self.shrink}: {exc}") from None
        need = 2 * self.max_tokens + 16 + 4 * self.candidates
        if self.n_items < need:
            raise HelmInputError(f"--n-items must be >= {need} for --max-tokens {self.max_tokens} and "
                                 f"--candidates {self.candidates}, got {self.n_items}")
        if self.pool_mib < MIN_POOL_PAGES * PAGE_MIB:
            raise HelmInputError(f"--pool-mib must be >= {MIN_POOL_PAGES * PAGE_MIB:g} (the runtime's pool holds "
                                 f"{MIN_POOL_PAGES} pages of {PAGE_MIB * 1024:g} KiB at least), got {self.pool_mib:g}")
        check_fits(self)
        return self

    def memory_bytes(self) -> dict[str, float]:
        """What a calibration holds, by where: the host table (and on CPU the pool), and the
        largest batch's activations: a few live tensors of (tokens + candidates) x d_model a request."""
        m = self.model_profile
        batch = ACTIVATION_TENSORS * self.max_batch * (self.max_tokens + self.candidates) * m.d_model * FP32
        pool = self.pool_mib * MIB
        host = self.n_items * m.row_bytes + (pool + batch if self.device == "cpu" else 0.0)
        return {"host": host} | ({} if self.device == "cpu" else {"device": pool + batch})

    @property
    def model_profile(self) -> ModelProfile:
        return runtime_model(self.model, self.shrink, self.candidates)


@dataclass(frozen=True, slots=True)
class Calibration:
    config: CalibrateConfig
    hardware: HardwareProfile
    model: ModelProfile
    device_name: str
    threads: int
    when: str
    points: dict = field(default_factory=dict)    # measured points, by kind
    fits: dict = field(default_factory=dict)      # fitted intermediates, by name

    def summary(self) -> dict:
        return {"device": self.config.device, "device_name": self.device_name, "threads": self.threads,
                "when": self.when, "config": asdict(self.config), "hardware": asdict(self.hardware),
                "model": asdict(self.model), "fits": self.fits, "points": self.points}


def compute_shapes(max_tokens: int, candidates: int) -> list[Shape]:
    """(prefix_len, cached, new_tokens, candidates) of the requests timed: KV misses over four
    history lengths, KV hits over three with 1, 4 and 16 new tokens, and fewer and more candidates."""
    lengths = sizes(max_tokens, 4, 2)
    misses = [(n, 0, 4, candidates) for n in lengths]
    hits = [(n, n, new, candidates) for n in lengths[::2] + [max_tokens] for new in (1, 4, 16)]
    mid = lengths[len(lengths) // 2]
    more = [(mid, mid, 4, c) for c in (max(1, candidates // 4), 4 * candidates)]
    return sorted(set(misses + hits + more))


def batch_shapes(max_tokens: int, candidates: int) -> list[Shape]:
    """The request shapes batched: a KV hit (4 new tokens after a cached prefix) and a KV miss
    (the same history recomputed), at the second of the four history lengths `compute_shapes`
    measures (256 of 1,024 on CPU, 1,024 of 4,096 on CUDA: near the bench workload's median)."""
    n = sizes(max_tokens, 4, 2)[1]
    return [(n, n, 4, candidates), (n, 0, 4, candidates)]


def batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to `max_batch` (and `max_batch` itself)."""
    return sorted({min(1 << i, max_batch) for i in range(max_batch.bit_length() + 1)})


def total_steps(cfg: CalibrateConfig) -> int:
    """Progress steps of `calibrate`: four measurements, then one per round of request shapes and
    one per round of batches."""
    return 4 + 2 * (cfg.warmup + cfg.repeats)


def check_device(name: str) -> torch.device:
    if name not in ("cpu", "cuda"):
        raise HelmInputError(f"device must be cpu or cuda, got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise HelmInputError("device 'cuda': torch sees no CUDA device (torch.cuda.is_available() is False)")
    return torch.device(name)


@contextmanager
def _fitting(what: str) -> Iterator[None]:
    try:
        yield
    except ValueError as exc:
        raise HelmInputError(f"calibration of {what}: {exc}; measure more (--repeats, --max-tokens) "
                             f"or on a quieter machine") from None


def _line(what: str, points: list[dict], x: str) -> Fit:
    with _fitting(what):
        return fit_affine([p[x] for p in points], [p["s"] for p in points])


def _miss_path(hits: list[dict], misses: list[dict]) -> Fit:
    """What a lookup of n absent rows costs beyond n resident ones, vs n."""
    extra = [max(m["s"] - h["s"], 1e-9) for h, m in zip(hits, misses)]
    with _fitting("the EMB miss path"):
        return fit_affine([h["ids"] for h in hits], extra)


def _batch_fit(points: list[dict], fixed_s: float, peak: float) -> BatchFit:
    """The batch curve and per-request cost of the batches once the fixed cost of their first
    request, `fixed_s`, is taken off each."""
    left = [p["s"] - fixed_s for p in points]
    with _fitting("batched compute"):
        if min(left) <= 0:
            raise ValueError(f"a batch took {-min(left) * 1e6:.0f} us less than the fixed cost of a request")
        return fit_batch([p["batch"] for p in points], [p["rows"] for p in points], [p["flops"] for p in points],
                         left, peak)


def fit_profiles(cfg: CalibrateConfig, points: dict, memory: dict) -> tuple[HardwareProfile, ModelProfile, dict]:
    """The hardware and model profiles the points imply. `memory`: weights_gib, and on CUDA the
    device's total_gib, reserved_gib and activations_gib."""
    model = cfg.model_profile
    emb, copy = _line("EMB hit lookups", points["emb_hit"], "bytes"), _line("H2D copies", points["h2d"], "bytes")
    host = _line("host gathers", points["host_gather"], "rows")
    miss = _miss_path(points["emb_hit"], points["emb_miss"])
    with _fitting("request compute"):
        achieved, launch_s = fit_compute([p["flops"] for p in points["compute"]], [p["s"] for p in points["compute"]],
                                         model.launches)
    compute_fixed = launch_s * model.launches
    peak = points["gemm"][0]["tflops"] * 1e12
    batch = _batch_fit(points["batch"], compute_fixed, peak)
    activations = memory.get("activations_gib", CPU_ACTIVATIONS_GIB)
    model = replace(model, weights_gib=memory["weights_gib"], activations_gib=activations)
    reserved = memory.get("reserved_gib", CPU_RESERVED_GIB)
    hw = HardwareProfile(
        name=f"calibrated-{cfg.device}",
        hbm_gib=memory.get("total_gib", cfg.pool_mib * MIB / GIB + reserved + model.weights_gib + activations),
        hbm_bw_gbs=1e-9 / emb.slope, pcie_bw_gbs=1e-9 / copy.slope,
        pcie_latency_us=max(miss.intercept * 1e6, FLOOR),
        peak_tflops=peak / 1e12, compute_efficiency=achieved / peak,
        launch_us=max((compute_fixed + emb.intercept) / model.launches * 1e6, FLOOR),
        host_lookup_ns=max((miss.slope - model.row_bytes * copy.slope) * 1e9, FLOOR), reserved_gib=reserved,
        batch_efficiency=batch.efficiency, batch_half_rows=batch.half_rows, batch_request_us=batch.request_s * 1e6)
    fits = {"emb_fixed_us": emb.intercept * 1e6, "compute_fixed_us": compute_fixed * 1e6,
            "achieved_tflops": achieved / 1e12, "launches": model.launches,
            "miss_fixed_us": miss.intercept * 1e6, "miss_per_row_ns": miss.slope * 1e9,
            "copy_latency_us": copy.intercept * 1e6, "host_gather_ns_per_row": host.slope * 1e9,
            "compute_fit_err": [(compute_fixed + p["flops"] / achieved) / p["s"] - 1 for p in points["compute"]],
            "batch_gflops": [p["flops"] / (p["s"] - compute_fixed) / 1e9 for p in points["batch"]],
            "batch_fit_err": [(compute_fixed + batch.seconds(p["batch"], p["rows"], p["flops"], peak)) / p["s"] - 1
                              for p in points["batch"]]}
    return hw, model, fits


def _device_memory(device: torch.device) -> dict:
    """Total and already-used device memory, read once the CUDA context exists."""
    if device.type != "cuda":
        return {}
    torch.empty(1, device=device)
    free, total = torch.cuda.mem_get_info(device)
    return {"total_gib": total / GIB, "reserved_gib": (total - free) / GIB}


def calibrate(cfg: CalibrateConfig, on_step: Callable[[str], None] = lambda name: None) -> Calibration:
    """Measure on `cfg.device` and fit; `on_step(name)` after each of `total_steps(cfg)` steps."""
    device = check_device(cfg.validate().device)
    memory = _device_memory(device)
    placeholder = load_hardware("a100-80g")           # the runtime wants one; its FLOP counts ignore it
    rt = NodeRuntime(NodeProfile(placeholder, cfg.model_profile, PAGE_MIB), int(cfg.pool_mib * MIB), device,
                     cfg.seed, cfg.n_items, NodeConfig(ratio=cfg.ratio))
    memory["weights_gib"] = sum(p.numel() * p.element_size() for p in rt.model.parameters()) / GIB
    m = Measure(rt, cfg.repeats, cfg.warmup, cfg.seed)
    points = {}
    points["emb_hit"], points["emb_miss"] = m.emb()
    on_step("emb")
    for name, run in (("h2d", m.h2d), ("host_gather", m.host_gather), ("gemm", lambda: [m.gemm()])):
        points[name] = run()
        on_step(name)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        at_rest = torch.cuda.memory_allocated(device)
    shapes = compute_shapes(cfg.max_tokens, cfg.candidates)
    points["compute"] = m.compute(shapes, rt.cost, lambda: on_step("compute"))
    if device.type == "cuda":
        memory["activations_gib"] = max(torch.cuda.max_memory_allocated(device) - at_rest, MIB) / GIB
    points["batch"] = m.batches(batch_shapes(cfg.max_tokens, cfg.candidates), batch_sizes(cfg.max_batch), rt.cost,
                                lambda: on_step("batch"))
    hw, model, fits = fit_profiles(cfg, points, memory)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    return Calibration(cfg, hw, model, name, torch.get_num_threads(), time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                       points, fits)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()
