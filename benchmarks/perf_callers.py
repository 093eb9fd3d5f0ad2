"""Who calls a leaf function in the simulator's compiled code: perf samples attributed by return address.

    python benchmarks/perf_map.py --router helm --emb-sample 16 &            # prints "profiling PID"
    perf record -F 2000 --call-graph dwarf,64 -p PID -o sim.data             # Ctrl-C at "done"
    python benchmarks/perf_callers.py sim.data MAP NRT_incref NRT_decref   # MAP: perf-PID.map in perf_map.PERF_MAP_DIR

perf cannot unwind numba's code (no frame pointers, no unwind tables), so `perf report -G` shows
no callers of a leaf such as numba's reference counts. A leaf that pushes nothing still has its
return address on top of the stack, and `--call-graph dwarf,64` records the top 64 bytes of the
stack with every sample: this script reads those bytes from `perf script -D` for the samples whose
instruction lies in one of the named functions, and names the caller the return address lies in
(from the map `perf_map.py` writes). Samples taken after the leaf pushed a register are misread
(few for a leaf of a handful of instructions). Asserts nothing.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import re
import struct
import subprocess

SAMPLE = re.compile(r"PERF_RECORD_SAMPLE\(IP, 0x[0-9a-f]+\): \d+/\d+: (0x[0-9a-f]+)")
RAW_ROW = re.compile(r"\.  [0-9a-f]{4}:  ((?:[0-9a-f]{2} ){1,16})")
USTACK = re.compile(r"\.\.\. ustack: size (\d+), offset (0x[0-9a-f]+)")


class Symbols:
    """A perf JIT map (start, size, name per line) to look addresses up in."""

    def __init__(self, path: str):
        rows = sorted((int(a, 16), int(s, 16), n.strip()) for a, s, n in (ln.split(" ", 2) for ln in open(path)))
        self.rows, self.starts = rows, [r[0] for r in rows]

    def name(self, addr: int) -> str | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0 and addr < self.rows[i][0] + self.rows[i][1]:
            return re.sub(r"B\d+v\d+B.*", "", self.rows[i][2])     # numba's mangled name, less its type suffix
        return None


def callers(data: str, symbols: Symbols, leaves: list[str]) -> tuple[int, collections.Counter]:
    """(samples in the leaves, their callers' names counted)."""
    out = subprocess.run(["perf", "script", "-i", data, "-D"], capture_output=True, text=True, check=True).stdout
    raw, ip, total, counts = bytearray(), None, 0, collections.Counter()
    for line in out.splitlines():
        if line.startswith(". ... raw event"):
            raw = bytearray()
        elif m := RAW_ROW.match(line):
            raw += bytes.fromhex(m.group(1).replace(" ", ""))
        elif m := SAMPLE.search(line):
            ip = int(m.group(1), 16)
        elif (m := USTACK.match(line)) and ip is not None:
            name = symbols.name(ip)
            if name and any(leaf in name for leaf in leaves) and int(m.group(1)) >= 8:
                total += 1
                ret = struct.unpack_from("<Q", raw, int(m.group(2), 16) + 8)[0]    # after the u64 size
                counts[symbols.name(ret) or "(outside the map)"] += 1
            ip = None
    return total, counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", help="perf.data recorded with --call-graph dwarf,64")
    ap.add_argument("map", help="the perf-PID.map perf_map.py wrote")
    ap.add_argument("leaves", nargs="+", help="names (or parts of names) of the leaf functions")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    total, counts = callers(args.data, Symbols(args.map), args.leaves)
    print(f"{total} samples in {', '.join(args.leaves)}; by caller:")
    for name, k in counts.most_common(args.top):
        print(f"{k:7d} {100 * k / max(total, 1):5.1f} %  {name}")


if __name__ == "__main__":
    main()
