"""One request of a user at a time, in arrival order (the ingress's; no Ray).

A user's requests are its actions in order: the next one's prefix is where the last one left the
user. Two of them in flight at once would both be given the same prefix, and with a history store
only the first could be appended. `Turns.of(user)` lets a user's requests through one at a time,
first come first served (asyncio's lock is fair), and forgets a user nobody waits for.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager


class Turns:
    def __init__(self):
        self.locks: dict[int, tuple[asyncio.Lock, int]] = {}     # user -> (lock, requests holding or waiting)

    @asynccontextmanager
    async def of(self, user: int):
        lock, n = self.locks.get(user, (None, 0))
        lock = lock or asyncio.Lock()
        self.locks[user] = (lock, n + 1)
        try:
            async with lock:
                yield
        finally:
            lock, n = self.locks[user]
            if n == 1:
                del self.locks[user]
            else:
                self.locks[user] = (lock, n - 1)
