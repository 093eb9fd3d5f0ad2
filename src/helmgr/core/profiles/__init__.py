"""Hardware and model presets as frozen dataclasses, loaded from the TOML files beside this module.

Every number in the TOML files carries its public source in a comment; derived values are
properties, never filled in at run time.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

from helmgr.core.errors import HelmInputError
from helmgr.core.validate import POSITIVE, Range, check_record, number

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """One GPU and its host link. Bandwidths are achieved figures, not datasheet peaks."""

    name: str
    hbm_gib: float
    hbm_bw_gbs: float
    pcie_bw_gbs: float
    pcie_latency_us: float
    peak_tflops: float
    compute_efficiency: float
    launch_us: float
    host_lookup_ns: float
    reserved_gib: float
    batch_efficiency: float          # batched service: achieved share of peak once the GPU is full
    batch_half_rows: float           # ... rows in flight at which it reaches half that (0: flat)
    batch_request_us: float = 0.0    # ... and what each request beyond a batch's first adds whatever its size
                                     # (its own attention and K/V copies; 0: one jagged kernel for the batch)

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gib * GIB)

    @property
    def hbm_bw(self) -> float:
        """HBM bandwidth in bytes/s."""
        return self.hbm_bw_gbs * 1e9

    @property
    def pcie_bw(self) -> float:
        """Achieved pinned H2D bandwidth in bytes/s."""
        return self.pcie_bw_gbs * 1e9

    @property
    def pcie_latency_s(self) -> float:
        return self.pcie_latency_us * 1e-6

    @property
    def flops(self) -> float:
        """Achieved FLOP/s: peak x efficiency."""
        return self.peak_tflops * 1e12 * self.compute_efficiency

    @property
    def batch_flops(self) -> float:
        """Achieved FLOP/s of a batch large enough to fill the GPU (the batch-efficiency curve's plateau)."""
        return self.peak_tflops * 1e12 * self.batch_efficiency

    @property
    def launch_s(self) -> float:
        return self.launch_us * 1e-6

    @property
    def batch_request_s(self) -> float:
        return self.batch_request_us * 1e-6

    @property
    def host_lookup_s(self) -> float:
        return self.host_lookup_ns * 1e-9


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """An HSTU-style model: its shape, its embedding rows, its default SLO."""

    name: str
    layers: int
    heads: int
    d_qk: int
    d_v: int
    d_model: int
    dtype_bytes: int
    features_per_token: int
    emb_dim: int
    emb_dtype_bytes: int
    kernels_per_layer: int
    fixed_kernels: int
    candidates: int
    weights_gib: float
    activations_gib: float
    slo_ms: float

    @property
    def kv_bytes_per_token(self) -> int:
        """layers x heads x (d_qk + d_v) x dtype_bytes."""
        return self.layers * self.heads * (self.d_qk + self.d_v) * self.dtype_bytes

    @property
    def row_bytes(self) -> int:
        """Bytes fetched per looked-up item id: one row per feature of the token."""
        return self.features_per_token * self.emb_dim * self.emb_dtype_bytes

    @property
    def linear_flops_per_token(self) -> int:
        """Per layer: the UVQK projection (d_model -> heads x (2 d_qk + 2 d_v)) and the output
        projection (heads x d_v -> d_model), 2 FLOPs per multiply-add."""
        uvqk = 2 * self.d_model * self.heads * (2 * self.d_qk + 2 * self.d_v)
        out = 2 * self.heads * self.d_v * self.d_model
        return uvqk + out

    @property
    def attention_flops_per_pair(self) -> int:
        """Per layer and (query, key) pair: Q.K (2 d_qk) and the weighted V sum (2 d_v), all heads."""
        return 2 * self.heads * (self.d_qk + self.d_v)

    @property
    def launches(self) -> int:
        return self.layers * self.kernels_per_layer + self.fixed_kernels

    @property
    def slo_s(self) -> float:
        return self.slo_ms * 1e-3


@dataclass(frozen=True, slots=True)
class NodeProfile:
    """One serving node: a GPU, the model it runs, and the page size of its cache pool."""

    hardware: HardwareProfile
    model: ModelProfile
    page_mib: float = 2.0

    @property
    def page_bytes(self) -> int:
        return int(self.page_mib * MIB)

    @property
    def pool_budget_bytes(self) -> int:
        """HBM left for the two caches after weights, activations and workspace."""
        used = self.hardware.reserved_gib + self.model.weights_gib + self.model.activations_gib
        return int((self.hardware.hbm_gib - used) * GIB)


# Allowed values by field; every other number must be > 0 and at most FLOAT_MAX / INT_MAX (far past
# any real GPU or model, and small enough that derived byte counts stay in int64).
FLOAT_MAX, INT_MAX = 1e9, 1_000_000
RANGES = {
    "compute_efficiency": Range(0.0, 1.0, low_open=True),        # a share of peak
    "batch_efficiency": Range(0.0, 1.0, low_open=True),
    "batch_half_rows": Range(0.0, FLOAT_MAX),                    # 0: the same efficiency at every batch size
    "batch_request_us": Range(0.0, FLOAT_MAX),                   # 0: nothing per request in a batch
    "reserved_gib": Range(0.0, FLOAT_MAX),
    "dtype_bytes": Range(1, 8),
    "emb_dtype_bytes": Range(1, 8),
    "fixed_kernels": Range(0, INT_MAX),
}


def read_preset(kind: str, name_or_path: str, what: str | None = None) -> tuple[str, bytes]:
    """(where, bytes): a `.toml` path is a file, anything else the name of a preset of `kind`
    (`what` names it in errors: "{kind} profile" by default)."""
    what = what or f"{kind} profile"
    where = f"{what} {name_or_path!r}"
    if name_or_path.endswith(".toml"):
        path = Path(name_or_path)
        if path.exists() and not path.is_file():         # a folder; a pipe would block the read
            raise HelmInputError(f"{what} file {name_or_path!r} is not a regular file")
        try:
            return where, path.read_bytes()
        except FileNotFoundError:
            raise HelmInputError(f"{what} file {name_or_path!r} does not exist") from None
        except OSError as exc:
            raise HelmInputError(f"{where} cannot be read: {exc.strerror or exc}") from None
    candidate = resources.files("helmgr.core.profiles").joinpath(kind, f"{name_or_path}.toml")
    if "/" in name_or_path or "\\" in name_or_path or not candidate.is_file():
        known = ", ".join(sorted(available(kind)))
        raise HelmInputError(f"unknown {what} {name_or_path!r} (known: {known})")
    return where, candidate.read_bytes()


def check_profile(cls, data: dict, where: str) -> dict:
    """A profile's values checked against `cls`'s fields (core.validate.check_record): the field's
    type (a bool is no number, 2.5 is no int), finite, and in `RANGES` or (0, FLOAT_MAX / INT_MAX]."""
    default = {"int": Range(0, INT_MAX, low_open=True), "float": Range(0.0, FLOAT_MAX, low_open=True)}
    ranges = {f.name: RANGES.get(f.name, default.get(f.type)) for f in fields(cls) if f.type != "str"}
    return check_record(cls, data, ranges, where)


def read_toml(kind: str, name_or_path: str, what: str | None = None) -> tuple[str, dict]:
    """(where, parsed TOML) of a preset of `kind` or a `.toml` file (`read_preset`); a binary file,
    text that is not UTF-8 or not TOML is a named error."""
    where, raw = read_preset(kind, name_or_path, what)
    if b"\0" in raw:
        raise HelmInputError(f"{where} is a binary file, not TOML")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HelmInputError(f"{where} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HelmInputError(f"{where} is not valid TOML: {exc}") from None
    return where, data


def _load(kind: str, name_or_path: str, cls):
    where, data = read_toml(kind, name_or_path)
    return cls(**check_profile(cls, data, where))


def available(kind: str) -> list[str]:
    files = resources.files("helmgr.core.profiles").joinpath(kind)
    return [p.name.removesuffix(".toml") for p in files.iterdir() if p.name.endswith(".toml")]


def load_hardware(name_or_path: str) -> HardwareProfile:
    """A preset by name (`a100-80g`, `h100-80g`, `h200-141g`) or a TOML file (e.g. calibrated)."""
    return _load("hardware", name_or_path, HardwareProfile)


def load_model(name_or_path: str) -> ModelProfile:
    """A preset by name (`small`, `large`) or a TOML file."""
    return _load("model", name_or_path, ModelProfile)


def node_profile(hardware: str = "a100-80g", model: str = "large", page_mib: float = 2.0) -> NodeProfile:
    """Load a node profile and check that its pool can hold at least two pages."""
    number("page size (MiB)", page_mib, POSITIVE)
    profile = NodeProfile(load_hardware(hardware), load_model(model), page_mib)
    if profile.pool_budget_bytes <= 0:
        raise HelmInputError(
            f"profile {hardware}+{model} leaves no pool: budget {profile.pool_budget_bytes} bytes"
        )
    if profile.page_bytes * 2 > profile.pool_budget_bytes:
        raise HelmInputError(
            f"page of {page_mib} MiB is larger than half the pool budget "
            f"({profile.pool_budget_bytes / GIB:.2f} GiB)"
        )
    if profile.page_bytes < profile.model.kv_bytes_per_token:    # a KV page holds whole tokens
        raise HelmInputError(
            f"page of {page_mib:g} MiB ({profile.page_bytes} bytes) cannot hold one KV token of model "
            f"{model!r} ({profile.model.kv_bytes_per_token} bytes)"
        )
    return profile
