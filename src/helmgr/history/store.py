"""Users' action histories on disk: built from a log in one pass, read by position, appended durably.

A store is a folder:

- `base.npy`: every user's items in time order, users one after another (int64, memory-mapped);
- `offsets.npy`: where each user's items start in it (n_users + 1, int64);
- `journal.bin`: what was appended since, one frame per append: a header (user int64, count
  int32, CRC-32 of the items) and the items (int64). An append writes its whole frame and fsyncs
  before it returns, so an acknowledged append survives a crash or a restart. Opening the store
  reads the journal back and cuts a torn last frame (a crash mid-write): an append is there whole
  or not at all. A store opened read-only (`HistoryStore(folder, read_only=True)`: `helmgr history
  stat`) writes nothing: it counts such a tail's bytes and leaves them for the next writer to cut;
- `meta.json`: users, items, the base's actions, the log it was built from.

Opening checks every file against the others (`read_meta`, `read_arrays`): a store that is not
whole is a HelmInputError naming the file, never a wrong count.

Users and items are the log's dense ids (`workload.trace.read_trace`: sorted tokens, numbered).
A user the base does not hold starts with an empty history; appends may create it.
Several processes may read and append to one store: an append holds a lock on the journal while
it reads the others' appends and writes its own (so the length it answers counts them); a reader
sees the others' appends after `refresh()`.
"""
from __future__ import annotations

import fcntl
import io
import json
import os
import shutil
import struct
import zlib
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from helmgr.core.errors import HelmInputError

FORMAT = 1
HEADER = struct.Struct("<qiI")          # user, count, CRC-32 of the items' bytes
FILES = ("meta.json", "base.npy", "offsets.npy")
META_COUNTS = ("users", "items", "base_actions")


class StoreUnavailable(HelmInputError):
    """The store cannot be reached (a Redis server down): serving answers 503 naming it."""


def read_meta(folder: Path) -> dict:
    """`folder`'s meta.json; a HelmInputError unless it is UTF-8 JSON, an object of this format
    whose users, items and base_actions are integers >= 0."""
    where = f"history store {str(folder)!r}: meta.json"
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:                # ValueError: not UTF-8, not JSON
        raise HelmInputError(f"{where} is not readable JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise HelmInputError(f"{where} must be a JSON object, it is a JSON {type(meta).__name__}")
    if meta.get("format") != FORMAT:
        raise HelmInputError(f"history store {str(folder)!r} has format {meta.get('format')!r}, "
                             f"this helmgr reads {FORMAT}")
    bad = {k: meta.get(k) for k in META_COUNTS if type(meta.get(k)) is not int or meta[k] < 0}
    if bad:
        raise HelmInputError(f"{where}: {', '.join(bad)} must be integers >= 0, got {bad}")
    return meta


def read_arrays(folder: Path, meta: dict) -> tuple[np.ndarray, np.ndarray]:
    """`folder`'s base.npy (memory-mapped) and offsets.npy; a HelmInputError unless both are 1-D
    int64, the offsets are users + 1, rise from 0 to the base's length without falling, the base
    holds base_actions items, each in [0, items)."""
    base, offsets = _npy(folder, "base.npy", "r"), _npy(folder, "offsets.npy", None)
    where = f"history store {str(folder)!r}"
    n = len(base)
    if len(offsets) != meta["users"] + 1:
        raise HelmInputError(f"{where}: offsets.npy has {len(offsets)} entries, meta.json's "
                             f"{meta['users']} users need {meta['users'] + 1}")
    if offsets[0] != 0 or offsets[-1] != n or (np.diff(offsets) < 0).any():
        raise HelmInputError(f"{where}: offsets.npy must rise from 0 to base.npy's length {n} without falling, "
                             f"got {offsets[:4].tolist()} .. {offsets[-1]}")
    if n != meta["base_actions"]:
        raise HelmInputError(f"{where}: base.npy holds {n} items, meta.json says base_actions {meta['base_actions']}")
    if n and not (0 <= base.min() and base.max() < meta["items"]):
        raise HelmInputError(f"{where}: base.npy holds items outside [0, {meta['items']}) "
                             f"(min {base.min()}, max {base.max()})")
    return base, offsets


def _npy(folder: Path, name: str, mmap_mode: str | None) -> np.ndarray:
    """The 1-D int64 array in `folder / name`; a HelmInputError naming a file that is empty, no
    .npy, cut short or another array."""
    where = f"history store {str(folder)!r}: {name}"
    try:
        with open(folder / name, "rb") as f:
            head = f.read(len(np.lib.format.MAGIC_PREFIX))
        if head != np.lib.format.MAGIC_PREFIX:
            raise ValueError("the file is empty" if not head else "no .npy header")
        a = np.load(folder / name, mmap_mode=mmap_mode, allow_pickle=False)
    except EOFError:
        raise HelmInputError(f"{where} is cut short") from None
    except (OSError, ValueError) as exc:
        raise HelmInputError(f"{where} is not a readable .npy array ({exc})") from None
    if a.ndim != 1 or a.dtype != np.int64:
        raise HelmInputError(f"{where} must be a 1-D int64 array, it is {a.dtype} of shape {a.shape}")
    return a


def by_user(user: np.ndarray, item: np.ndarray, time: np.ndarray, n_users: int) -> tuple[np.ndarray, np.ndarray]:
    """The interactions' items grouped by user, each user's in time order (ties in file order),
    and where each user's start (n_users + 1 offsets): what both stores are built from."""
    order = np.lexsort((np.arange(len(user)), time, user))
    return item[order].astype(np.int64), np.r_[0, np.cumsum(np.bincount(user, minlength=n_users))].astype(np.int64)


def build(folder: Path, user: np.ndarray, item: np.ndarray, time: np.ndarray, n_users: int, n_items: int,
          source: str = "") -> "HistoryStore":
    """A store of the interactions (`user`, `item`, `time`: a `Log`'s columns) in `folder`, which
    must not exist yet: each user's items in time order (ties in file order)."""
    folder = Path(folder)
    if folder.exists():
        raise HelmInputError(f"history store {str(folder)!r} already exists: remove it or name another folder")
    items, offsets = by_user(user, item, time, n_users)
    tmp = folder.with_name(folder.name + ".building")       # a build cut short leaves only this
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        np.save(tmp / "base.npy", items)
        np.save(tmp / "offsets.npy", offsets)
        (tmp / "journal.bin").touch()
        meta = {"format": FORMAT, "users": int(n_users), "items": int(n_items), "base_actions": int(len(item)),
                "source": source}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        os.replace(tmp, folder)             # the store appears whole or not at all
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise HelmInputError(f"cannot write history store {str(folder)!r}: {exc.strerror or exc}") from None
    return HistoryStore(folder)


class Store:
    """What both stores share: an append's checks, `stat`'s record, and `with` closing them."""

    @staticmethod
    def checked(user: int, items, n_items: int) -> np.ndarray:
        """`items` of an append of `user`, as int64: a HelmInputError unless the user is in
        [0, 2^62) and there are 1 or more items, each in the catalogue."""
        items = np.asarray(items, np.int64).ravel()
        if not 0 <= user < 1 << 62:
            raise HelmInputError(f"user {user} must be an integer in [0, 2^62)")
        if len(items) == 0 or items.min() < 0 or items.max() >= n_items:
            raise HelmInputError(f"append of user {user}: 1 or more items, each in [0, {n_items}), "
                                 f"got {items.tolist()[:8]}")
        return items

    def refresh(self) -> None:
        """Catch up with other processes' appends (nothing to do where every read is current)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def record(new_users: int, base_users: int, base_actions: int, appends: int, appended_actions: int, items: int,
               torn_bytes_cut: int, source: str, torn_bytes_left: int = 0) -> dict:
        """`stat`: users and actions, the base's and the appends'; a torn journal tail's bytes,
        cut by a writer's open or left in place by a read-only one."""
        return {"users": base_users + new_users, "actions": base_actions + appended_actions,
                "base_users": base_users, "base_actions": base_actions, "appends": appends,
                "appended_actions": appended_actions, "items": items, "torn_bytes_cut": torn_bytes_cut,
                "torn_bytes_left": torn_bytes_left, "source": source}


class HistoryStore(Store):
    """A built store, opened: `length`, `items` and `append` by user. `read_only`: nothing is
    ever written (no append, a torn journal tail counted in `left_bytes`, not cut)."""

    def __init__(self, folder: Path, read_only: bool = False):
        self.folder, self.read_only = Path(folder), read_only
        missing = [f for f in FILES if not (self.folder / f).is_file()]
        if missing:
            raise HelmInputError(f"{str(self.folder)!r} is not a history store (no {', '.join(missing)}; "
                                 f"build one with `helmgr history build`)")
        self.meta = read_meta(self.folder)
        self.base, self.offsets = read_arrays(self.folder, self.meta)
        self.added: dict[int, np.ndarray] = {}          # user -> its appended items, in order
        self.appends = self.appended_actions = self.cut_bytes = self.left_bytes = 0
        self.journal = self._open_journal()
        self._end = 0                                   # journal bytes read into `added`
        self.refresh()

    def _open_journal(self):
        """journal.bin, for appending (created if missing) or, read-only, for reading (an empty
        stand-in if missing); a HelmInputError naming it where it cannot be opened (a folder)."""
        path = self.folder / "journal.bin"
        try:
            return open(path, "rb" if self.read_only else "a+b")
        except FileNotFoundError:
            if self.read_only:
                return open(os.devnull, "rb")
            raise HelmInputError(f"history store {str(self.folder)!r}: cannot create journal.bin") from None
        except OSError as exc:
            raise HelmInputError(f"history store {str(self.folder)!r}: cannot open journal.bin "
                                 f"({exc.strerror or exc})") from None

    @property
    def n_users(self) -> int:
        """Users of the base (appends may add others)."""
        return len(self.offsets) - 1

    def refresh(self) -> None:
        """Read what other writers appended since (a reader in another process calls this to see
        their appends); a torn or corrupt last frame, left by a writer that crashed mid-write,
        is cut."""
        with self._locked():
            self._read_new()

    @contextmanager
    def _locked(self):
        """The journal to this process: a writer holds it from reading the tail to its fsync (a
        read-only store shares it with other readers)."""
        fcntl.flock(self.journal.fileno(), fcntl.LOCK_SH if self.read_only else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.journal.fileno(), fcntl.LOCK_UN)

    def _read_new(self) -> None:
        """The journal's frames past `_end` into `added`, the lock held (so a partial frame here is
        a crashed writer's, never one still writing): a torn or corrupt tail is cut, or, read-only,
        counted in `left_bytes` and left."""
        self.journal.seek(self._end)
        data = self.journal.read()
        at = 0
        while at + HEADER.size <= len(data):
            user, n, crc = HEADER.unpack_from(data, at)
            end = at + HEADER.size + 8 * n
            if n < 0 or end > len(data) or zlib.crc32(data[at + HEADER.size:end]) != crc:
                break
            self._keep(user, np.frombuffer(data, np.int64, n, at + HEADER.size).copy())
            at = end
        self._end += at
        self.left_bytes = len(data) - at if self.read_only else 0
        if at < len(data) and not self.read_only:
            self.journal.truncate(self._end)
            self.journal.flush()
            os.fsync(self.journal.fileno())
            self.cut_bytes += len(data) - at

    def _keep(self, user: int, items: np.ndarray) -> None:
        had = self.added.get(user)
        self.added[user] = items if had is None else np.concatenate([had, items])
        self.appends += 1
        self.appended_actions += len(items)

    def _base_len(self, user: int) -> int:
        return int(self.offsets[user + 1] - self.offsets[user]) if 0 <= user < self.n_users else 0

    def length(self, user: int) -> int:
        """Actions of `user` so far: the base's and every append's."""
        return self._base_len(user) + len(self.added.get(user, ()))

    def items(self, user: int, start: int, stop: int) -> np.ndarray:
        """`user`'s items at positions start .. stop - 1 (0 <= start <= stop <= length)."""
        if not 0 <= start <= stop <= self.length(user):
            raise IndexError(f"user {user} has {self.length(user)} actions, asked for positions {start}..{stop}")
        n = self._base_len(user)
        base = np.asarray(self.base[self.offsets[user] + min(start, n): self.offsets[user] + min(stop, n)]) \
            if n else np.zeros(0, np.int64)
        if stop <= n:
            return base
        return np.concatenate([base, self.added[user][max(start - n, 0): stop - n]])

    def append(self, user: int, items, at: int | None = None) -> int | None:
        """Add `items` after `user`'s last action, durably (written and fsynced before it
        returns); returns the user's new length. With `at`, only if the user has exactly `at`
        actions (the items continue the history the caller saw); None if not, nothing written."""
        if self.read_only:
            raise io.UnsupportedOperation(f"history store {str(self.folder)!r} was opened read-only: "
                                          f"append through HistoryStore(folder)")
        items = self.checked(user, items, self.meta["items"])
        payload = items.tobytes()
        frame = HEADER.pack(user, len(items), zlib.crc32(payload)) + payload
        with self._locked():
            self._read_new()                            # other writers' appends come first
            if at is not None and self.length(user) != at:
                return None
            self.journal.seek(0, os.SEEK_END)
            self.journal.write(frame)
            self.journal.flush()
            os.fsync(self.journal.fileno())
            self._end += len(frame)
            self._keep(user, items)
        return self.length(user)

    def stat(self) -> dict:
        """Users and actions: the base's, the appends', and any torn tail cut (or, read-only, left)."""
        return self.record(sum(1 for u in self.added if not 0 <= u < self.n_users), self.n_users,
                           self.meta["base_actions"], self.appends, self.appended_actions, self.meta["items"],
                           self.cut_bytes, self.meta.get("source", ""), self.left_bytes)

    def close(self) -> None:
        self.journal.close()
