"""The device pool: one uint8 buffer split between EMB rows (front) and KV pages (back).

The page arithmetic (how many pages, the per-cache minimum, ratio -> pages) is the simulator's
`HBMPool`, so the same ratio gives the same split in both. The buffer is allocated once; a
resize only moves the boundary, and both caches keep stable addresses: EMB slot `s` is always at
byte `s * row_bytes`, KV page `i` always the `i`-th page counting from the end.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from helmgr.memory.pool import HBMPool, ResizePlan, SizeInfo, check_ratio


class _Region:
    """Stands in for a cache inside `HBMPool`: it only records the capacity it was given."""

    capacity_bytes = 0

    def resize(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes

    def size_info(self) -> SizeInfo:
        return SizeInfo(self.capacity_bytes, 0, 0)

    def check_integrity(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class PoolMove:
    """What one resize moved. Both ranges are empty when nothing moved.

    `emb_slots`: the EMB row slots that appeared (EMB grew) or vanished (EMB shrank).
    `kv_pages`: the KV page indices that vanished (KV shrank) or appeared (KV grew).
    """

    plan: ResizePlan
    emb_slots: range
    kv_pages: range

    @property
    def emb_grew(self) -> bool:
        return self.plan.moved_pages > 0


class DevicePool:
    """`budget_bytes` (rounded down to whole pages) of one device tensor, shared by two caches.

    After `resize`, call `kv.on_resize(move.kv_pages)` and `emb.on_resize(move.emb_slots)`
    before the next lookup: the bytes that changed hands may be overwritten by the new owner.
    """

    def __init__(self, budget_bytes: int, page_bytes: int, row_bytes: int,
                 device: str | torch.device = "cpu", ratio: float = 0.5,
                 r_min: float = 0.05, r_max: float = 0.95):
        for name, value in (("budget_bytes", budget_bytes), ("page_bytes", page_bytes), ("row_bytes", row_bytes)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an int, got {value!r}")
        if not 0 < row_bytes <= page_bytes:
            raise ValueError(f"row_bytes must be in [1, page_bytes={page_bytes}], got {row_bytes}")
        self._pages = HBMPool(budget_bytes, page_bytes, _Region(), _Region(), ratio, r_min, r_max)
        self.page_bytes = page_bytes
        self.row_bytes = row_bytes
        self.device = torch.device(device)
        self.buffer = torch.zeros(self.total_pages * page_bytes, dtype=torch.uint8, device=self.device)
        self._data_ptr = self.buffer.data_ptr()

    # -- the split ------------------------------------------------------------------------
    @property
    def total_pages(self) -> int:
        return self._pages.total_pages

    @property
    def emb_pages(self) -> int:
        return self._pages.emb_pages

    @property
    def kv_pages(self) -> int:
        return self._pages.kv_pages

    @property
    def ratio(self) -> float:
        return self._pages.ratio

    @property
    def n_rows(self) -> int:
        """EMB row slots: whole rows in the EMB pages (a row may straddle two of them)."""
        return self.emb_pages * self.page_bytes // self.row_bytes

    # -- views ----------------------------------------------------------------------------
    def emb_rows(self) -> torch.Tensor:
        """The EMB region as (n_rows, row_bytes) uint8; `.view(dtype)` gives typed rows."""
        return self.buffer[: self.n_rows * self.row_bytes].view(self.n_rows, self.row_bytes)

    def kv_page(self, i: int) -> torch.Tensor:
        """KV page `i` (counting from the end of the buffer) as `page_bytes` uint8."""
        if not 0 <= i < self.kv_pages:
            raise IndexError(f"KV page {i} is outside the KV region of {self.kv_pages} pages")
        start = (self.total_pages - 1 - i) * self.page_bytes
        return self.buffer[start : start + self.page_bytes]

    def pages_view(self) -> torch.Tensor:
        """The whole buffer as (total_pages, page_bytes); row `kv_physical(i)` is KV page `i`.
        For gathers and scatters of many KV pages in one indexing op."""
        return self.buffer.view(self.total_pages, self.page_bytes)

    def kv_physical(self, pages: torch.Tensor) -> torch.Tensor:
        """Row of `pages_view()` that holds each KV page index."""
        return self.total_pages - 1 - pages

    # -- resize ---------------------------------------------------------------------------
    def resize(self, ratio: float) -> PoolMove:
        """Move whole pages so that EMB holds `ratio` of the pool (clamped to [r_min, r_max])."""
        check_ratio(ratio)
        rows, kv = self.n_rows, self.kv_pages
        plan = self._pages.resize(ratio)
        move = PoolMove(plan, range(min(rows, self.n_rows), max(rows, self.n_rows)),
                        range(min(kv, self.kv_pages), max(kv, self.kv_pages)))
        assert self.buffer.data_ptr() == self._data_ptr, "the pool buffer was reallocated"
        return move

    def check_integrity(self) -> None:
        """Pages add up, each cache keeps its minimum, and the two regions do not overlap."""
        self._pages.check_integrity()
        assert self.buffer.data_ptr() == self._data_ptr, "the pool buffer was reallocated"
        assert self.buffer.numel() == self.total_pages * self.page_bytes
        emb_end = self.n_rows * self.row_bytes
        kv_start = (self.total_pages - self.kv_pages) * self.page_bytes
        assert emb_end <= self.emb_pages * self.page_bytes == kv_start, (emb_end, kv_start)
