"""Assemble and run the serving app: the backend deployment (HELM router) behind the ingress.

    from helmgr.serve import ServeConfig, start, stop
    url = start(ServeConfig(replicas=2), port=8000)      # a local Ray cluster unless address=
    ...
    stop()
"""
from __future__ import annotations

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


def start(cfg: ServeConfig, port: int = 8000, host: str = "127.0.0.1", address: str | None = None,
          num_cpus: int | None = None, metrics_port: int | None = None, ready_timeout_s: float = 300.0) -> str:
    """Start Ray (local unless `address`, e.g. "auto" or "ray://head:10001") and Serve with the
    app; returns the app's base URL once `/healthz` says ready (every replica warm)."""
    import ray
    from ray import serve

    cfg = cfg.with_sources().validate()           # a store's catalogue and users: the item table covers its items
    if not ray.is_initialized():
        kw = {"include_dashboard": False, "log_to_driver": False}
        if address is None:
            check_listen(host, port)        # here the proxy listens on this machine: refuse before Ray starts
            kw |= {"num_cpus": num_cpus} if num_cpus else {}
            kw |= {"_metrics_export_port": metrics_port} if metrics_port else {}
        try:
            ray.init(address=address, **kw)
        except (ConnectionError, ValueError) as e:          # no cluster there, a malformed address
            raise HelmInputError(f"--address {address!r}: cannot connect to Ray: {e}") from e
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(cfg), name=APP, route_prefix="/", blocking=False)
    url = f"http://{host}:{port}"
    wait_ready(f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}", ready_timeout_s)
    return url


def check_listen(host: str, port: int) -> None:
    """HelmInputError, naming --host or --port, unless this machine can listen on (host, port): an
    unknown host or a port in use would otherwise surface from inside Serve's proxy as a traceback."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise HelmInputError(f"--host {host!r}: not an address of this machine ({e})") from e
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)      # as the proxy's server does
        try:
            s.bind(addr)
        except OSError as e:
            raise HelmInputError(f"--host {host!r} --port {port}: cannot listen there ({e.strerror})") from e


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
