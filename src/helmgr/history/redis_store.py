"""Users' histories in Redis (production): the same reads and appends as the file store.

Each user is one Redis string, `<prefix>u:<user>`, of little-endian int64 item ids: `STRLEN` / 8
is the user's length, `GETRANGE` reads positions, `APPEND` adds after the last action atomically
and answers the new length. `<prefix>meta` (a hash) holds users, items, the base's actions, the
source and the append counters; it is written last by a build, so a store is there once it is.
`<prefix>new` (a set) holds the users appends created. An append, its counters and that set go in
one MULTI/EXEC transaction, the user's key WATCHed from the length read before it. An acknowledged append is as
durable as the server keeps it: with `appendonly yes` and `appendfsync always` it survives a
crash of the server.
"""
from __future__ import annotations

import numpy as np

from helmgr.core.errors import HelmInputError
from helmgr.history.store import Store, StoreUnavailable, by_user

COUNTERS = ("appends", "appended_actions")


def connect(url: str):
    """A redis-py client for `url` (redis://host:port/db or unix:///path.sock), checked with a PING."""
    from helmgr.core.extras import require
    require("redis", what="helmgr history")
    import redis

    try:
        client = redis.Redis.from_url(url)
        client.ping()
    except ValueError as exc:
        raise HelmInputError(f"--redis {url!r}: {exc}") from None
    except redis.RedisError as exc:
        raise HelmInputError(f"--redis {url!r}: the store is down or unreachable ({exc})") from None
    return client


def build_redis(client, user: np.ndarray, item: np.ndarray, time: np.ndarray, n_users: int, n_items: int,
                source: str = "", prefix: str = "helm:") -> "RedisStore":
    """`history.store.build` into Redis under `prefix`, which must hold no store yet."""
    if client.exists(prefix + "meta"):
        raise HelmInputError(f"a history store already exists under {prefix!r}: delete it or use another prefix")
    items, offsets = by_user(user, item, time, n_users)
    items = items.astype("<i8")
    pipe = client.pipeline(transaction=False)
    for u in np.flatnonzero(np.diff(offsets)):
        pipe.set(f"{prefix}u:{u}", items[offsets[u]:offsets[u + 1]].tobytes())
        if len(pipe) >= 1000:
            pipe.execute()
    pipe.execute()
    client.hset(prefix + "meta", mapping={"format": 1, "users": int(n_users), "items": int(n_items),
                                          "base_actions": int(len(item)), "source": source}
                | {k: 0 for k in COUNTERS})
    return RedisStore(client, prefix)


class RedisStore(Store):
    """A store in Redis: `length`, `items`, `append` and `stat`, as `HistoryStore`."""

    def __init__(self, client, prefix: str = "helm:"):
        import redis

        self.client, self.prefix, self._errors = client, prefix, redis.RedisError
        meta = self._call(client.hgetall, prefix + "meta")
        if not meta:
            raise HelmInputError(f"no history store under {prefix!r} in Redis (build one with `helmgr history "
                                 f"build --redis URL`)")
        self.meta = {k.decode(): v.decode() for k, v in meta.items()}
        self.n_users, self.n_items = int(self.meta["users"]), int(self.meta["items"])

    def _call(self, f, *args):
        try:
            return f(*args)
        except self._errors as exc:
            raise StoreUnavailable(f"the Redis history store is down or unreachable ({exc})") from None

    def _key(self, user: int) -> str:
        return f"{self.prefix}u:{user}"

    def length(self, user: int) -> int:
        return self._call(self.client.strlen, self._key(user)) // 8

    def items(self, user: int, start: int, stop: int) -> np.ndarray:
        n = self.length(user)
        if not 0 <= start <= stop <= n:
            raise IndexError(f"user {user} has {n} actions, asked for positions {start}..{stop}")
        if start == stop:
            return np.zeros(0, np.int64)
        raw = self._call(self.client.getrange, self._key(user), 8 * start, 8 * stop - 1)
        return np.frombuffer(raw, "<i8").astype(np.int64)

    def append(self, user: int, items, at: int | None = None) -> int | None:
        """As `HistoryStore.append`; with `at`, the check and the append are one optimistic
        transaction (WATCH on the user's key: another client's append in between retries it)."""
        items = self.checked(user, items, self.n_items)
        return self._call(lambda: self.client.transaction(lambda pipe: self._append(pipe, user, items, at),
                                                          self._key(user), value_from_callable=True))

    def _append(self, pipe, user: int, items: np.ndarray, at: int | None) -> int | None:
        """Inside `client.transaction`: the user's key watched, its length read, then the append
        and its counters queued (the transaction executes them; a change in between retries)."""
        n = pipe.strlen(self._key(user)) // 8
        if at is not None and n != at:
            return None
        pipe.multi()
        pipe.append(self._key(user), items.astype("<i8").tobytes())
        pipe.hincrby(self.prefix + "meta", "appends", 1)
        pipe.hincrby(self.prefix + "meta", "appended_actions", len(items))
        if not 0 <= user < self.n_users:
            pipe.sadd(self.prefix + "new", user)
        return n + len(items)

    def stat(self) -> dict:
        m = {k.decode(): v.decode() for k, v in self._call(self.client.hgetall, self.prefix + "meta").items()}
        c = {k: int(m[k]) for k in COUNTERS}
        return self.record(self._call(self.client.scard, self.prefix + "new"), self.n_users, int(m["base_actions"]),
                           c["appends"], c["appended_actions"], self.n_items, 0, m.get("source", ""))

    def close(self) -> None:
        self.client.close()
