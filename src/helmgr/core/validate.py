"""One validation layer: numbers that must be finite and in range, records read from
data files checked field by field against their dataclass, and the resource estimate a command
checks before it starts a run.

Every failure is a `HelmInputError` with a one-line message that names the value; the CLI prints
it and exits 2.
"""
from __future__ import annotations

import math
import os
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from helmgr.core.errors import HelmInputError

SEED_MAX = 2**32 - 1                 # numpy's legacy seeding and SB3 take seeds below 2^32


@dataclass(frozen=True, slots=True)
class Range:
    """An interval of allowed values; `None` is an open-ended side, `*_open` excludes the bound."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, x: float) -> bool:
        if self.low is not None and not (x > self.low if self.low_open else x >= self.low):
            return False
        return self.high is None or (x < self.high if self.high_open else x <= self.high)

    def __str__(self) -> str:
        lo, hi = _bound(self.low), _bound(self.high)
        if self.high is None:
            return "any number" if self.low is None else f"{'>' if self.low_open else '>='} {lo}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {hi}"
        return f"in {'(' if self.low_open else '['}{lo}, {hi}{')' if self.high_open else ']'}"


def _bound(x: float | None) -> str:
    """A bound as written: whole numbers in full up to 10**15 (1 TiB in MiB is 1048576, not
    1.04858e+06), others in `g` form."""
    if x is None:
        return ""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


POSITIVE = Range(0, None, low_open=True)
NON_NEGATIVE = Range(0)


def number(name: str, value, allowed: Range = Range(), integer: bool = False) -> float | int:
    """`value` if it is a real number (a bool is not one), finite, integral when `integer`, and in
    `allowed`; otherwise a `HelmInputError` naming `name` and the value."""
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HelmInputError(f"{name} must be {kind}, got {value!r} ({type(value).__name__})")
    if integer and not isinstance(value, int):
        raise HelmInputError(f"{name} must be an integer, got {value!r}")
    if not math.isfinite(value):
        raise HelmInputError(f"{name} must be a finite number, got {value!r}")
    if value not in allowed:
        raise HelmInputError(f"{name} must be {allowed}, got {value!r}")
    return value


def seed(name: str, value) -> int:
    """A seed: an integer in [0, 2^32 - 1]."""
    return number(name, value, Range(0, SEED_MAX), integer=True)


def check_numbers(config, ranges: dict[str, Range] | None = None, default: Range = POSITIVE, prefix: str = "") -> None:
    """Every int and float field of the dataclass `config` through `number` (`ranges` by field,
    else `default`; an int field must be an integer; `seed` as a seed; a `... | None` field may be
    None). The option-style name (dashes, after `prefix`: "--" where fields are options) is the
    one an error names."""
    for f in fields(config):
        kind = str(f.type).removesuffix(" | None")
        v = getattr(config, f.name)
        if kind not in ("int", "float") or (v is None and str(f.type).endswith("| None")):
            continue
        name = prefix + f.name.replace("_", "-")
        if f.name == "seed":
            seed(name, v)
        else:
            number(name, v, (ranges or {}).get(f.name, default), integer=kind == "int")


_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def check_record(cls, data: dict, ranges: dict[str, Range], where: str) -> dict:
    """Check `data` (e.g. a parsed TOML table) against the dataclass `cls`: every field present
    (one with a default may be left out), no unknown key, each value of its field's type (`int`,
    `float`, `str` or `bool`; a bool is no number), numbers finite and in `ranges[field]` (> 0 where it
    names none). Returns the values with float fields as floats; every error names `where` and the field."""
    names = [f.name for f in fields(cls)]
    missing = [f.name for f in fields(cls) if f.name not in data and f.default is MISSING]
    extra = sorted(set(data) - set(names))
    if missing or extra:
        raise HelmInputError(f"{where}: missing {missing or 'nothing'}, unknown {extra or 'nothing'}")
    out = {}
    for f in fields(cls):
        if f.name not in data:
            continue                                   # its default
        kind = _TYPES.get(f.type if isinstance(f.type, str) else getattr(f.type, "__name__", ""))
        value = data[f.name]
        if kind is str:
            if not isinstance(value, str) or not value.strip():
                raise HelmInputError(f"{where}: {f.name} must be a non-empty string, got {value!r}")
            out[f.name] = value
        elif kind is bool:
            if not isinstance(value, bool):
                raise HelmInputError(f"{where}: {f.name} must be true or false, got {value!r}")
            out[f.name] = value
        elif kind in (int, float):
            v = number(f"{where}: {f.name}", value, ranges.get(f.name, POSITIVE), integer=kind is int)
            out[f.name] = float(v) if kind is float else v
        else:
            out[f.name] = value
    return out


# -- the resource estimate ---------------------------------------------------------------------
GIB = 1 << 30
REQUEST_BYTES = 400          # one simulated request's records (measured ~300 B at the default scenario)
NODE_BYTES = 8 << 20         # one simulated node's caches and index (measured 2.5-5 MiB)
TRACE_ROW_BYTES = 96         # one replayed trace row: request table, clone concatenation, sort copies


@dataclass(frozen=True, slots=True)
class Limits:
    """What one command may ask for without `--allow-large`. The default scenario (8 nodes, 2,400
    rps for 120 s: ~288k requests, 12k controller ticks, ~0.2 GiB; a default compare queues 43 runs)
    is far inside each."""

    requests: float = 20e6           # requests simulated in one run
    events: float = 20e6             # controller ticks and metric windows in one run
    memory_gib: float = 16.0         # estimated peak memory of one run
    runs: int = 1000                 # simulation runs one command queues
    refresh_rows: float = 2e10       # EMB rows re-ranked in one run: refreshes x nodes x items (~10 ms
                                     # a million rows; the default scenario: 4.8e8)


LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class Cost:
    """One quantity a command is about to ask for, and the options it comes from."""

    quantity: str                    # "requests", "runs", ...
    amount: float
    limit: float
    because: str                     # e.g. "--rps 1e+12 x --duration 120"


def check_costs(costs: list[Cost], allow_large: bool = False) -> None:
    """Refuse the first cost past its limit, unless `allow_large`."""
    for c in costs:
        if not c.amount <= c.limit and not allow_large:
            raise HelmInputError(f"{c.because} asks for ~{_amount(c.amount)} {c.quantity} (limit {_amount(c.limit)}); "
                                 "pass --allow-large to run it anyway")


def _amount(x: float) -> str:
    return f"{x:,.0f}" if 100 <= x < 1e9 else f"{x:.3g}"


def run_memory_bytes(requests: float = 0.0, nodes: int = 0, trace_rows: float = 0.0) -> float:
    return requests * REQUEST_BYTES + nodes * NODE_BYTES + trace_rows * TRACE_ROW_BYTES


def refresh_rows(duration_s: float, refresh_s: float, nodes: int, n_items: int) -> float:
    """EMB rows a run re-ranks: every node's table at each refresh, and once at the start."""
    return (duration_s / refresh_s + 1) * max(nodes, 1) * n_items


def max_rate(duration_s: float, nodes: int) -> float:
    """The highest base rate (requests/s) whose run of `duration_s` on `nodes` stays within the
    request and memory limits (a capacity search probes no higher without --allow-large)."""
    memory = (LIMITS.memory_gib * GIB - nodes * NODE_BYTES) / REQUEST_BYTES
    return max(min(LIMITS.requests, memory), 0.0) / duration_s


def host_memory_bytes() -> float | None:
    """This machine's physical memory, where the OS says (None elsewhere)."""
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return None


def check_host_memory(need_bytes: float, what: str) -> None:
    """Refuse what asks for more than half this machine's memory (`what`: the options it comes
    from); nothing where the OS does not say how much there is."""
    have = host_memory_bytes()
    if have is not None and need_bytes > 0.5 * have:
        raise HelmInputError(f"{what} ask for ~{need_bytes / GIB:.3g} GiB of memory, more than half this machine's "
                             f"{have / GIB:.3g} GiB")


def count_lines(path: str) -> int | None:
    """Lines in a file (an upper bound on its rows), or None if it cannot be read or is no regular
    file (a pipe would block); reading errors are left to the trace reader, which names them."""
    if not Path(path).is_file():
        return None
    try:
        with open(path, "rb") as f:
            lines, last = 0, b"\n"
            for block in iter(lambda: f.read(1 << 20), b""):
                lines, last = lines + block.count(b"\n"), block[-1:]
            return lines + (last != b"\n")
    except OSError:
        return None

