"""Trace replay: real interaction logs as request streams.

Two formats: RecBole atomic `.inter` files (a header of `name:type` columns, then one
interaction per line; `user_id`, `item_id` and `timestamp` are used) and sequence files (`user item
item ...` per line, in time order, no timestamps: times are synthesized). A user's interactions
with the same timestamp form one request; every interaction before it is that request's prefix.

Bad input is a TraceFormatError naming file:line, never a silent drop: a binary file (a NUL
byte), bytes that are not UTF-8, a timestamp that is not a finite number within +-1e18 (nanoseconds
since 1970 fit; past it a log's span is not a finite number of seconds).

Scaling: `time_compression` divides time (by default the whole log is fitted into the run),
`clone_users` K replays each user K times under new ids with jittered times, and the overlays
`trend` and `burst` apply the synthetic regimes' drift and bursts to the real log. The overlay
`widen` (with K > 1) widens the catalogue with the clones: clone k reads every item i of its
histories and candidates as i + k x n_items, so K clones of a log of n items ask for K x n items,
each range with the log's popularity shape (a public log's catalogue fits in any EMB cache; K
copies of it may not).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from helmgr.core.errors import HelmInputError, TraceFormatError
from helmgr.core.validate import POSITIVE, Range, number
from helmgr.core.validate import seed as seed_check
from helmgr.workload.arrivals import BurstSource, Population, SessionShape, burst_schedule
from helmgr.workload.candidates import PoolCandidates
from helmgr.workload.chunk import RequestTable
from helmgr.workload.history import TraceHistory
from helmgr.workload.popularity import ItemSpace
from helmgr.workload.phases import blocks, carve
from helmgr.workload.stream import Trending, Workload

FORMATS = ("inter", "sequences")
OVERLAYS = ("trend", "burst")       # the synthetic regimes, applied to the log
WIDEN = "widen"                     # the clones get their own item ranges (--widen-catalogue)


@dataclass(frozen=True, slots=True)
class Log:
    """Interactions with dense ids: user, item, time (seconds, or synthesized), in file order."""

    user: np.ndarray
    item: np.ndarray
    time: np.ndarray
    n_users: int
    n_items: int


TIME_MAX = 1e18      # |timestamp| bound: nanoseconds since 1970 fit; past it a log's span is not a number


def _lines(path: str, f, start: int = 1):
    """(line number, text) of a file opened in binary: a NUL byte or bytes that are not UTF-8 are a
    TraceFormatError naming the line (a binary file is not a trace). A UTF-8 byte-order mark
    opening the file is dropped."""
    for lineno, raw in enumerate(f, start=start):
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if b"\0" in raw:
            raise TraceFormatError(path, lineno, "binary data (a NUL byte): not a text trace")
        try:
            yield lineno, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceFormatError(path, lineno, f"not UTF-8 text (byte {raw[exc.start]:#04x})") from None


def _dense(tokens: list[str]) -> tuple[np.ndarray, int]:
    uniq, inverse = np.unique(np.array(tokens, dtype=object).astype(str), return_inverse=True)
    return inverse.astype(np.int64), len(uniq)


def read_inter(path: str) -> Log:
    """A RecBole atomic .inter file: tab-separated, header `field:type ...`."""
    with open(path, "rb") as f:
        lines = _lines(path, f)
        header = next(lines, (1, ""))[1].rstrip("\r\n").split("\t")
        names = [h.split(":", 1)[0] for h in header]
        need = ("user_id", "item_id", "timestamp")
        missing = [n for n in need if n not in names]
        if missing:
            raise TraceFormatError(path, 1, f"header lacks column(s) {', '.join(missing)}")
        cu, ci, ct = (names.index(n) for n in need)
        users, items, times = [], [], []
        for lineno, line in lines:
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            cols = line.split("\t")
            if len(cols) != len(names):
                raise TraceFormatError(path, lineno, f"expected {len(names)} tab-separated fields, found {len(cols)}")
            try:
                t = float(cols[ct])
            except ValueError:
                raise TraceFormatError(path, lineno, f"timestamp {cols[ct]!r} is not a number") from None
            if not abs(t) <= TIME_MAX:
                raise TraceFormatError(path, lineno, f"timestamp {cols[ct]!r} is not a finite number within "
                                                     f"+-{TIME_MAX:g}")
            if not cols[cu] or not cols[ci]:
                raise TraceFormatError(path, lineno, "empty user_id or item_id")
            users.append(cols[cu]); items.append(cols[ci]); times.append(t)
    if not users:
        raise TraceFormatError(path, 1, "no interactions after the header")
    u, nu = _dense(users)
    i, ni = _dense(items)
    return Log(u, i, np.array(times), nu, ni)


def read_sequences(path: str, seed: int = 0) -> Log:
    """`user item item ...` per line. Times are synthesized: each user starts at a uniform time in
    one day and acts at exponential gaps of 10 minutes."""
    users, items, lens = [], [], []
    with open(path, "rb") as f:
        for lineno, line in _lines(path, f):
            cols = line.split()
            if not cols:
                continue
            if len(cols) < 2:
                raise TraceFormatError(path, lineno, "a line needs a user id and at least one item id")
            users.append(cols[0]); items.extend(cols[1:]); lens.append(len(cols) - 1)
    if not users:
        raise TraceFormatError(path, 1, "no sequences in the file")
    u, nu = _dense(users)
    i, ni = _dense(items)
    lens = np.array(lens)
    rng = np.random.default_rng([seed, 3])
    start = np.repeat(rng.uniform(0, 86_400.0, len(lens)), lens)
    gaps = rng.exponential(600.0, int(lens.sum()))
    first = np.r_[0, np.cumsum(lens)[:-1]]
    gaps[first] = 0.0
    csum = np.cumsum(gaps)
    t = start + csum - np.repeat(csum[first], lens)
    return Log(np.repeat(u, lens), i, t, nu, ni)


def read_trace(path: str, fmt: str, seed: int = 0) -> Log:
    if fmt not in FORMATS:
        raise HelmInputError(f"unknown trace format {fmt!r} (known: {', '.join(FORMATS)})")
    if not Path(path).exists():
        raise HelmInputError(f"trace file {path!r} does not exist")
    if not Path(path).is_file():
        raise HelmInputError(f"trace {path!r} is not a regular file")
    return read_inter(path) if fmt == "inter" else read_sequences(path, seed)


class TraceUsers:
    """Log users and their clones start at the log's beginning; injected burst users are new ids
    that replay a log user's sequence from its middle (a history, but nothing cached)."""

    def __init__(self, history: TraceHistory, n_logged: int):
        self.history, self.n_logged = history, n_logged

    def cluster(self, users: np.ndarray) -> np.ndarray:
        """The user's item range: its clone in a widened catalogue, else 0 for everyone."""
        return self.history.clone_of(users)

    def base_len(self, users: np.ndarray) -> np.ndarray:
        mid = self.history.lengths[self.history.base_of(users)] // 2
        return np.where(users < self.n_logged, 0, mid).astype(np.int32)


class TraceSource:
    def __init__(self, table: RequestTable):
        self.table = table

    def reset(self) -> None:
        pass

    def arrivals(self, rng, t0, t1):
        lo, hi = np.searchsorted(self.table.t, [t0, t1])
        return self.table.take(np.arange(lo, hi))


def replayed_before(w: Workload, t: float) -> int:
    """Requests a log's replay `w` sends before time `t` (its synthetic overlays' aside)."""
    return sum(int(np.searchsorted(src.table.t, t)) for src in w.sources if isinstance(src, TraceSource))


def _requests(log: Log, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group each user's same-time interactions: (time, user, size) per request."""
    u, t = log.user[order], log.time[order]
    start = np.r_[True, (u[1:] != u[:-1]) | (t[1:] != t[:-1])]
    idx = np.flatnonzero(start)
    sizes = np.diff(np.r_[idx, len(u)])
    return t[idx], u[idx], sizes.astype(np.int32)


def trace_workload(path: str, fmt: str = "inter", duration_s: float = 120.0, seed: int = 0,
                   time_compression: float | None = None, clone_users: int = 1, overlays: tuple[str, ...] = (),
                   candidates: int = 512, drift_per_s: float = 30.0, jitter_share: float = 0.005) -> Workload:
    number("duration", duration_s, POSITIVE)
    seed_check("seed", seed)
    number("clone-users", clone_users, Range(1), integer=True)
    if time_compression is not None:
        number("time-compression", time_compression, POSITIVE)
    bad = [o for o in overlays if o not in OVERLAYS + (WIDEN,)]
    if bad:
        raise HelmInputError(f"unknown overlay {bad[0]!r} (known: {', '.join(OVERLAYS + (WIDEN,))})")
    ranges = clone_users if WIDEN in overlays else 1     # item ranges: one per clone, or one shared
    if WIDEN in overlays and clone_users < 2:
        raise HelmInputError("--widen-catalogue needs --clone-users K > 1 (clone k takes item ids i + k x items)")
    log = read_trace(path, fmt, seed)
    order = np.lexsort((np.arange(len(log.user)), log.time, log.user))
    seq_offsets = np.r_[0, np.cumsum(np.bincount(log.user, minlength=log.n_users))]
    history = TraceHistory(log.item[order], seq_offsets, ranges, log.n_items)
    t, u, k = _requests(log, order)
    t = t - log.time.min()
    span = float(t.max()) or 1.0
    room = 1.0 - (jitter_share if clone_users > 1 else 0.0)     # leave room for the clones' jitter
    compression = time_compression or span / (duration_s * room * (1 - 1e-9))
    with np.errstate(over="ignore"):
        t = t / compression
    if not np.isfinite(t).all():
        raise HelmInputError(f"trace {path!r}: time-compression {compression:g} stretches the log's {span:g} s "
                             "past any finite time")
    rng = np.random.default_rng([seed, 4])
    parts = [RequestTable(t, u, k, np.zeros(len(t), bool))]
    for c in range(1, clone_users):
        jitter = rng.uniform(0.0, jitter_share * duration_s, log.n_users)[u]
        parts.append(RequestTable(t + jitter, u + c * log.n_users, k, np.zeros(len(t), bool)))
    table = RequestTable.concat(parts)
    table = table.take(np.argsort(table.t, kind="stable"))
    n_logged = log.n_users * clone_users
    space = ItemSpace(log.n_items * ranges, ranges)      # drift rotates items inside each clone's range
    item_counts = np.bincount(log.item, minlength=log.n_items).astype(np.float64)
    prior = np.tile(item_counts / item_counts.sum(), ranges) / ranges
    sources = [TraceSource(table)]
    bursts = []
    if "burst" in overlays:
        mean_rate = np.count_nonzero(table.t < duration_s) / duration_s
        bursts = burst_schedule(np.random.default_rng([seed, 2]), duration_s, 30.0, (5.0, 20.0), (3.0, 5.0),
                                space.n_items)
        sources.append(BurstSource(bursts, lambda t: np.full(np.shape(t), mean_rate),
                                   SessionShape(2.0, 1.0, 1.0), Population(n_logged, 0.0), 0.9, n_logged))
    return Workload(
        name=f"trace:{Path(path).name}" + "".join(f"+{o}" for o in overlays), duration_s=duration_s, seed=seed,
        space=space, users=TraceUsers(history, n_logged), history=history,
        candidates=PoolCandidates(np.random.default_rng([seed, 5]), item_counts, candidates,
                                  segment=log.n_items if ranges > 1 else 0),
        sources=sources, bursts=bursts, trending=Trending(items=max(10, min(2000, log.n_items // 20))),
        drift_per_s=drift_per_s if "trend" in overlays else 0.0, prior=prior,
        phases=carve(blocks(duration_s), [(b.start, b.end) for b in bursts]),
    )
