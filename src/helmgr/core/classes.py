"""SLO classes and tenants: the class table (a TOML file) and which tenant each request is.

A class is a latency target and how it is served (band, weight, sheddable, minimum share); a
tenant is a source of traffic (a surface: home feed, search, ...) in one class, with its share of
the regime's base traffic. A tenant marked `bursts = true` is the noisy neighbour: it also takes
every request the regime's bursts add (docs/tenancy.md).

    [classes.feed]
    slo_ms = 20.0
    band = 0              # 0 is served first
    [tenants.home]
    class = "feed"
    share = 0.6
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from helmgr.core.errors import HelmInputError
from helmgr.core.hashing import hash_uniform
from helmgr.core.profiles import read_toml
from helmgr.core.validate import POSITIVE, Range, check_record

SHARE_TOLERANCE = 1e-6          # tenants' shares must sum to 1 within this (a sum above 1 is scaled to 1)
MAX_BAND = 15                   # bands 0 (served first) to 15
_SALT = 0x7E7A                  # the tenant draw's salt (mixed with the run's seed)


@dataclass(frozen=True, slots=True)
class SloClass:
    name: str
    slo_ms: float                # its P99 target
    band: int = 0                # priority band: lower is served first
    weight: float = 1.0          # its tenants' weight within the band
    sheddable: bool = False      # may be refused when no node can meet its target
    min_share: float = 0.0       # the least service its band keeps while higher bands are backlogged
    kv_floor: float = 0.0        # the part of a node's KV cache its prefixes keep from higher bands


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    slo_class: str               # "class" in the file
    share: float                 # its part of the regime's base traffic
    bursts: bool = False         # also takes every request of the regime's bursts


_CLASS_RANGES = {"slo_ms": POSITIVE, "band": Range(0, MAX_BAND), "weight": Range(0.01, 100.0),
                 "min_share": Range(0.0, 1.0, high_open=True), "kv_floor": Range(0.0, 1.0, high_open=True)}
_TENANT_RANGES = {"share": Range(0.0, 1.0, low_open=True)}


@dataclass(frozen=True, slots=True)
class ClassTable:
    classes: tuple[SloClass, ...]
    tenants: tuple[Tenant, ...]
    source: str = "<table>"

    @property
    def class_names(self) -> list[str]:
        return [c.name for c in self.classes]

    @property
    def tenant_names(self) -> list[str]:
        return [t.name for t in self.tenants]

    @property
    def tenant_class(self) -> np.ndarray:
        """Each tenant's class, as an index into `classes`."""
        index = {c.name: i for i, c in enumerate(self.classes)}
        return np.array([index[t.slo_class] for t in self.tenants], np.int64)

    @property
    def tenant_band(self) -> np.ndarray:
        """Each tenant's priority band."""
        return np.array([self.classes[k].band for k in self.tenant_class], np.int64)

    @property
    def tenant_weight(self) -> np.ndarray:
        """Each tenant's class's weight: its deficit round robin quantum's multiple."""
        return np.array([self.classes[k].weight for k in self.tenant_class], float)

    @property
    def band_floors(self) -> list[float]:
        """Per band 0..max: the part of a node's KV cache its classes' prefixes keep (the sum of
        their `kv_floor`)."""
        floors = [0.0] * (max(c.band for c in self.classes) + 1)
        for c in self.classes:
            floors[c.band] += c.kv_floor
        return floors

    def pool_sizes(self, nodes: int) -> list[int]:
        """Per class, its nodes under `--tenancy pools`: `nodes` split by the classes' shares of
        the base traffic (their tenants' shares), each class one node first, the rest by largest
        remainder (ties to the first class)."""
        if nodes < len(self.classes):
            raise HelmInputError(f"--tenancy pools needs a node per class: {nodes} nodes, {len(self.classes)} "
                                 f"classes ({', '.join(self.class_names)})")
        share = np.zeros(len(self.classes))
        np.add.at(share, self.tenant_class, [t.share for t in self.tenants])
        want = share / share.sum() * nodes
        sizes = np.maximum(np.floor(want), 1).astype(int)
        for k in np.argsort(-(want - np.floor(want)), kind="stable"):
            if sizes.sum() >= nodes:
                break
            sizes[k] += 1
        while sizes.sum() > nodes:                 # the one-node floors took more than the shares gave
            sizes[np.argmax(np.where(sizes > 1, sizes - want, -np.inf))] -= 1
        return sizes.tolist()

    def assign(self, user: np.ndarray, burst: np.ndarray, seed: int) -> np.ndarray:
        """The tenant (index into `tenants`) of requests from these users with these burst flags:
        each user belongs to one tenant, a stable draw per user and seed over the tenants' shares
        (so a tenant's share of the traffic is its share in expectation); a burst's requests go
        to the `bursts = true` tenants (by their shares) when there are any. The same requests get
        the same tenants under every policy and router."""
        burst = np.asarray(burst, bool)
        u = hash_uniform(np.asarray(user, np.int64), _SALT + 7919 * int(seed))
        out = _draw(u, np.array([t.share for t in self.tenants]))
        noisy = np.flatnonzero([t.bursts for t in self.tenants])
        if len(noisy) and burst.any():
            out[burst] = noisy[_draw(u[burst], np.array([self.tenants[i].share for i in noisy]))]
        return out


def _draw(u: np.ndarray, shares: np.ndarray) -> np.ndarray:
    edges = np.cumsum(shares / shares.sum())
    return np.minimum(np.searchsorted(edges, u, side="right"), len(shares) - 1)


def _record(cls, name: str, body: dict, ranges, where: str):
    if "name" in body:
        raise HelmInputError(f"{where}: unknown ['name'] (the table's key is its name)")
    return cls(**check_record(cls, body | {"name": name}, ranges, where))


def parse_table(data: dict, where: str) -> ClassTable:
    """A class table from parsed TOML (`where` names it in errors)."""
    extra = sorted(set(data) - {"classes", "tenants"})
    if extra:
        raise HelmInputError(f"{where}: unknown table(s) {extra} (a class table has [classes.NAME] and [tenants.NAME])")
    raw_classes, raw_tenants = data.get("classes"), data.get("tenants")
    for key, raw in (("classes", raw_classes), ("tenants", raw_tenants)):
        if not isinstance(raw, dict) or not raw or not all(isinstance(v, dict) for v in raw.values()):
            raise HelmInputError(f"{where}: needs at least one [{key}.NAME] table")
    classes = tuple(_record(SloClass, name, body, _CLASS_RANGES, f"{where}: class {name!r}")
                    for name, body in raw_classes.items())
    tenants = []
    for name, body in raw_tenants.items():
        body = dict(body)
        if "slo_class" in body:
            raise HelmInputError(f"{where}: tenant {name!r}: unknown ['slo_class'] (its SLO class is class = \"NAME\")")
        if "class" not in body:
            raise HelmInputError(f"{where}: tenant {name!r} needs class = \"NAME\" (its SLO class)")
        body["slo_class"] = body.pop("class")
        try:
            tenant = _record(Tenant, name, body, _TENANT_RANGES, f"{where}: tenant {name!r}")
        except HelmInputError as e:                  # the file's name for the field
            raise HelmInputError(str(e).replace("slo_class", "class")) from None
        if tenant.slo_class not in raw_classes:
            raise HelmInputError(f"{where}: tenant {name!r} names unknown class {tenant.slo_class!r} "
                                 f"(known: {', '.join(raw_classes)})")
        tenants.append(tenant)
    floors = sum(c.kv_floor for c in classes)
    if floors >= 1:
        raise HelmInputError(f"{where}: classes' kv_floor sum to {floors:g}, which must stay below 1")
    lower = {c.band for c in classes} - {min(c.band for c in classes)}       # the top band's has no use
    shares = sum(max(c.min_share for c in classes if c.band == b) for b in lower)
    if shares >= 1:
        raise HelmInputError(f"{where}: the lower bands' min_share (each band's largest) sum to {shares:g}, which "
                             f"must stay below 1")
    total = sum(t.share for t in tenants)
    if abs(total - 1.0) > SHARE_TOLERANCE:
        raise HelmInputError(f"{where}: tenants' shares sum to {total:g}, not 1")
    if total > 1.0:                                  # (static KV quotas must fit in the cache)
        tenants = [replace(t, share=t.share / total) for t in tenants]
    return ClassTable(classes, tuple(tenants), where)


def load_table(name_or_path: str) -> ClassTable:
    """A shipped class table by name (`surfaces`) or a TOML file; every error names the file and
    the bad value."""
    where, data = read_toml("classes", name_or_path, "class table")
    return parse_table(data, where)
