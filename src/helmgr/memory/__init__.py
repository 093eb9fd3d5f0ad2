"""One GPU's cache memory: the HBM pool, the EMB and KV caches it is split between, the EMB
eviction policies (shared with the device cache), the H2D link that refills them, and the refill
modes (docs/node.md). Import from the modules: the package itself loads none of them, so the
real path (pool, eviction) runs where numba is not installed."""
from helmgr.core.jitcache import clear_if_stale

clear_if_stale(__file__)     # its compiled modules call each other's (kv_table -> kv_slots, emb -> emb_kernels)
