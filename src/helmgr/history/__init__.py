"""Users' action histories: a store built from a log, read by position, appended durably."""
from helmgr.history.store import HistoryStore, StoreUnavailable, build


def open_store(folder: str | None = None, redis: str | None = None):
    """The store in `folder` (a `HistoryStore`) or at the Redis URL `redis` (a `RedisStore`)."""
    if (folder is None) == (redis is None):
        raise ValueError("a history store is a folder or a Redis URL, one of them")
    if redis is not None:
        from helmgr.history.redis_store import RedisStore, connect
        return RedisStore(connect(redis))
    return HistoryStore(folder)


def reader(store):
    """`history(user, start, stop)` over `store`, as the runtime asks for a KV miss's prefix: the
    store catches up with other processes' appends when asked past what it has read."""
    def history(user: int, start: int, stop: int):
        if stop > store.length(user):
            store.refresh()
        return store.items(user, start, stop)
    return history


__all__ = ["HistoryStore", "StoreUnavailable", "build", "open_store", "reader"]
