"""One GPU's cache memory: the HBM pool, the EMB and KV caches it is split between, the EMB
eviction policies (shared with the device cache), the H2D link that refills them, and the refill
modes (SPEC 2.1-2.5)."""
from helmgr.memory.emb import EmbCache
from helmgr.memory.eviction import EVICTION_POLICIES, LFU, LRU, EvictionPolicy, make_eviction
from helmgr.memory.kv import HostKVTier, KVCache
from helmgr.memory.link import CAUSES, EMB_MISS, KV_ONLOAD, REFILL, H2DLink
from helmgr.memory.pool import HBMPool, ResizePlan, SizeInfo
from helmgr.memory.refill import REFILL_MODES, BackgroundRefill, LazyRefill, SyncRefill, make_refill

__all__ = [
    "EmbCache", "EvictionPolicy", "LFU", "LRU", "EVICTION_POLICIES", "make_eviction", "KVCache", "HostKVTier", "H2DLink", "HBMPool", "ResizePlan", "SizeInfo",
    "CAUSES", "EMB_MISS", "KV_ONLOAD", "REFILL",
    "REFILL_MODES", "SyncRefill", "LazyRefill", "BackgroundRefill", "make_refill",
]
