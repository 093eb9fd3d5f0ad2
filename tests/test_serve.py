"""The serving app end to end on a local Ray cluster (CPU, 2 backend replicas): one cluster for
the whole module, torn down at the end. Skipped where ray[serve] is not installed."""
import http.client
import json
import socket
import threading
import time
from dataclasses import replace
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")

from helmgr.serve import ServeConfig, start, stop  # noqa: E402
from helmgr.serve.loadgen import LoadConfig, loadgen  # noqa: E402
from helmgr.workload import synthetic_workload  # noqa: E402

def _free_port() -> int:
    """A port nothing listens on now: a fixed one stays in TIME_WAIT after a run, and a second run
    of this file within a minute found it taken (Ray's NoAvailablePortError)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT = _free_port()
# a deadline far above the service time: the tests check that no request is lost, and a CPU shared
# with other test workers must not cut one
CFG = ServeConfig(replicas=2, replica_cpus=0.25, stats_period_s=0.5, window_s=1.0, deadline_ms=10_000.0)
# the app's class table: every synthetic user is `home` (feed); `bulk` is sheddable with a target
# no replica can meet, so each of its requests is refused
CLASSES = """
[classes.feed]
slo_ms = 15.0
[classes.bulk]
slo_ms = 0.001
band = 1
sheddable = true
[tenants.home]
class = "feed"
share = 1.0
"""


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    table = tmp_path_factory.mktemp("classes") / "classes.toml"
    table.write_text(CLASSES)
    try:
        url = start(replace(CFG, classes=str(table)), port=PORT, num_cpus=2)   # the ingress serves PORT itself
        yield url, synthetic_workload(CFG.workload_config(), CFG.seed).history
    finally:
        stop()


def post(url: str, body) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/v1/recommend", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def body(history, user: int, prefix: int, n_cands: int = 16) -> dict:
    return {"user_id": user, "prefix_len": prefix, "new_items": history(user, prefix, prefix + 4).tolist(),
            "candidates": list(range(100, 100 + n_cands))}


def test_scores_routing_back_to_the_prefix_and_metrics(app):
    url, history = app
    first = {}
    for user in (11, 12, 13, 14):
        status, out = post(url, body(history, user, 60, n_cands=16 + user))
        assert status == 200, out
        assert len(out["scores"]) == 16 + user and np.isfinite(out["scores"]).all()
        assert not out["kv_hit"] and out["prefix_len"] == 60
        first[user] = out["node"]
    for user in (11, 12, 13, 14):                  # sequential: no node is busy, so back to the prefix
        status, out = post(url, body(history, user, 64))
        assert status == 200 and out["kv_hit"] and out["kv_tokens"] == 64 and out["node"] == first[user], out
    with urllib.request.urlopen(url + "/healthz") as r:
        assert json.loads(r.read())["status"] == "ok"
    families = metrics(url)
    assert any(s.labels["kv_hit"] == "true" and s.labels["class"] == "none" for s in families["helm_requests"])
    assert families["helm_request_latency_seconds"] and "helm_ratio" in families
    assert "helm_controller_decisions" in families


def metrics(url: str) -> dict:
    """/metrics, parsed with Prometheus's own parser: family name -> its samples."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url + "/metrics") as r:
        return {f.name: f.samples for f in text_string_to_metric_families(r.read().decode())}


def test_classes_label_answers_and_metrics_and_a_sheddable_class_is_refused(app):
    url, history = app
    status, out = post(url, body(history, 31, 40) | {"tenant": "home"})
    assert status == 200 and out["class"] == "feed"
    assert post(url, body(history, 32, 40) | {"class": "feed"})[1]["class"] == "feed"
    for bad, loc, needle in (({"class": "gold"}, "class", "unknown class 'gold' (known: feed, bulk)"),
                             ({"tenant": "nobody"}, "tenant", "unknown tenant 'nobody' (known: home)"),
                             ({"tenant": "home", "class": "bulk"}, "class", "is in class 'feed', not 'bulk'")):
        status, out = post(url, body(history, 33, 40) | bad)
        assert status == 422 and out["detail"][0]["loc"] == ["body", loc] and needle in out["detail"][0]["msg"], out
    assert post(url, body(history, 35, 40))[1]["class"] == "none"          # names neither: as without a table
    status, out = post(url, body(history, 34, 40) | {"class": "bulk"})
    assert status == 429 and out["detail"][0]["type"] == "shed", out
    families = metrics(url)
    assert {s.labels["class"] for s in families["helm_requests"]} >= {"feed", "none"}
    assert any(s.labels["class"] == "feed" for s in families["helm_request_latency_seconds"])
    shed = [s for s in families["helm_shed"] if s.name == "helm_shed_total"]
    assert [(s.labels, s.value) for s in shed] == [({"class": "bulk", "reason": "late"}, 1.0)]


@pytest.mark.parametrize("bad, field", [
    ({"new_items": [1], "candidates": [2]}, "user_id"),
    ({"user_id": 3, "new_items": [1]}, "candidates"),
    ({"user_id": 3, "new_items": [], "candidates": [2]}, "new_items"),
    ({"user_id": 3, "new_items": [1], "candidates": ["x"]}, "candidates"),
    ({"user_id": 3, "new_items": [1], "candidates": [CFG.n_items]}, "candidates"),
    ({"user_id": 3, "new_items": [1], "candidates": [2], "prefix_len": -1}, "prefix_len"),
    ({"user_id": 3, "new_items": [1], "candidates": [2], "colour": 1}, "colour"),
])
def test_malformed_body_is_422_naming_the_field(app, bad, field):
    status, out = post(app[0], bad)
    assert status == 422
    assert any(field in e["loc"] for e in out["detail"]), out


def raw_post(url: str, data: bytes, length: int | None = None) -> tuple[int, bytes]:
    """POST `data` with `Content-Length: length` (default: its own), then read the answer."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.putrequest("POST", "/v1/recommend")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(data) if length is None else length))
        conn.endheaders(data)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_the_ingress_replica_serves_the_port_itself(app):
    """No proxy hop: Serve's proxy was put on another port, and PORT answers (the ingress replica,
    direct ingress)."""
    from ray.serve.context import _get_global_client
    url, _ = app
    assert url.endswith(f":{PORT}") and _get_global_client().http_config.port != PORT
    with urllib.request.urlopen(url + "/v1/config") as r:
        assert r.status == 200 and json.loads(r.read())["replicas"] == CFG.replicas


def test_the_server_bounds_its_work(app):
    """Issue 23 item 5 end to end: warm before ready, NaN is a 422 (not a 500), an oversized body
    is a 413 before it is sent, a 422 does not echo the input, the cost cap refuses the API's
    largest request; the app answers normally afterwards."""
    url, history = app
    with urllib.request.urlopen(url + "/healthz") as r:        # start() returned: ready, every replica warm
        assert r.status == 200 and json.loads(r.read())["replicas_warm"] == CFG.replicas
    status, out = raw_post(url, b'{"user_id": 3, "new_items": [1], "candidates": [2, NaN]}')
    assert status == 422 and json.loads(out)["detail"][0]["loc"] == ["body", "candidates", 1]
    status, out = raw_post(url, b"", length=CFG.max_body_bytes + 1)   # headers only: refused unread
    assert status == 413 and json.loads(out)["detail"][0]["type"] == "too_large"
    echo = json.dumps({"user_id": 3, "new_items": [1], "candidates": ["zz9"] * 4000}).encode()
    status, out = raw_post(url, echo)
    assert status == 422 and b"zz9" not in out and len(out) < 4000
    api_max = {"user_id": 3, "prefix_len": 8192, "new_items": [1] * 256, "candidates": [2] * 4096}
    status, out = post(url, api_max)
    assert status == 422 and out["detail"][0]["type"] == "cost_cap", out
    assert post(url, body(history, 21, 40))[0] == 200


def test_unknown_user_is_served_cold(app):
    status, out = post(app[0], {"user_id": 10 ** 12, "new_items": [1, 2, 3], "candidates": [4, 5, 6]})
    assert status == 200 and out["prefix_len"] == 0 and not out["kv_hit"] and len(out["scores"]) == 3
    status, out = post(app[0], {"user_id": 10 ** 12, "new_items": [7], "candidates": [4, 5, 6]})
    assert status == 200 and out["prefix_len"] == 0


def test_loadgen_replays_the_workload(app):
    result = loadgen(LoadConfig(url=app[0], duration_s=4.0, rps=8.0, concurrency=8))    # each names tenant home
    assert result["requests"] > 10 and result["errors"] == result["shed"] == 0
    assert result["completed"] == result["requests"]
    feed = sum(s.value for s in metrics(app[0])["helm_requests"] if s.name == "helm_requests_total"
               and s.labels["class"] == "feed")
    assert feed >= result["completed"]
    by_class = {c: (g["requests"], g["completed"], g["shed"]) for c, g in result["classes"].items()}
    assert by_class == {"feed": (result["requests"], result["completed"], 0), "bulk": (0, 0, 0)}
    assert result["tenants"]["home"]["class"] == "feed" and result["tenants"]["home"]["requests"] == result["requests"]
    home = result["tenants"]["home"]["slo_attainment"]             # one tenant: Jain 1, or none in time
    f = result["fairness"]
    assert (f["jain_attainment"] == 1.0) if home > 0 else "jain_attainment" in f["nulls"]
    assert f["jain"] == 1.0                                        # one tenant served: all its band's service
    assert "max_gap_s" in result["fairness"]["nulls"]
    assert result["p50_ms"] > 0 and result["throughput_rps"] > 0 and 0 <= result["kv_hit_rate"] <= 1
    parts = result["split_ms"]["p50"]                     # every part measured, and each one's own
    assert all(v >= 0 for v in parts.values()) and parts["service_ms"] > 0


def test_the_loadgen_command_prints_and_writes_the_class_figures(app, tmp_path, capsys):
    from helmgr.cli import main
    assert main(["loadgen", "--url", app[0], "--duration", "2", "--rps", "8", "--out", str(tmp_path / "lg")]) == 0
    err = capsys.readouterr().err
    assert "per class and tenant" in err and "longest service gap within a band: a client does not see" in err
    md = (tmp_path / "lg" / "loadgen.md").read_text()
    assert "class feed" in md and "tenant home (feed)" in md and "Jain's index 1.000 (normalised service)" in md


def test_a_replica_killed_under_load_loses_no_request(app):
    url, history = app
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "#Backend#" in a["name"]]
    assert len(names) == 2
    victim = ray.get_actor(names[0], namespace="serve")
    reqs = [body(history, 1000 + k, 40) for k in range(40)]
    killed = threading.Event()

    def send(b):
        if b["user_id"] == 1010:
            ray.kill(victim, no_restart=True)
            killed.set()
        return post(url, b)

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(send, reqs))
    assert killed.is_set()
    statuses = [s for s, _ in answers]
    assert statuses.count(200) == len(reqs), [o for s, o in answers if s != 200][:3]
    assert all(len(o["scores"]) == 16 for _, o in answers)
    # the app heals: Serve replaces the replica, and requests keep being answered meanwhile
    deadline = time.time() + 30
    while time.time() < deadline:
        assert post(url, body(history, 2000, 40))[0] == 200
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "#Backend#" in a["name"]]
        if len(names) == 2:
            break
        time.sleep(1.0)
