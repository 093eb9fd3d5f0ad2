"""Assemble and run the serving app: the backend deployment (HELM router) behind the ingress.

    from helmgr.serve import ServeConfig, start, stop
    url = start(ServeConfig(replicas=2), port=8000)      # a local Ray cluster unless address=
    ...
    stop()
"""
from __future__ import annotations

import errno
import os
import socket
import time

from helmgr.core.errors import HelmInputError
from helmgr.serve.config import ServeConfig

APP = "helmgr"


def build_app(cfg: ServeConfig):
    from ray import serve

    from helmgr.serve.ingress import Ingress
    from helmgr.serve.replica import backend_deployment

    ingress = serve.deployment(Ingress, num_replicas=1, ray_actor_options={"num_cpus": cfg.replica_cpus},
                               max_ongoing_requests=256)
    return ingress.bind(backend_deployment(cfg).bind(cfg.to_dict()), cfg.to_dict())


def direct_ingress_env(port: int) -> dict[str, str]:
    """The environment of a local Ray cluster whose ingress replica serves HTTP on `port` itself:
    Ray Serve's throughput-optimized mode (direct ingress, gRPC between deployments, user code and
    the router on each replica's event loop), with the direct-ingress port range narrowed to `port`.
    No load balancer stands in front, so an ingress replica that stops waits for its requests in
    flight only (not 30 s for one to deregister it), and its port is free again at once (not
    quarantined), for the replica that replaces it. A value already in the environment wins."""
    want = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 1),
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0", "RAY_SERVE_PORT_QUARANTINE_S": "0"}
    return {k: os.environ.get(k, v) for k, v in want.items()}


def start(cfg: ServeConfig, port: int = 8000, host: str = "127.0.0.1", address: str | None = None,
          num_cpus: int | None = None, metrics_port: int | None = None, ready_timeout_s: float = 300.0) -> str:
    """Start Ray (local unless `address`, e.g. "auto" or "ray://head:10001") and Serve with the
    app; returns the app's base URL once `/healthz` says ready (every replica warm).

    A local cluster started here serves HTTP from the ingress replica on `port` (direct ingress:
    no proxy hop; `direct_ingress_env`), and Serve's own proxy, which Ray keeps on the head node,
    listens on a free port nobody is sent to. On a cluster joined (`address`, or Ray already
    initialized) the app is behind Serve's proxy on `port`, unless that cluster was started with
    the same environment."""
    import ray
    from ray import serve

    cfg = cfg.with_sources().validate()           # a store's catalogue and users: the item table covers its items
    proxy_port = port
    if not ray.is_initialized():
        kw = {"include_dashboard": False, "log_to_driver": False}
        env = {}
        if address is None:
            check_listen(host, port)        # here the ingress listens on this machine: refuse before Ray starts
            kw |= {"num_cpus": num_cpus} if num_cpus else {}
            kw |= {"_metrics_export_port": metrics_port} if metrics_port else {}
            env = direct_ingress_env(port)
            proxy_port = free_port(host) if env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1" else port
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)              # the raylet, Serve's controller and the replicas inherit it
        try:
            ray.init(address=address, **kw)
        except (ConnectionError, ValueError) as e:          # no cluster there, a malformed address
            raise HelmInputError(f"--address {address!r}: cannot connect to Ray: {e}") from e
        finally:
            for k, v in saved.items():      # this process's environment as it was
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v
    serve.start(http_options={"host": host, "port": proxy_port})
    serve.run(build_app(cfg), name=APP, route_prefix="/", blocking=False)
    url = f"http://{host}:{port}"
    wait_ready(f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}", ready_timeout_s)
    return url


def check_listen(host: str, port: int) -> None:
    """HelmInputError, naming --host or --port, unless this machine can listen on (host, port): an
    unknown host or a port in use would otherwise surface from inside a Serve replica as a
    traceback. Serve's servers bind with SO_REUSEPORT only, so the connections a server that
    just stopped closed (TIME_WAIT, a minute) refuse an SO_REUSEADDR bind but not the next
    server's: a port that refuses the bind is in use only if something accepts a connection."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise HelmInputError(f"--host {host!r}: not an address of this machine ({e})") from e
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
            return
        except OSError as e:
            err = e
    if err.errno == errno.EADDRINUSE and not _accepts(family, addr):
        return
    raise HelmInputError(f"--host {host!r} --port {port}: cannot listen there ({err.strerror})") from err


def _accepts(family: int, addr: tuple) -> bool:
    """Whether a server accepts connections at `addr` (a wildcard address: on loopback)."""
    loopback = {"0.0.0.0": "127.0.0.1", "::": "::1"}
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect((loopback.get(addr[0], addr[0]),) + tuple(addr[1:]))
            return True
        except OSError:
            return False


def free_port(host: str) -> int:
    """A port nothing listens on now (the OS's pick)."""
    family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout_s: float) -> None:
    """Poll `url/healthz` until it answers 200 (the app is warm); TimeoutError past `timeout_s`."""
    import urllib.error
    import urllib.request

    end = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > end:
            raise TimeoutError(f"{url}/healthz did not answer 200 within {timeout_s:g} s")
        time.sleep(0.2)


def stop() -> None:
    """Shut Serve and Ray down, if this process is connected (Serve's own shutdown would start a
    cluster to find nothing running)."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        return
    try:
        serve.shutdown()
    finally:
        ray.shutdown()
