"""Profile the simulator's compiled kernels with Linux `perf`, one symbol per numba function.

    python benchmarks/perf_map.py --router least-loaded --emb-sample 1 --nodes 32 --duration 20 &
    # when it prints "profiling PID", in another shell:
    perf record -F 4000 -p PID -o sim.data     # stop it (Ctrl-C) when the script prints "done"
    perf report -i sim.data --no-children --sort sym

perf cannot name JIT code: it reads a map file, `perf-PID.map` (start, size, name per line), from
the fixed folder `PERF_MAP_DIR` (perf's convention, whatever TMPDIR says). This
script runs one `simulate` of the default steady scenario (static 0.5, 162.5 req/s per node, as
`bench_sim.py`) to compile every kernel on the path, then builds the workload's tables again and,
while perf records, the same run (what `bench_sim.py` times: its chunks' generation included),
then writes that map from the LLVM modules of every numba dispatcher loaded (so callees linked
into a caller get their own names). Numba's on-disk cache keeps object code only, so run it with
an empty cache (the script points NUMBA_CACHE_DIR at a fresh folder unless one is set); a
function's size is taken up to the next one's start. Asserts nothing.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

PERF_MAP_DIR = "/tmp"                               # where perf looks for a process's JIT map: fixed by perf

if "NUMBA_CACHE_DIR" not in os.environ:             # before numba is imported: compile, don't load
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="helm-perf-")


def symbols() -> list[tuple[int, str]]:
    """(address, LLVM name) of every function defined in a loaded numba library."""
    from numba.core.registry import CPUDispatcher
    out = set()
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, CPUDispatcher):
                continue
        except ReferenceError:                       # a dead weak proxy
            continue
        for cres in obj.overloads.values():
            lib = cres.library
            for fn in lib._final_module.functions:
                if fn.is_declaration:
                    continue
                addr = lib.get_pointer_to_function(fn.name)
                if addr:
                    out.add((addr, fn.name))
    return sorted(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--router", default="least-loaded")
    ap.add_argument("--emb-sample", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--wait", type=float, default=5.0, help="seconds to wait for perf to attach")
    args = ap.parse_args()
    from helmgr.experiments.bench import RPS_PER_NODE
    from helmgr.sim import SimConfig, simulate
    from helmgr.workload import default_config, synthetic_workload
    cfg = SimConfig(nodes=args.nodes, router=args.router, seed=1,
                                                     emb_sample=args.emb_sample, policy="static")

    def workload():
        return synthetic_workload(default_config("steady", rps=RPS_PER_NODE * args.nodes, duration_s=args.duration), 1)
    simulate(cfg, workload())                        # compiles every kernel this configuration reaches
    w = workload()                                   # its tables built outside the profile, as bench_sim times it
    print(f"profiling {os.getpid()}", flush=True)
    time.sleep(args.wait)
    s = simulate(cfg, w).summary
    print(f"done: {s['requests'] / s['wall_s']:,.0f} simulated req/s ({s['wall_s']:.1f} s)", flush=True)
    syms = symbols()
    path = f"{PERF_MAP_DIR}/perf-{os.getpid()}.map"
    with open(path, "w") as f:
        for i, (addr, name) in enumerate(syms):
            size = (syms[i + 1][0] if i + 1 < len(syms) else addr + 65536) - addr
            f.write(f"{addr:x} {min(size, 1 << 20):x} {name}\n")
    print(f"{len(syms)} symbols in {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
