"""The timings behind `helmgr calibrate`, taken on a `NodeRuntime` the way it serves.

Every figure is the median of `repeats` timed runs after `warmup` untimed ones -- at least
`FAST_REPEATS` for the lookups, copies and gathers, which take microseconds to milliseconds: a
miss's extra cost is the difference of two such medians, and with 2 runs on a busy 2-core machine
it came out shrinking with size in 87 of 300 tries (0 of 150 with 15). On CUDA each run
is bracketed by synchronizes. Serving rarely finds a lookup's maps or a request's K/V in the
core's private caches: the request before it ran the model over other data in between. So each
timed run here starts with those caches flushed (a buffer larger than them is written first,
untimed) -- on CPU 4 MiB, past the per-core L2 but not the shared L3, which a few-MB request
working set does not clear either (flushing past L3 made every lookup pay DRAM and the
prediction 11 % high on this machine; flushing nothing, 14-32 % low) -- lookups draw
fresh random ids every run (resident ones for a hit, absent ones for a miss), and request shapes
are served round-robin over several users, which also spreads a slow spell of a shared machine
over every shape instead of spoiling one. Batches (`batches`) are b requests of one shape, each a
different user's, served by `NodeRuntime.serve_batch`, the sizes and shapes taken in turn.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import numpy as np
import torch

from helmgr.core.costs import CostModel
from helmgr.core.errors import HelmInputError
from helmgr.real.emb import EMPTY
from helmgr.real.runtime import NodeRuntime, RealRequest

Shape = tuple[int, int, int, int]       # prefix_len, cached, new_tokens, candidates
USERS_PER_SHAPE = 3
BATCH_USERS = 1 << 30          # users of the batches start here, apart from the single requests' ones
FAST_REPEATS = 15       # the fewest timed runs of a lookup, copy or gather point (see above)
FLUSH_BYTES = {"cpu": 4 << 20, "cuda": 256 << 20}      # past a CPU core's L2 (not the L3); past a GPU's L2


def sizes(top: int, n: int = 4, factor: int = 4) -> list[int]:
    """`top` and the n - 1 sizes below it, each `factor` times smaller."""
    return sorted({max(1, top // factor ** i) for i in range(n)})


class Measure:
    def __init__(self, rt: NodeRuntime, repeats: int, warmup: int, seed: int):
        self.rt, self.repeats, self.warmup = rt, repeats, warmup
        self.fast_repeats = max(repeats, FAST_REPEATS)
        self.device = rt.device
        self.rng = np.random.default_rng(seed)
        self._scratch = torch.empty(FLUSH_BYTES[self.device.type], dtype=torch.uint8, device=self.device)

    def flush(self) -> None:
        """Evict the caches by writing a buffer larger than them."""
        self._scratch.fill_(len(self._scratch) & 0xFF ^ self.rng.integers(256))

    def _timed(self, fn: Callable[[], object]) -> float:
        self.flush()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t = time.perf_counter()
        fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t

    def _rounds(self, runs: list[Callable[[], float]], repeats: int | None = None) -> list[float]:
        """Median time of each run, the runs taken in turn, `warmup + repeats` rounds (default:
        `self.repeats`)."""
        times = [[run() for run in runs] for _ in range(self.warmup + (repeats or self.repeats))][self.warmup:]
        return [statistics.median(col) for col in zip(*times)]

    # -- EMB ------------------------------------------------------------------------------
    def _pick(self, ids: torch.Tensor, n: int) -> torch.Tensor:
        return ids[torch.from_numpy(self.rng.choice(len(ids), n, replace=False)).to(ids.device)]

    def emb(self) -> tuple[list[dict], list[dict]]:
        """Lookups of n distinct resident ids (hits) and of n distinct absent ids (misses: host
        gather, copy in, admission), the cache full first."""
        emb, n_rows = self.rt.emb, self.rt.pool.n_rows
        emb.lookup(torch.arange(min(n_rows, emb.n_items // 2)))
        top = min(4096, n_rows // 4, (emb.n_items - n_rows) // 4)
        if top < 16:
            raise HelmInputError(f"--pool-mib / --n-items: calibration needs >= 64 EMB rows and as many items "
                                 f"outside them, got {n_rows} rows of {emb.n_items} items")
        resident = lambda n: self._pick(emb.item_of[emb.item_of != EMPTY], n)
        absent = lambda n: self._pick(torch.nonzero(emb.slot_of == EMPTY).flatten(), n)
        ns = sizes(top)
        runs = [lambda n=n, ids=ids: self._lookup(ids(n)) for ids in (resident, absent) for n in ns]
        times = self._rounds(runs, self.fast_repeats)
        rows = [{"ids": n, "bytes": n * self.rt.pool.row_bytes} for n in ns]
        return ([r | {"s": t} for r, t in zip(rows, times[:len(ns)])],
                [r | {"s": t} for r, t in zip(rows, times[len(ns):])])

    def _lookup(self, ids: torch.Tensor) -> float:
        return self._timed(lambda: self.rt.emb.lookup(ids))

    # -- copies and gathers ---------------------------------------------------------------
    def h2d(self) -> list[dict]:
        """One copy into device memory: pinned host to device on CUDA, host to host on CPU."""
        pinned, runs, nbytes = self.device.type == "cuda", [], (4 << 10, 64 << 10, 1 << 20, 16 << 20)
        for n in nbytes:
            src = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
            dst = torch.empty(n, dtype=torch.uint8, device=self.device)
            runs.append(lambda src=src, dst=dst: self._timed(lambda: dst.copy_(src, non_blocking=True)))
        return [{"bytes": n, "s": t} for n, t in zip(nbytes, self._rounds(runs, self.fast_repeats))]

    def host_gather(self) -> list[dict]:
        """Random host-table rows gathered into a staging buffer (pinned on CUDA), as a miss does."""
        host, ns = self.rt.emb.host, sizes(4096)
        outs = [torch.empty(n, host.shape[1], dtype=host.dtype, pin_memory=self.device.type == "cuda") for n in ns]
        times = self._rounds([lambda out=out: self._gather(host, out) for out in outs], self.fast_repeats)
        return [{"rows": n, "s": t} for n, t in zip(ns, times)]

    def _gather(self, host: torch.Tensor, out: torch.Tensor) -> float:
        idx = torch.from_numpy(self.rng.integers(0, len(host), len(out)))
        return self._timed(lambda: torch.index_select(host, 0, idx, out=out))

    def gemm(self) -> dict:
        n = 8192 if self.device.type == "cuda" else 1024
        a, b = (torch.randn(n, n, device=self.device) for _ in range(2))
        s, = self._rounds([lambda: self._timed(lambda: a @ b)])
        return {"n": n, "s": s, "tflops": 2 * n ** 3 / s / 1e12}

    # -- requests -------------------------------------------------------------------------
    def _history(self, user: int, start: int, stop: int) -> np.ndarray:
        """The synthetic history of `user`: consecutive item ids from a base of its own."""
        base = (user % 997) * self._stride % max(1, self.rt.emb.n_items - self._stride)
        return np.arange(base + start, base + stop)

    def _room(self, shapes: list[Shape], users: int = 1) -> None:
        """Refuse shapes whose `users` histories of the longest do not fit the KV cache together."""
        self._stride = max(p + new + c for p, _, new, c in shapes)
        longest, per_page = max(p + new for p, _, new, _ in shapes), self.rt.kv.tokens_per_page
        if self.rt.pool.kv_pages < users * -(-longest // per_page):
            raise HelmInputError(f"--pool-mib / --ratio: the KV cache holds {self.rt.pool.kv_pages * per_page} "
                                 f"tokens, fewer than {users} x the {longest} of the longest history measured")

    def _request(self, user: int, shape: Shape) -> RealRequest:
        """`shape` as a request of `user`, its prefix put in the KV cache first on a hit (untimed)."""
        prefix_len, cached, new, cands = shape
        if cached and self.rt.kv.peek(user) < prefix_len:
            self.rt.kv.put(user, *self._prefill(self._history(user, 0, prefix_len)))
        ids = self._history(user, prefix_len, prefix_len + new + cands)
        return RealRequest(user, prefix_len, ids[:new], ids[new:])

    def compute(self, shapes: list[Shape], cost: CostModel, on_round: Callable[[], None]) -> list[dict]:
        """Each shape served by `NodeRuntime.serve`, one request per shape per round; the KV,
        prefill/extend and scoring parts are timed (the EMB lookup is measured apart)."""
        self._room(shapes)
        fresh = iter(range(1 << 40, 1 << 41))
        times: list[list[tuple[float, float]]] = [[] for _ in shapes]
        for r in range(self.warmup + self.repeats):
            for k, shape in enumerate(shapes):
                req = self._request((k * USERS_PER_SHAPE + r % USERS_PER_SHAPE) if shape[1] else next(fresh), shape)
                self.flush()
                s = self.rt.serve(0.0, *req, self._history)
                assert s.kv_tokens == shape[1], (s.kv_tokens, shape)
                times[k].append((s.kv_s + s.compute_s + s.score_s, s.score_s))
            on_round()
        out = []
        for (prefix_len, cached, new, cands), ts in zip(shapes, times):
            ts = ts[self.warmup:]
            out.append({"prefix_len": prefix_len, "cached": cached, "new_tokens": new, "candidates": cands,
                        "flops": cost.request_flops(prefix_len - cached + new, cached, cands),
                        "s": statistics.median(t for t, _ in ts), "score_s": statistics.median(t for _, t in ts)})
        return out

    def batches(self, shapes: list[Shape], sizes: Sequence[int], cost: CostModel,
                on_round: Callable[[], None]) -> list[dict]:
        """Batches of b requests of one shape (b in `sizes`, each request a different user's)
        served by `NodeRuntime.serve_batch`, every (shape, b) once per round; the KV, batched
        extend and batched scoring parts are timed (the EMB lookup is measured apart). `rows`
        and `flops` are the batch's as `Node.serve_batch` counts them."""
        top = max(sizes)
        self._room(shapes, top)
        fresh = iter(range(1 << 41, 1 << 42))
        runs = [(k, b) for k in range(len(shapes)) for b in sizes]
        times: list[list[float]] = [[] for _ in runs]
        for r in range(self.warmup + self.repeats):
            for (k, b), ts in zip(runs, times):
                first = BATCH_USERS + (k * USERS_PER_SHAPE + r % USERS_PER_SHAPE) * top
                users = range(first, first + b) if shapes[k][1] else [next(fresh) for _ in range(b)]
                for u in users:                # most recent first, so that the prefills below evict none of them
                    if self.rt.kv.peek(u):
                        self.rt.kv.get(u)
                batch = [self._request(u, shapes[k]) for u in users]
                self.flush()
                served = self.rt.serve_batch(0.0, batch, self._history)
                assert [s.kv_tokens for s in served.services] == [shapes[k][1]] * b
                ts.append(served.kv_s + served.compute_s + served.score_s)
            on_round()
        out = []
        for (k, b), ts in zip(runs, times):
            prefix_len, cached, new, cands = shapes[k]
            tokens = prefix_len - cached + new
            flops = b * cost.request_flops(tokens, cached, cands)
            out.append({"prefix_len": prefix_len, "cached": cached, "new_tokens": new, "candidates": cands,
                        "batch": b, "rows": b * (tokens + cands), "flops": flops,
                        "s": statistics.median(ts[self.warmup:])})
        return out

    def _prefill(self, ids: np.ndarray):
        rows = self.rt.emb.host[torch.from_numpy(ids)].to(self.device)
        _, kv = self.rt.model.prefill(rows)
        return kv.k, kv.v
