"""The serving router's and replica's pure parts, without a Ray cluster."""
import base64
import socket
import time

import numpy as np
import pytest

from helmgr.controller.adapter import MarginalAdapter
from helmgr.serve.config import ServeConfig
from helmgr.serve.node import ServeNode, with_new
from helmgr.routing.report import apply_report
from helmgr.serve.routing import HelmRouting, ReplicaNodes
from helmgr.routing.residency import ResidencyIndex

SMALL = ServeConfig(replicas=2, n_items=4096, candidates=8, pool_mib=4.0, shrink=32, len_median=40.0, len_cap=128,
                    n_users=1000, controller=False)


def report(first: int, events, version: int = 0, bits: np.ndarray | None = None, miss: float = -1.0) -> dict:
    bits = np.zeros(SMALL.n_items // 8, np.uint8) if bits is None else bits
    return {"kv_first": first, "kv_events": [list(e) for e in events], "emb_version": version,
            "emb_bits": base64.b64encode(bits.tobytes()).decode(), "history_miss": miss, "ratio": 0.3, "requests": 0}


def test_report_applies_new_events_once_and_the_bitmap_by_version():
    index = ResidencyIndex(2, SMALL.n_items)
    assert apply_report(index, 1, report(1, [(7, 40), (8, 12)]))
    assert index.holders == {7: {1: 40}, 8: {1: 12}}
    # the same ring re-sent with one more event: only the new one counts; 8 evicted
    assert apply_report(index, 1, report(1, [(7, 40), (8, 12), (8, 0)]))
    assert index.holders == {7: {1: 40}} and index.kv_version[1] == 3 and index.stale == 0
    bits = np.zeros(SMALL.n_items // 8, np.uint8)
    bits[0] = 0b0000_0101                                   # items 0 and 2 resident
    assert apply_report(index, 1, report(4, [], version=1, bits=bits, miss=0.25))
    assert index.resident(1, np.array([0, 1, 2])).tolist() == [1, 0, 1]
    assert index.node[1, 3] == 0.25
    assert apply_report(index, 1, report(4, [], version=1, bits=np.zeros_like(bits)))   # same version: kept
    assert index.resident(1, np.array([0])).tolist() == [1]


def test_malformed_report_is_rejected_whole():
    index = ResidencyIndex(2, SMALL.n_items)
    assert apply_report(index, 0, {})                        # no report yet
    assert not apply_report(index, 0, {"kv_first": 1})
    assert not apply_report(index, 0, report(1, [(3, 5)], version=1, bits=np.zeros(3, np.uint8)))
    assert index.holders == {}


def test_replica_nodes_reuse_the_lowest_free_index():
    m = ReplicaNodes(3)
    assert m.sync(["a", "b"]) == ([0, 1], [])
    assert m.sync(["b", "c"]) == ([0], [0])
    assert m.of == {"b": 1, "c": 0}
    assert m.sync(["b", "c", "d", "e"]) == ([2], [])       # beyond capacity: unmapped
    assert "e" not in m.of and m.ids == ["c", "b", "d"]


def test_in_flight_ignores_rejected_sends_and_dead_replicas():
    r = HelmRouting(SMALL, capacity=3, clock=lambda: 1.0)
    r.sync([("a", {}), ("b", {})])
    r.completed("a", "req1")                                 # a rejected send: never counted in
    assert r.in_flight("a") == 0
    r.routed("a", "req1", 5, 10)
    r.routed("a", "req1", 5, 10)                             # a retry of the same HTTP request
    r.completed("b", "req1")                                 # rejected on b: ignored
    assert r.in_flight("a") == 2 and r.in_flight("b") == 0
    r.completed("a", "req1")
    r.completed("a", "req1")
    r.completed("a", "req1")                                 # one too many: ignored
    assert r.in_flight("a") == 0 and not r.open
    r.routed("b", "req2", 6, 10)
    r.drop("b")
    r.completed("b", "req2")
    assert r.in_flight("b") == 0 and not r.open


def test_rank_sends_a_returning_user_to_its_prefix_unless_that_node_is_busy():
    r = HelmRouting(SMALL, capacity=3, clock=lambda: 1.0)
    r.sync([("a", report(1, [(u, 120) for u in [5] + list(range(100, 140))])), ("b", {})])
    new, cands = np.arange(4), np.arange(8)
    assert r.rank(["a", "b"], "x", 5, 120, new, cands)[0] == "a"
    for u in range(100, 140):                                # a's queue grows long with its own users
        assert r.rank(["a", "b"], f"busy{u}", u, 120, new, cands)[0] in ("a", "b")
        r.routed("a", f"busy{u}", u, 124)
    assert r.rank(["a", "b"], "y", 5, 120, new, cands)[0] == "b"
    assert r.rank(["b", "a"], None, None) == ["b", "a"]      # no request: least expected work first
    assert set(r.rank(["a", "b", "zz"], "z", 9, 0, new, cands)) == {"a", "b", "zz"}


def test_replica_that_left_is_forgotten_and_its_slot_starts_fresh():
    r = HelmRouting(SMALL, capacity=2, clock=lambda: 1.0)
    r.sync([("a", report(1, [(5, 50), (6, 60)]))])
    r.sync([("c", report(1, [(9, 30)]))])                    # a gone, c takes node 0 with versions from 1
    assert r.nodes.of == {"c": 0}
    assert r.index.holders == {9: {0: 30}}


def test_with_new_puts_the_requests_items_after_the_prefix():
    hist = lambda u, a, b: np.arange(a, b) + 1000
    ids = with_new(hist, 5, np.array([1, 2, 3]))
    assert ids(0, 0, 8).tolist() == [1000, 1001, 1002, 1003, 1004, 1, 2, 3]
    assert ids(0, 3, 7).tolist() == [1003, 1004, 1, 2]
    assert ids(0, 6, 8).tolist() == [2, 3]


def test_serving_windows_are_the_simulators_windows():
    """A replica's window goes through core.window like a simulated node's: counter deltas,
    the latencies that completed, rates from WindowStats.from_window."""
    now = [0.0]
    node = ServeNode(ServeConfig.from_dict(SMALL.to_dict()), clock=lambda: now[0])
    h = node.history
    for user in (3, 4):
        node.serve(user, 20, h(user, 20, 24), np.arange(8))
    for lat in [0.01] * 9 + [0.05]:
        node.finished(lat)
    s = node.runtime.stats
    now[0] = 2.0
    w = node.window(queue_len=1)
    assert w.arrival_rps == 2 / 2.0 and w.queue_len == 1.0
    assert w.emb_hit_rate == pytest.approx(1.0 - s.misses / s.ids)
    assert w.kv_hit_rate == 0.0 and w.new_user_share == 2 / 10          # two cold requests, ten finished
    assert w.p99_s == pytest.approx(np.percentile([0.01] * 9 + [0.05], 99))
    assert w.h2d_utilization == pytest.approx(min(1.0, s.emb_wait_s / 2.0))
    now[0] = 3.0
    empty = node.window()
    assert empty.p99_s is None and empty.arrival_rps == 0.0 and empty.emb_hit_rate == 1.0


def test_serve_node_reports_what_it_holds_and_the_controller_resizes():
    node = ServeNode(ServeConfig.from_dict(SMALL.to_dict() | {"controller": True}))
    h = node.history
    out = node.serve(3, 20, h(3, 20, 24), np.arange(8))
    assert len(out["scores"]) == 8 and np.isfinite(out["scores"]).all() and out["kv_tokens"] == 0
    out = node.serve(3, 24, h(3, 24, 28), np.arange(8))
    assert out["kv_tokens"] == 24
    rep = node.report()
    assert rep["kv_events"][-1] == [3, 28] and rep["emb_version"] == 1
    index = ResidencyIndex(1, SMALL.n_items)
    assert apply_report(index, 0, rep) and index.holders[3] == {0: 28}
    assert index.resident(0, np.arange(8)).sum() > 0
    assert node.report()["emb_version"] == 1                 # nothing changed: the same report
    node.tick()
    assert node.decisions == 1
    node.runtime.check_integrity()


def test_the_serving_controller_is_the_shipped_helm_fed_by_the_caches_shadows():
    """A replica's controller is `Controller.default()` (adapter v2 included): its windows carry
    the KV ghosts' credits, every refresh_s the EMB shadow is re-ranked, and the first window
    after a refresh closes adapter v2's sample (ticks at 1..6 s: refreshes at 2, 4, 6; samples
    at 3 and 5)."""
    now = [0.0]
    node = ServeNode(ServeConfig.from_dict(SMALL.to_dict() | {"controller": True, "pool_mib": 1.0}),
                     clock=lambda: now[0])
    assert isinstance(node.ctl.adapter, MarginalAdapter) and node.ctl.detector is not None
    h = node.history
    for w in range(6):
        for k in range(12):
            user = (12 * w + k) % 14           # 14 users cycling through a KV cache of 11 pages (one each):
            node.serve(user, 20, h(user, 20, 24), np.arange(8))     # each comes back just after its eviction
            node.finished(0.01)
        now[0] += 1.0
        node.tick()
    assert node.decisions == 6 and node.runtime.refresh_epoch == 3
    assert node.ctl.adapter.updates == 2
    assert node.runtime.stats.kv_shadow_tokens > 0 and node.runtime.kv.ghost
    node.runtime.check_integrity()


def test_reported_kv_events_track_the_cache_through_evictions():
    node = ServeNode(ServeConfig.from_dict(SMALL.to_dict() | {"pool_mib": 1.0}))
    h, index = node.history, ResidencyIndex(1, SMALL.n_items)
    for user in range(60):                                   # far more prefixes than 1 MiB holds
        node.serve(user, 100, h(user, 100, 104), np.arange(8))
        if user % 7 == 0:
            assert apply_report(index, 0, node.report())
    assert apply_report(index, 0, node.report())
    cached = {u: e.tokens for u, e in node.runtime.kv.entries.items()}
    assert 0 < len(cached) < 60
    assert index.holders == {u: {0: t} for u, t in cached.items()} and index.gaps == 0


def test_simulated_runs_the_requests_loadgen_sends():
    from helmgr.serve.loadgen import LoadConfig, requests, simulated

    cfg = ServeConfig.from_dict(SMALL.to_dict() | {"controller": True})
    load = LoadConfig(duration_s=3.0, rps=6.0, slo_ms=40.0)
    sent = list(requests(cfg, load))
    out = simulated(cfg, load)
    assert out["requests"] == out["completed"] == len(sent) > 10
    assert out["nodes"] == 2 and out["policy"] == "helm" and out["router"] == "helm"
    assert out["slo_ms"] == 40.0 and out["model"] == cfg.node_profile().model.name
    assert 0 < out["p50_ms"] <= out["p99_ms"] and out["base_policy"] == "shipped"


def test_simulated_runs_the_apps_base_policy_or_refuses_before_sending(tmp_path):
    """An app serving `--base-policy FILE`: the prediction's controller is built around that file
    (a base that always steps up: the simulated mean ratio rises above the fixed split's, where
    the shipped base leaves it in 3 s); a file not readable here is an error before anything is
    sent."""
    import numpy as np
    from helmgr.controller.mlp import MLPPolicy
    from helmgr.core.errors import HelmInputError
    from helmgr.serve.loadgen import LoadConfig, sim_base_policy, simulated

    still = tmp_path / "up.npz"
    MLPPolicy([np.zeros((4, 11)), np.zeros((1, 4))], [np.zeros(4), np.full(1, 5.0)], np.zeros(11), np.ones(11),
              max_step=0.05).save(still)
    load = LoadConfig(duration_s=3.0, rps=6.0, slo_ms=400.0)
    mine = ServeConfig.from_dict(SMALL.to_dict() | {"controller": True, "base_policy": str(still)})
    out = simulated(mine, load)
    fixed = simulated(ServeConfig.from_dict(SMALL.to_dict() | {"controller": False}), load)
    shipped = simulated(ServeConfig.from_dict(SMALL.to_dict() | {"controller": True}), load)
    assert out["base_policy"] == str(still) and out["mean_ratio"] > fixed["mean_ratio"] == shipped["mean_ratio"]
    with pytest.raises(HelmInputError, match="is not a file here"):
        sim_base_policy(ServeConfig.from_dict(mine.to_dict() | {"base_policy": str(tmp_path / "gone.npz")}))


def test_loadgen_stream_seed_draws_other_requests_of_the_same_users():
    from helmgr.serve.loadgen import LoadConfig, requests

    cfg = ServeConfig.from_dict(SMALL.to_dict())
    own = list(requests(cfg, LoadConfig(duration_s=3.0, rps=6.0)))
    assert own == list(requests(cfg, LoadConfig(duration_s=3.0, rps=6.0, seed=cfg.seed)))
    other = list(requests(cfg, LoadConfig(duration_s=3.0, rps=6.0, seed=cfg.seed + 1)))
    assert other != own
    users = lambda reqs: {r.body["user_id"] for r in reqs}
    assert max(users(own) | users(other)) < cfg.n_users                # one population


def test_emb_deltas_keep_routers_exact_and_late_ones_catch_up_when_idle():
    node = ServeNode(ServeConfig.from_dict(SMALL.to_dict() | {"pool_mib": 1.0, "n_items": 20_000, "warm": False}))
    node.reporter.FULL_EVERY, node.reporter.emb_recent = 8, 600
    every, sometimes = ResidencyIndex(1, 20_000), ResidencyIndex(1, 20_000)
    truth = lambda: np.packbits((node.runtime.emb.slot_of != -1).numpy(), bitorder="little")
    h, rng, kinds = node.history, np.random.default_rng(3), set()
    for k in range(60):
        user = int(rng.integers(0, 1000))
        node.serve(user, 30, h(user, 30, 34), rng.integers(0, 20_000, 8))
        rep = node.report()
        kinds.add("bits" if rep["emb_bits"] else "delta")
        assert apply_report(every, 0, rep)
        assert np.array_equal(every.bits[0], truth()), k            # deltas or bitmap: exact each time
        if k % 13 == 0:
            assert apply_report(sometimes, 0, rep)                  # misses most reports ...
    assert kinds == {"bits", "delta"} and every.emb_version[0] == node.reporter.emb_version
    late = ResidencyIndex(1, 20_000)
    idle = node.report()                                            # ... nothing changed: the bitmap
    assert idle["emb_bits"] and idle == node.report()               # and then the same report
    for index in (every, sometimes, late):
        assert apply_report(index, 0, idle) and np.array_equal(index.bits[0], truth())


def test_check_listen_names_a_port_in_use_and_a_host_not_on_this_machine():
    from helmgr.core.errors import HelmInputError
    from helmgr.serve.app import check_listen

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(HelmInputError, match=f"--host '127.0.0.1' --port {port}: cannot listen there"):
            check_listen("127.0.0.1", port)
    check_listen("127.0.0.1", port)                               # free again
    with pytest.raises(HelmInputError, match="--host '192.0.2.1'"):  # TEST-NET-1: no machine's own address
        check_listen("192.0.2.1", port)


def test_check_listen_lets_a_port_whose_last_server_just_stopped_be_used_again():
    """Serve's servers bind with SO_REUSEPORT only: after one stops, the connections it closed
    (TIME_WAIT) refuse an SO_REUSEADDR bind for a minute, while the next server binds fine."""
    from helmgr.serve.app import check_listen

    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = srv.accept()
        conn.close()                                              # the server closes first: its side waits
        time.sleep(0.05)
        client.close()
    with socket.socket() as plain:
        plain.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))                       # what check_listen's bind meets
    check_listen("127.0.0.1", port)                               # nothing accepts there: free to serve
    with socket.socket() as nxt:
        nxt.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        nxt.bind(("127.0.0.1", port))                             # and the next server binds


def test_serve_refuses_a_host_it_cannot_listen_on_before_starting(capsys, monkeypatch):
    pytest.importorskip("ray.serve")
    import helmgr.serve.app as app
    from helmgr.cli import main

    def never(*args, **kwargs):
        raise AssertionError("serve started")
    monkeypatch.setattr(app, "start", never)
    assert main(["serve", "--host", "192.0.2.1", "--port", "8137"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [err.strip()] and "--host '192.0.2.1' --port 8137" in err


def test_start_names_a_ray_address_it_cannot_join(monkeypatch):
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.serve")
    from helmgr.core.errors import HelmInputError
    from helmgr.serve.app import start

    def refuse(address=None, **kwargs):
        raise ConnectionError(f"could not find any running Ray instance at {address}")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(HelmInputError, match="--address 'ray://head:10001': cannot connect to Ray: could not find"):
        start(SMALL, address="ray://head:10001")


def test_a_base_policy_from_a_file_runs_in_every_replica_and_a_bad_one_is_refused(capsys, monkeypatch, tmp_path):
    """`--base-policy FILE`: the replica's controller is the shipped tiers around that base (here a
    copy of the shipped file: the same decisions as `Controller.default()`); a file that is not a
    policy, or a base policy with the controllers off, exits 2 before anything starts."""
    pytest.importorskip("ray.serve")
    import shutil

    import helmgr.serve.app as app
    from helmgr.cli import main
    from helmgr.controller import Controller
    from helmgr.controller.controller import default_policy_file
    from helmgr.core.window import WindowStats

    mine = tmp_path / "mine.npz"
    shutil.copy(default_policy_file(), mine)
    node = ServeNode(ServeConfig.from_dict(SMALL.to_dict() | {"controller": True, "base_policy": str(mine)}))
    shipped = Controller.default()
    assert node.ctl.base.meta == shipped.base.meta and isinstance(node.ctl.adapter, MarginalAdapter)
    for k in range(20):
        s = WindowStats(ratio=0.5, arrival_rps=100.0 + 30 * (k % 4), p99_s=0.01 * (1 + k % 5), slo_s=0.05)
        assert node.ctl.step(s) == shipped.step(s)

    def never(*args, **kwargs):
        raise AssertionError("serve started")
    monkeypatch.setattr(app, "start", never)
    (tmp_path / "junk.npz").write_text("not a policy")
    for argv, needle in [(["--base-policy", str(tmp_path / "junk.npz")], "is not a HELM policy"),
                         (["--base-policy", str(mine), "--no-controller"], "the ratios are fixed without them"),
                         (["--base-policy", str(tmp_path / "none.npz")], "does not exist")]:
        assert main(["serve", "--port", "8138", *argv]) == 2
        out, err = capsys.readouterr()
        errors = [line for line in err.splitlines() if "error:" in line]     # (after the pricing note)
        assert out == "" and len(errors) == 1 and needle in errors[0], err


def test_loadgen_refuses_a_server_that_is_not_a_helmgr_app_and_a_bad_out_before_sending(capsys, tmp_path):
    """A real HTTP server answering garbage (then a JSON object that is no serving configuration)
    at /v1/config is named, not a traceback; --out is checked before anything is sent."""
    import http.server
    import threading

    from helmgr.cli import main
    bodies, seen = [b"garbage", b'{"status": "ok"}'], []

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(bodies[0])

        def log_message(self, *args):
            pass
    server = http.server.HTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for _ in range(2):
            assert main(["loadgen", "--url", url, "--duration", "1"]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "does not answer as a helmgr app" in err[0] and "Traceback" not in err[0], err
            bodies.pop(0)
        assert seen == ["/v1/config"] * 2
        (tmp_path / "f").write_text("x")
        assert main(["loadgen", "--url", url, "--out", str(tmp_path / "f" / "sub")]) == 2
        assert "--out" in capsys.readouterr().err and len(seen) == 2         # refused before asking the app
    finally:
        server.shutdown()


@pytest.mark.parametrize("argv,needle", [
    (["--pool-mib", "1e308"], "--pool-mib must be in [0.25, 1048576], got 1e+308"),
    (["--pool-mib", "1e-300"], "pool-mib"),
    (["--replica-cpus", "1e300"], "--replica-cpus"), (["--replicas", "1000000"], "--replicas must be in [1, 1024]"),
    (["--slo-ms", "1e-300"], "slo-ms"), (["--max-body-kib", str(10**23)], "--max-body-kib"),
    (["--replicas", "1000"], "need 250.25 Ray CPUs"),
    (["--replicas", "64", "--replica-cpus", "0", "--device", "cuda"], "64 replicas, this machine has"),
    (["--pool-mib", "1000000"], "more than half this machine's"),
    (["--history", "/nonexistent/helmgr-store"], "/nonexistent/helmgr-store"),
])
def test_serve_refuses_an_app_it_could_not_start_in_one_line_before_ray(capsys, monkeypatch, argv, needle):
    pytest.importorskip("ray.serve")
    import helmgr.serve.app as app
    from helmgr.cli import main

    def never(*args, **kwargs):
        raise AssertionError("serve started")
    monkeypatch.setattr(app, "start", never)
    assert main(["serve", "--port", "8139"] + argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [err.strip()] and needle in err, err


@pytest.mark.parametrize("url", ["http://x:abc", "http://", "ftp://host"])
def test_loadgen_names_a_url_it_cannot_use(capsys, url):
    from helmgr.cli import main
    assert main(["loadgen", "--url", url, "--duration", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and repr(url) in err[0] and "Traceback" not in err[0], err
