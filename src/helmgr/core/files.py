"""Writing results whole: the one check that a folder takes new files, and temporary files
beside their destination (with the permissions a plain write would give) to rename into place."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from helmgr.core.errors import HelmInputError


def plain_mode(base: int = 0o666) -> int:
    """The permissions a new file (0o666) or folder (0o777) gets under this process's umask
    (mkstemp and mkdtemp make theirs private)."""
    umask = os.umask(0)
    os.umask(umask)
    return base & ~umask


def check_writable(option: str, path: Path, folder: Path, what: str = "files") -> None:
    """Refuse `option` `path` when `folder` does not take a new entry (`what` it would create) —
    probed by making one (as root, permission bits alone say yes to a read-only mount or /proc)."""
    if not folder.is_dir():
        raise HelmInputError(f"{option} {str(path)!r}: folder {str(folder)!r} does not exist")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".helmgr-", dir=folder))
    except OSError as e:
        raise HelmInputError(f"{option} {str(path)!r}: cannot create {what} in {str(folder)!r} ({e.strerror})") from None


def temp_beside(dest: Path, suffix: str = "") -> str:
    """A new empty file in `dest`'s folder, plain permissions, to be renamed onto `dest`."""
    fd, tmp = tempfile.mkstemp(prefix=".helmgr-", suffix=suffix, dir=Path(dest).resolve().parent)
    os.close(fd)
    os.chmod(tmp, plain_mode())
    return tmp
