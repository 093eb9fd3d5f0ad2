import pytest
import torch

from helmgr.core.errors import HelmInputError
from helmgr.real import DevicePool

torch.set_num_threads(1)

PAGE, ROW = 64, 24          # 64-byte pages, 24-byte rows: rows straddle pages


def make_pool(pages=10, ratio=0.5, **kw):
    return DevicePool(pages * PAGE + 7, PAGE, ROW, ratio=ratio, **kw)   # + 7: rounded down


def test_regions_are_carved_from_the_two_ends_of_one_buffer():
    pool = make_pool(ratio=0.3)
    assert (pool.total_pages, pool.emb_pages, pool.kv_pages) == (10, 3, 7)
    assert pool.buffer.numel() == 640
    rows = pool.emb_rows()
    assert rows.shape == (8, ROW)                        # 3 * 64 // 24 rows
    assert rows.data_ptr() == pool.buffer.data_ptr()
    base = pool.buffer.data_ptr()
    assert pool.kv_page(0).data_ptr() == base + 9 * PAGE  # the last page
    assert pool.kv_page(6).data_ptr() == base + 3 * PAGE  # the first page after EMB
    with pytest.raises(IndexError):
        pool.kv_page(7)
    pool.check_integrity()


def test_views_write_into_the_buffer():
    pool = make_pool()
    pool.emb_rows()[1] = 7
    pool.kv_page(0)[:] = 9
    assert pool.buffer[ROW : 2 * ROW].eq(7).all() and pool.buffer[-PAGE:].eq(9).all()
    assert pool.buffer[2 * ROW : -PAGE].eq(0).all()
    phys = pool.kv_physical(torch.tensor([0, 2]))
    assert phys.tolist() == [9, 7] and pool.pages_view()[9].eq(9).all()


def test_typed_rows_view():
    pool = DevicePool(4 * 32, 32, 16)                  # 16-byte rows = 4 float32
    typed = pool.emb_rows().view(torch.float32)
    assert typed.shape == (4, 4)
    typed[2] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert torch.equal(pool.emb_rows()[2].view(torch.float32), torch.tensor([1.0, 2.0, 3.0, 4.0]))


def test_resize_moves_the_boundary_and_reports_what_it_covered():
    pool = make_pool(ratio=0.3)
    ptr = pool.buffer.data_ptr()
    move = pool.resize(0.5)                            # EMB 3 -> 5 pages, rows 8 -> 13
    assert move.plan.moved_pages == 2 and move.emb_grew
    assert move.emb_slots == range(8, 13) and move.kv_pages == range(5, 7)
    move = pool.resize(0.2)                            # EMB 5 -> 2 pages, rows 13 -> 5
    assert not move.emb_grew
    assert move.emb_slots == range(5, 13) and move.kv_pages == range(5, 8)
    move = pool.resize(0.2)
    assert move.emb_slots == range(5, 5) and move.kv_pages == range(8, 8)
    assert pool.buffer.data_ptr() == ptr
    pool.check_integrity()


def test_resize_is_clamped_like_the_simulated_pool():
    pool = make_pool(r_min=0.2, r_max=0.7)
    assert pool.resize(0.0).plan.emb_pages_after == 2
    assert pool.resize(1.0).plan.emb_pages_after == 7
    pool.check_integrity()


@pytest.mark.parametrize("ratio", [-0.1, 1.5, float("nan")])
def test_bad_ratio_is_a_named_value_error(ratio):
    with pytest.raises(ValueError, match="ratio must be in"):
        make_pool(ratio=ratio)
    with pytest.raises(ValueError, match="ratio must be in"):
        make_pool().resize(ratio)


@pytest.mark.parametrize("budget,page,row,match", [
    (0, 64, 8, "budget must be > 0"),
    (-64, 64, 8, "budget must be > 0"),
    (100, 64, 8, "does not fit twice"),
    (640, 64, 65, "row_bytes must be in"),
    (640, 64, 0, "row_bytes must be in"),
    (640.0, 64, 8, "budget_bytes must be an int"),
])
def test_impossible_pools_are_named_value_errors(budget, page, row, match):
    with pytest.raises(ValueError, match=match):
        DevicePool(budget, page, row)


def test_errors_are_helm_input_errors_where_the_simulator_raises_them():
    with pytest.raises(HelmInputError):
        DevicePool(0, 64, 8)
