"""The real data path (docs/realpath.md): the pool, both caches and a small HSTU model on torch tensors.

Imported on its own (`helmgr.real`), so the simulator never pays for importing torch.
"""
from helmgr.real.emb import DeviceEmbCache, Lookup
from helmgr.real.kv import KVLayout, PagedKVCache, PrefixKV
from helmgr.real.model import HSTUModel, shrink
from helmgr.real.pool import DevicePool, PoolMove

__all__ = ["DevicePool", "PoolMove", "DeviceEmbCache", "Lookup", "KVLayout", "PagedKVCache", "PrefixKV",
           "HSTUModel", "shrink"]
