"""Assemble and run the serving app: the backend deployment (HELM router) behind the ingress.

    from helmgr.serve import ServeConfig, start, stop
    url = start(ServeConfig(replicas=2), port=8000)      # a local Ray cluster unless address=
    ...
    stop()
"""
from __future__ import annotations

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
          num_cpus: int | None = None, metrics_port: int | None = None) -> str:
    """Start Ray (local unless `address`, e.g. "auto" or "ray://head:10001") and Serve with the
    app; returns the app's base URL once every replica is up."""
    import ray
    from ray import serve

    cfg.validate()
    if not ray.is_initialized():
        kw = {"include_dashboard": False, "log_to_driver": False}
        if address is None:
            kw |= {"num_cpus": num_cpus} if num_cpus else {}
            kw |= {"_metrics_export_port": metrics_port} if metrics_port else {}
        ray.init(address=address, **kw)
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(cfg), name=APP, route_prefix="/", blocking=False)
    return f"http://{host}:{port}"


def stop() -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()
