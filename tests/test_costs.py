"""Every cost function against numbers worked out by hand for the tiny profile of conftest:
hbm 1000 GB/s, PCIe 10 GB/s + 10 us, 100 TFLOP/s x 0.5, launch 5 us, host 1 us/row;
2 layers, 2 heads, d_qk = d_v = 4, d_model 8; rows 2 x 8 x 4 = 64 B; K/V 2 x 2 x 8 x 2 = 64 B/token."""
import pytest

from helmgr.core.costs import CostModel, attention_pairs
from tests.conftest import tiny_hardware, tiny_model


@pytest.fixture
def cost():
    return CostModel.from_parts(tiny_hardware(), tiny_model())


def test_model_constants(cost):
    assert cost.row_bytes == 64
    assert cost.kv_bytes_per_token == 64
    # UVQK: 2 x 8 x 2 x (8 + 8) = 512; output: 2 x 2 x 4 x 8 = 128
    assert cost.linear_flops == 640
    # 2 x 2 x (4 + 4)
    assert cost.attention_flops == 32
    # (2 layers x 3 + 4 fixed) launches x 5 us
    assert cost.launch_overhead_s == pytest.approx(50e-6)


@pytest.mark.parametrize("cached,tokens,pairs", [(0, 1, 1), (0, 3, 6), (10, 2, 23), (5, 0, 0)])
def test_attention_pairs(cached, tokens, pairs):
    assert attention_pairs(cached, tokens) == pairs


def test_lookup_and_transfer(cost):
    assert cost.lookup_s(1000) == pytest.approx(64_000 / 1e12)
    assert cost.transfer_s(0) == 0.0
    assert cost.transfer_s(1e6) == pytest.approx(10e-6 + 1e6 / 10e9)
    assert cost.host_s(3) == pytest.approx(3e-6)
    # 100 misses: 100 us host + 10 us + 6400 B / 10 GB/s
    assert cost.miss_s(100) == pytest.approx(100e-6 + 10e-6 + 0.64e-6)


def test_prefix_and_candidate_flops(cost):
    # 3 tokens after 10 cached: 2 layers x (640 x 3 + 32 x (30 + 6))
    assert cost.prefix_flops(3, 10) == 2 * (640 * 3 + 32 * 36)
    # 16 candidates over 13 tokens of context: 2 x (640 x 16 + 32 x 16 x 14)
    assert cost.candidate_flops(16, 13) == 2 * (640 * 16 + 32 * 16 * 14)


def test_compute_time(cost):
    flops = 2 * (640 * 3 + 32 * 36) + 2 * (640 * 16 + 32 * 16 * 14)
    assert cost.compute_s(3, 10, 16) == pytest.approx(flops / 50e12 + 50e-6)


def test_kv_onload_and_recompute(cost):
    assert cost.kv_bytes(100) == 6400
    assert cost.kv_onload_s(100) == pytest.approx(10e-6 + 6400 / 10e9)
    assert cost.recompute_s(100, 0) == pytest.approx(2 * (640 * 100 + 32 * 5050) / 50e12)


def test_breakdown_adds_up(cost):
    b = cost.breakdown(prefix_len=10, cached=4, new_tokens=2, candidates=16, misses=5, onload_tokens=3)
    # computed from position 7: 3 prefix tokens + 2 new = 5 tokens; ids = 5 + 16 = 21
    assert b.lookup_s == pytest.approx(cost.lookup_s(21))
    assert b.host_s == pytest.approx(5e-6)
    assert b.transfer_s == pytest.approx(10e-6 + 320 / 10e9)
    assert b.compute_s == pytest.approx(cost.compute_s(5, 7, 16))
    assert b.kv_onload_s == pytest.approx(10e-6 + 192 / 10e9)
    assert b.total_s == pytest.approx(sum(b))
