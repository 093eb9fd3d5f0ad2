"""The HBM pool: a fixed number of pages split between the EMB and the KV cache."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from helmgr.core.errors import HelmInputError


@dataclass(frozen=True, slots=True)
class SizeInfo:
    capacity_bytes: int
    used_bytes: int
    entries: int


class Cache(Protocol):
    """What the pool needs from each cache: a byte capacity it can change, and its usage."""

    def resize(self, capacity_bytes: int) -> None: ...
    def size_info(self) -> SizeInfo: ...
    def check_integrity(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ResizePlan:
    """What a resize moved. `moved_pages` > 0: pages went from KV to EMB; < 0: from EMB to KV."""

    ratio_before: float
    ratio_after: float
    emb_pages_before: int
    emb_pages_after: int

    @property
    def moved_pages(self) -> int:
        return self.emb_pages_after - self.emb_pages_before


def check_ratio(ratio: float, r_min: float = 0.0, r_max: float = 1.0, what: str = "ratio") -> float:
    """Validate a ratio given by a user; raise a named error rather than clamp silently."""
    if not math.isfinite(ratio) or not r_min <= ratio <= r_max:
        raise HelmInputError(f"{what} must be in [{r_min}, {r_max}], got {ratio}")
    return float(ratio)


class HBMPool:
    """`total_pages` pages of `page_bytes`; EMB holds `emb_pages`, KV the rest.

    The ratio r is the EMB share. Each cache keeps at least `r_min` of the pages (rounded up), so
    `r` is effectively clamped to [r_min, r_max]; a resize shrinks the losing cache first (it
    evicts at once), then grows the other.
    """

    def __init__(self, budget_bytes: int, page_bytes: int, emb: Cache, kv: Cache,
                 ratio: float = 0.5, r_min: float = 0.05, r_max: float = 0.95):
        if budget_bytes <= 0:
            raise HelmInputError(f"pool budget must be > 0 bytes, got {budget_bytes}")
        if page_bytes <= 0 or page_bytes * 2 > budget_bytes:
            raise HelmInputError(f"page of {page_bytes} bytes does not fit twice in a budget of {budget_bytes}")
        check_ratio(r_min, 0.0, 0.5, "r_min")
        check_ratio(r_max, 0.5, 1.0, "r_max")
        self.page_bytes = page_bytes
        self.total_pages = budget_bytes // page_bytes
        self.min_emb_pages = max(1, math.ceil(r_min * self.total_pages))
        self.max_emb_pages = min(self.total_pages - 1, math.floor(r_max * self.total_pages))
        self.emb, self.kv = emb, kv
        self.emb_pages = self.pages_for(check_ratio(ratio))
        self.emb.resize(self.emb_pages * page_bytes)
        self.kv.resize(self.kv_pages * page_bytes)

    @property
    def kv_pages(self) -> int:
        return self.total_pages - self.emb_pages

    @property
    def ratio(self) -> float:
        return self.emb_pages / self.total_pages

    def pages_for(self, ratio: float) -> int:
        pages = round(ratio * self.total_pages)
        return min(max(pages, self.min_emb_pages), self.max_emb_pages)

    def resize(self, ratio: float) -> ResizePlan:
        """Move whole pages so that EMB holds `ratio` of the pool (clamped to its bounds)."""
        if not math.isfinite(ratio):
            raise ValueError(f"ratio must be finite, got {ratio}")
        before, after = self.emb_pages, self.pages_for(ratio)
        plan = ResizePlan(self.ratio, after / self.total_pages, before, after)
        if after < before:
            self.emb_pages = after
            self.emb.resize(after * self.page_bytes)
            self.kv.resize(self.kv_pages * self.page_bytes)
        elif after > before:
            self.emb_pages = after
            self.kv.resize(self.kv_pages * self.page_bytes)
            self.emb.resize(after * self.page_bytes)
        return plan

    def check_integrity(self) -> None:
        assert self.emb_pages + self.kv_pages == self.total_pages
        assert self.min_emb_pages <= self.emb_pages <= self.max_emb_pages
        for cache, pages in ((self.emb, self.emb_pages), (self.kv, self.kv_pages)):
            info = cache.size_info()
            assert info.capacity_bytes <= pages * self.page_bytes, (info, pages)
            assert info.used_bytes <= info.capacity_bytes, info
            cache.check_integrity()
