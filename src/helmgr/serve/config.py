"""What a serving app is made of: one frozen config, shared by the replicas, the router,
the ingress and the load generator, so that all of them see the same model, item table and
synthetic workload (same seed: the same users and histories everywhere)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from helmgr.core.errors import HelmInputError
from helmgr.core.records import NodeConfig
from helmgr.core.validate import Range, check_numbers
from helmgr.core.profiles import GIB, MIB, NodeProfile, load_hardware
from helmgr.workload import SyntheticConfig, default_config


# what an app may be given (past these it could not start, or could never answer in time)
MAX_REPLICAS = 1024
MAX_CPUS = 1024.0                    # Ray logical CPUs of one replica
MAX_POOL_MIB = float(1 << 20)        # 1 TiB
MIN_MS, MAX_MS = 1e-3, 1e7           # latency targets, deadlines and cost caps: 1 us to ~3 h
MAX_BODY_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class ServeConfig:
    replicas: int = 2                 # backend replicas: one per node (GPU node, or CPU process)
    device: str = "cpu"
    replica_cpus: float = 0.25        # Ray logical CPUs per backend replica (CUDA: 1 GPU each instead)
    model: str = "small"              # model preset the runtime runs ...
    shrink: int = 16                  # ... with widths divided by this (CPU: milliseconds per request)
    candidates: int = 64              # the synthetic workload's candidates per request
    n_items: int = 100_000            # rows of the host embedding table = the workload's item ids
    pool_mib: float = 48.0            # each node's pool (EMB + KV)
    ratio: float = 0.3                # initial EMB share
    hardware: str = "cpu-ref"         # hardware preset or calibrated TOML: the router's cost model
    workload: str = "steady"          # synthetic regime whose users and histories the replicas know
    n_users: int = 1_000_000
    len_median: float = 200.0         # history lengths (CPU-sized; the simulator's default is 1,000) ...
    len_cap: int = 1024               # ... capped here (a user's prefix grows past it as it acts)
    max_prefix: int = 8192            # the longest prefix a request may carry (the model's max sequence)
    slo_ms: float = 50.0              # the controller's latency objective
    window_s: float = 1.0             # controller tick
    refresh_s: float = 2.0            # EMB shadow re-ranked (adapter v2's sample closed), as the simulator's refresh
    controller: bool = True           # False: the ratio stays where it is
    warm: bool = True                 # start each EMB cache with the workload's most popular rows
    stats_period_s: float = 0.5       # how often replicas report residency to the routers
    max_ongoing: int = 32             # requests a replica accepts at once (it serves them one by one, cheapest first)
    max_body_bytes: int = 1 << 20     # a request body larger than this is refused (413) before it is read
    deadline_ms: float | None = None  # a request not answered by then is cut (504) [None: 20 x slo_ms]
    max_cost_ms: float | None = None  # predicted worst-case service above this is refused (422) [None: 2 x slo_ms]
    seed: int = 0
    history: str | None = None        # users' histories from this store folder (helmgr history build) ...
    redis: str | None = None          # ... or this Redis URL; None for both: the synthetic population
    checkpoint: str | None = None     # model weights and item table from this folder (helmgr model train);
                                      # None: seeded random ones
    base_policy: str | None = None    # the controllers' base policy from this file (helmgr train); None: the shipped one
    classes: str | None = None        # SLO classes and tenants: a shipped table's name or a TOML file (docs/tenancy.md)

    @property
    def store(self) -> bool:
        """Histories come from a store: served requests' new items are appended to it."""
        return self.history is not None or self.redis is not None

    def with_sources(self) -> "ServeConfig":
        """This config with its checkpoint's model and catalogue and its store's users (the item
        table covers the store's items), both checked: a folder that is not a checkpoint or a
        store, a Redis that is down, a store with items the checkpoint has no row for, is a
        HelmInputError."""
        cfg = self
        if self.checkpoint is not None:
            from helmgr.real.checkpoint import load          # every tensor checked here, not in a replica
            meta = load(self.checkpoint).meta
            cfg = replace(cfg, model=meta["preset"], shrink=meta["shrink"], n_items=meta["n_items"])
        if not self.store:
            return cfg
        if self.history is not None and self.redis is not None:
            raise HelmInputError("name one history store: --history DIR or --redis URL, not both")
        from helmgr.history import open_store
        s = open_store(self.history, self.redis)
        try:
            stat = s.stat()
        finally:
            s.close()
        if cfg.checkpoint is not None and stat["items"] > cfg.n_items:
            raise HelmInputError(f"the history store holds {stat['items']} items, checkpoint {cfg.checkpoint!r} "
                                 f"has rows for {cfg.n_items}: train it on the store's log")
        return replace(cfg, n_items=cfg.n_items if cfg.checkpoint else stat["items"], n_users=stat["base_users"])

    def validate(self) -> "ServeConfig":
        if self.device not in ("cpu", "cuda"):
            raise HelmInputError(f"device must be cpu or cuda, got {self.device!r}")
        if self.base_policy is not None:
            if not self.controller:
                raise HelmInputError("a base policy is for the controllers; the ratios are fixed without them")
            self.controller_now()                         # names a file that is not a policy, before any replica
        self.class_table()                                # a bad table is refused before any replica
        from helmgr.real.runtime import MIN_POOL_PAGES, PAGE_MIB     # torch: only where an app is checked
        ms = Range(MIN_MS, MAX_MS)
        check_numbers(self, {"replica_cpus": Range(0, MAX_CPUS), "ratio": Range(0, 1, low_open=True, high_open=True),
                             "replicas": Range(1, MAX_REPLICAS), "pool_mib": Range(MIN_POOL_PAGES * PAGE_MIB, MAX_POOL_MIB),
                             "slo_ms": ms, "deadline_ms": ms, "max_cost_ms": ms, "max_body_bytes": Range(1, MAX_BODY_BYTES)},
                      prefix="--")                        # (each a `helmgr serve` option but max-body-bytes: --max-body-kib)
        if self.max_cost_s > self.deadline_s:
            raise HelmInputError(f"max-cost-ms ({self.max_cost_s * 1e3:g}) must not exceed deadline-ms "
                                 f"({self.deadline_s * 1e3:g}): such a request could never be answered in time")
        return self

    def controller_now(self):
        """A replica's controller: the shipped HELM (`Controller.default()`), or the same tiers
        around `base_policy`."""
        from helmgr.controller import Controller
        return Controller.default() if self.base_policy is None else Controller.load(self.base_policy)

    def class_table(self):
        """The class table (`classes`), or None."""
        from helmgr.core.classes import load_table
        return None if self.classes is None else load_table(self.classes)

    def to_dict(self) -> dict:
        """JSON-serializable (Ray's router kwargs and deployment args)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ServeConfig":
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    def node_profile(self) -> NodeProfile:
        """A replica as the simulator sees it: the router's cost profile (`hardware`), the
        runtime's model, and a pool of `pool_mib` (the device's memory is set to what that implies)."""
        from helmgr.real.runtime import PAGE_MIB, runtime_model      # torch: only where a node is built
        model, hw = runtime_model(self.model, self.shrink, self.candidates), load_hardware(self.hardware)
        hbm = hw.reserved_gib + model.weights_gib + model.activations_gib + self.pool_mib * MIB / GIB
        return NodeProfile(replace(hw, hbm_gib=hbm), model, PAGE_MIB)

    def node_config(self) -> NodeConfig:
        return NodeConfig(ratio=self.ratio)

    @property
    def deadline_s(self) -> float:
        """How long a request may take, end to end at the ingress, before it is cut (504)."""
        return (20.0 * self.slo_ms if self.deadline_ms is None else self.deadline_ms) / 1e3

    @property
    def max_cost_s(self) -> float:
        """The most predicted service (no KV hit, every row missed) a request may ask for."""
        return (2.0 * self.slo_ms if self.max_cost_ms is None else self.max_cost_ms) / 1e3

    @property
    def budget_bytes(self) -> int:
        return int(self.pool_mib * MIB)

    def workload_config(self, rps: float = 10.0, duration_s: float = 60.0) -> SyntheticConfig:
        """The synthetic workload over the served item table (loadgen replays it; replicas read
        its histories)."""
        return default_config(self.workload, n_items=self.n_items, candidates=self.candidates, n_users=self.n_users,
                              len_median=self.len_median, len_cap=self.len_cap, rps=rps, duration_s=duration_s)
