"""A trained model on disk: the HSTU weights and the item embedding table, in safetensors files.

A checkpoint is a folder:

- `model.json`: the model preset and width divisor the weights are for (`runtime_model`), the
  table's rows and width, the log it was trained on and its evaluation;
- `model.safetensors`: the HSTU weights, named as the model's `state_dict` (`w_in`,
  `blocks.0.w_uvqk`, ..., `w_head`);
- `items.safetensors`: one tensor, `items`, the item table (n_items, features_per_token x
  emb_dim), float32. It is memory-mapped, never copied whole (loading reads it through once, 64 MiB
  at a time, for NaN or inf): the host table a node's EMB cache
  gathers its misses from is the file's pages (on CUDA the cache pins a copy, since an H2D copy
  from pageable memory cannot be asynchronous).

Loading checks every tensor against the preset's model: a missing, unexpected, misshapen or
non-finite tensor (NaN or inf: weights of a diverged training) is a HelmInputError naming it, and
a file that is unreadable, truncated or not safetensors (the `safetensors` library reads its
header) one naming the file. `save` writes into a temporary folder and renames it into place,
so a crash never leaves a half-written checkpoint under the name asked for.
"""
from __future__ import annotations

import json
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from helmgr.core.errors import HelmInputError
from helmgr.real.model import HSTUModel
from helmgr.real.runtime import runtime_model

FORMAT = 1
FILES = ("model.json", "model.safetensors", "items.safetensors")


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: the model (eval mode, on the CPU) and the memory-mapped table."""

    model: HSTUModel
    table: torch.Tensor
    meta: dict = field(default_factory=dict)

    @property
    def n_items(self) -> int:
        return self.table.shape[0]


def save(folder: Path | str, model: HSTUModel, table: torch.Tensor, preset: str, shrink: int, info: dict) -> Path:
    """Write `model` (built from `runtime_model(preset, shrink)`) and `table` to `folder` (which
    must not exist); `info` (the log, the evaluation) is kept in `model.json`."""
    from safetensors.torch import save_file

    folder = Path(folder)
    if folder.exists():
        raise HelmInputError(f"checkpoint folder {str(folder)!r} already exists: remove it or name another")
    tmp = folder.with_name(folder.name + ".writing")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_file({k: v.detach().float().contiguous().cpu() for k, v in model.state_dict().items()},
                  str(tmp / "model.safetensors"))
        save_file({"items": table.detach().float().contiguous().cpu()}, str(tmp / "items.safetensors"))
        meta = {"format": FORMAT, "preset": preset, "shrink": shrink, "n_items": int(table.shape[0]),
                "row_width": int(table.shape[1]), **info}
        (tmp / "model.json").write_text(json.dumps(meta, indent=2) + "\n")
        tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def describe(folder: Path | str) -> dict:
    """`model.json` of the checkpoint in `folder`, checked (its preset and width divisor name a
    model, the table's rows a positive count), without reading the tensors."""
    folder = Path(folder)
    missing = [f for f in FILES if not (folder / f).is_file()]
    if missing:
        raise HelmInputError(f"{str(folder)!r} is not a model checkpoint (helmgr model train --out): "
                             f"no {missing[0]}")
    try:
        meta = json.loads((folder / "model.json").read_text())
        runtime_model(meta["preset"], int(meta["shrink"]))
        if int(meta["n_items"]) < 1:
            raise ValueError(f"n_items {meta['n_items']}")
    except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
        raise HelmInputError(f"{str(folder / 'model.json')!r} is not a checkpoint's description: {exc!r}") from None
    if meta.get("format") != FORMAT:
        raise HelmInputError(f"checkpoint format {meta.get('format')!r} in {str(folder)!r}, this helmgr reads {FORMAT}")
    return meta


def load(folder: Path | str) -> Checkpoint:
    """The checkpoint in `folder`, checked against its preset's model."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    meta = describe(folder)
    profile = runtime_model(meta["preset"], int(meta["shrink"]))
    model = HSTUModel(profile, torch.Generator().manual_seed(0))
    try:
        weights = load_file(str(folder / "model.safetensors"))
    except (SafetensorError, OSError) as exc:
        raise HelmInputError(f"{str(folder / 'model.safetensors')!r} is not a safetensors file: {exc}") from None
    expected = model.state_dict()
    for name, t in expected.items():
        if name not in weights:
            raise HelmInputError(f"checkpoint {str(folder)!r} lacks tensor {name!r} of model {profile.name!r}")
        if tuple(weights[name].shape) != tuple(t.shape):
            raise HelmInputError(f"checkpoint tensor {name!r} is {tuple(weights[name].shape)}, model "
                                 f"{profile.name!r} needs {tuple(t.shape)}")
    extra = sorted(set(weights) - set(expected))
    if extra:
        raise HelmInputError(f"checkpoint tensor {extra[0]!r} is not part of model {profile.name!r}")
    weights = {k: v.to(expected[k].dtype) for k, v in weights.items()}
    bad = next((k for k, v in weights.items() if not torch.isfinite(v).all()), None)
    if bad is not None:
        raise HelmInputError(f"checkpoint tensor {bad!r} in {str(folder / 'model.safetensors')!r} holds NaN or inf "
                             "(a diverged training): train it again")
    model.load_state_dict(weights)
    table = mapped_table(folder / "items.safetensors")
    if table.shape[1] != model.in_dim or table.shape[0] != int(meta["n_items"]):
        raise HelmInputError(f"checkpoint tensor 'items' is {tuple(table.shape)}, model {profile.name!r} with "
                             f"{meta['n_items']} items needs ({meta['n_items']}, {model.in_dim})")
    row = first_non_finite_row(table.numpy())
    if row is not None:
        raise HelmInputError(f"checkpoint tensor 'items' in {str(folder / 'items.safetensors')!r}: row {row} holds "
                             "NaN or inf (a diverged training): train it again")
    return Checkpoint(model.eval(), table, meta)


def mapped_table(path: Path) -> torch.Tensor:
    """The `items` tensor of a safetensors file, memory-mapped (copy-on-write: writing to it
    never reaches the file). The format: an 8-byte little-endian header size, a JSON header
    giving each tensor's dtype, shape and byte range after the header, then the data. The
    `safetensors` library checks the file first (header size, JSON, byte ranges covering the
    file), so what is mapped is what the header says."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            if "items" not in f.keys():
                raise KeyError("items")
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        entry = header["items"]
        start, stop = entry["data_offsets"]
        shape = tuple(entry["shape"])
    except (SafetensorError, OSError, struct.error, ValueError, KeyError, TypeError) as exc:
        raise HelmInputError(f"{str(path)!r} holds no item table 'items': {exc!r}") from None
    if entry.get("dtype") != "F32" or len(shape) != 2 or 0 in shape or stop - start != 4 * shape[0] * shape[1]:
        raise HelmInputError(f"checkpoint tensor 'items' in {str(path)!r} must be 2-D float32 with rows, got "
                             f"{entry.get('dtype')} {shape}")
    rows = np.memmap(path, dtype=np.float32, mode="c", offset=8 + n + start, shape=shape)
    return torch.from_numpy(rows)


SCAN_BYTES = 1 << 26          # the mapped table is checked this much at a time, never copied whole


def first_non_finite_row(rows: np.ndarray) -> int | None:
    """The first row of `rows` holding a NaN or an inf, or None."""
    step = max(1, SCAN_BYTES // max(1, rows[:1].nbytes))
    for lo in range(0, len(rows), step):
        finite = np.isfinite(rows[lo:lo + step]).all(axis=1)
        if not finite.all():
            return lo + int(np.argmin(finite))
    return None
