"""One runner for independent runs: sweep points, compare runs, oracle replays.

`run_all(fn, tasks)` returns `[fn(t) for t in tasks]`, in task order, computed

- in this process, one after another, with `jobs=1` (no pool, no pickling);
- on `jobs` local worker processes otherwise;
- on a Ray cluster when `ray_address` is given: "auto" (the cluster this machine belongs to), an
  address ("ray://host:10001", "host:6379"), or "local" (start one in this process, `jobs` CPUs:
  for tests and single machines). Ray is imported only then. Once connected, the process stays
  connected (Ray's own state is per process); `ray.shutdown()` ends it.

With `shared`, each call is `fn(shared, task)` and `shared` crosses to each worker once (a fork's
inheritance or one pickle per process; one `ray.put` on Ray), not once per task: the oracle's
cluster state, replayed at every ratio of a grid.

The runs must not share state: each builds its own from its task (a WorkloadSpec, a seeded
SimConfig), so a parallel result equals the serial one bit for bit. A task that raises stops the
batch (pending tasks are cancelled) and is reported by its name: HelmInputError when the worker's
error was bad input, RuntimeError otherwise. Nothing is returned for a failed batch, so a caller
never holds half of its results.
"""
from __future__ import annotations

import gc
import multiprocessing as mp
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Sequence

from helmgr.core.errors import HelmInputError

_SHARED: list = []               # in a local worker: the batch's `shared` value (set by _init)


def run_all(fn: Callable, tasks: Sequence, jobs: int = 1, ray_address: str | None = None,
            names: Sequence[str] | None = None, on_done: Callable[[int], None] | None = None,
            shared: Any = None, on_result: Callable[[int, Any], None] | None = None) -> list:
    """`[fn(t) for t in tasks]` (or `fn(shared, t)`), in task order. As task i ends, in this
    process: `on_result(i, its result)` (a study that resumes keeps it), then `on_done(i)`."""
    tasks = list(tasks)
    names = list(names) if names is not None else [f"task {i}" for i in range(len(tasks))]
    if len(names) != len(tasks):
        raise ValueError(f"{len(names)} names for {len(tasks)} tasks")
    if not tasks:
        return []

    def finished(i: int, value) -> None:
        on_result and on_result(i, value)
        on_done and on_done(i)
    if ray_address is not None:
        return _on_ray(fn, tasks, jobs, ray_address, names, finished, shared)
    if jobs <= 1 or len(tasks) == 1:
        return _serial(fn, tasks, names, finished, shared)
    return _on_processes(fn, tasks, jobs, names, finished, shared)


def failure(name: str, err: BaseException) -> Exception:
    """The error a failed task is reported with: "<name> failed: <error>"."""
    if isinstance(err, HelmInputError):
        return HelmInputError(f"{name} failed: {err}")
    return RuntimeError(f"{name} failed: {type(err).__name__}: {err}")


def _collected(fn, *args):
    """fn(*args), then a full garbage collection. A run's cluster holds its arrays (hundreds of MB)
    in reference cycles, which only a full collection frees, and Python starts one by counting
    objects, not bytes: a process running run after run grew by ~0.2 GB a run without this
    (measured: nine 60-s runs, 0.5 -> 2.3 GB), and evaluate's workers died of it."""
    try:
        return fn(*args)
    finally:
        gc.collect()


def _serial(fn, tasks, names, finished, shared) -> list:
    """The tasks in this process. What was alive before the batch is frozen out of the collector
    for its length (`gc.freeze`): each task's full collection then walks only what the tasks
    made, not the caller's state. An oracle's cluster holds its recorder's lists, millions of
    items that every replay's collection walked again: 42 of the 266 s of a 360-s steady oracle
    (8 nodes, 11 ratios), 2 s once frozen."""
    gc.freeze()
    try:
        out = []
        for i, task in enumerate(tasks):
            try:
                out.append(_collected(fn, task) if shared is None else _collected(fn, shared, task))
            except Exception as e:
                raise failure(names[i], e) from e
            finished(i, out[-1])
        return out
    finally:
        gc.unfreeze()           # (also what an enclosing batch froze: later collections walk it again)


def _init(shared) -> None:
    """A local worker's start: the batch's `shared` value, and what the fork inherited frozen
    out of the collector (as `_serial` does; nor do collections then touch the inherited pages)."""
    _SHARED[:] = [shared]
    gc.freeze()


def _call_shared(fn, task):
    return fn(_SHARED[0], task)


def _context():
    """fork where the platform has it (workers inherit `shared` without a pickle), else the default."""
    return mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()


def _on_processes(fn, tasks, jobs, names, finished, shared) -> list:
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=_context(),
                               initializer=_init, initargs=(shared,))
    try:
        if shared is None:
            futures = {pool.submit(_collected, fn, t): i for i, t in enumerate(tasks)}
        else:
            futures = {pool.submit(_collected, _call_shared, fn, t): i for i, t in enumerate(tasks)}
        out: list = [None] * len(tasks)
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=futures.get):
                i = futures[f]
                err = f.exception()
                if isinstance(err, BrokenProcessPool):
                    raise RuntimeError(f"{names[i]} failed: its worker process died ({err})") from err
                if err is not None:
                    raise failure(names[i], err) from err
                out[i] = f.result()
                finished(i, out[i])
        return out
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _on_ray(fn, tasks, jobs, address, names, finished, shared) -> list:
    from helmgr.core.extras import require
    require("serve", "ray", what="--ray-address")
    import ray
    connect(address, jobs)
    remote = ray.remote(_collected)
    ref = ray.put(shared) if shared is not None else None
    refs = [remote.remote(fn, t) if ref is None else remote.remote(fn, ref, t) for t in tasks]
    index = {r: i for i, r in enumerate(refs)}
    out: list = [None] * len(tasks)
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for r in done:
                i = index[r]
                try:
                    out[i] = ray.get(r)
                except ray.exceptions.RayTaskError as e:
                    cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else e
                    raise failure(names[i], cause) from e
                except ray.exceptions.RayError as e:
                    raise RuntimeError(f"{names[i]} failed on Ray: {type(e).__name__}: {e}") from e
                finished(i, out[i])
    finally:
        for r in pending:
            ray.cancel(r)
    return out


def connect(address: str, jobs: int = 1) -> None:
    """Connect this process to Ray at `address` ("local": start a private one of `jobs` CPUs),
    unless it is connected already."""
    import ray
    if ray.is_initialized():
        return
    if address == "local":
        # the workers inherit this process's environment (a runtime_env would do it too, at ~10 s a start)
        os.environ["PYTHONPATH"] = os.pathsep.join(_src_path())
        ray.init(num_cpus=max(1, jobs), include_dashboard=False, log_to_driver=False)
    else:
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, ValueError) as e:          # no cluster there, a malformed address
            raise HelmInputError(f"--ray-address {address!r}: cannot connect to Ray: {e}") from e


def _src_path() -> list[str]:
    """Where helmgr is imported from, so a local Ray's workers import the same code."""
    import helmgr
    here = os.path.dirname(os.path.dirname(os.path.abspath(helmgr.__file__)))
    return [here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
