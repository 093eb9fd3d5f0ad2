"""numba checks a cached compiled function against its own source file only, but the compiled
code of a package reads constants and helpers from its other files: edit one of those and the
cache would run the old code. `clear_if_stale(package)` clears the package's numba cache whenever
any of its source files — or of the packages its compiled code calls into — changed (a digest of
them is kept beside the cache)."""
from __future__ import annotations

import hashlib
from pathlib import Path

STAMP = "numba-sources.sha1"


def clear_if_stale(package_file: str, *calls_into: str) -> None:
    """`package_file`: the package's `__init__.py` (pass `__file__`); `calls_into`: sibling
    packages whose compiled functions its compiled code inlines (e.g. "memory"). Never fails: a
    cache that cannot be read or written (a read-only install) is left as it is."""
    folder = Path(package_file).resolve().parent
    digest = hashlib.sha1()
    for src in sorted(folder.glob("*.py")) + [f for p in calls_into for f in sorted((folder.parent / p).glob("*.py"))]:
        digest.update(str(src.relative_to(folder.parent)).encode())
        digest.update(src.read_bytes())
    cache, want = folder / "__pycache__", digest.hexdigest()
    stamp = cache / STAMP
    try:
        if stamp.is_file() and stamp.read_text() == want:
            return
        for f in cache.glob("*.nb[ic]"):
            f.unlink(missing_ok=True)
        cache.mkdir(exist_ok=True)
        stamp.write_text(want)
    except OSError:
        pass
