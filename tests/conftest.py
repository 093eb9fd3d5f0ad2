from pathlib import Path

import pytest

from helmgr.core.profiles import HardwareProfile, ModelProfile, NodeProfile

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent")
    return SHARED_DATA


def tiny_hardware(**kw) -> HardwareProfile:
    """Round numbers, so every expected cost in the tests can be worked out by hand."""
    base = dict(name="tiny", hbm_gib=1.0, hbm_bw_gbs=1000.0, pcie_bw_gbs=10.0, pcie_latency_us=10.0,
                peak_tflops=100.0, compute_efficiency=0.5, launch_us=5.0, host_lookup_ns=1000.0, reserved_gib=0.25,
                batch_efficiency=0.5, batch_half_rows=0.0)
    return HardwareProfile(**(base | kw))


def tiny_model(**kw) -> ModelProfile:
    base = dict(name="tiny", layers=2, heads=2, d_qk=4, d_v=4, d_model=8, dtype_bytes=2, features_per_token=2,
                emb_dim=8, emb_dtype_bytes=4, kernels_per_layer=3, fixed_kernels=4, candidates=16,
                weights_gib=0.125, activations_gib=0.125, slo_ms=10.0)
    return ModelProfile(**(base | kw))


def tiny_node_profile(hbm_gib: float = 0.515625, page_mib: float = 1 / 16) -> NodeProfile:
    """Default: a 16 MiB pool in 64 KiB pages = 256 pages of 1,024 rows (64 B) or 1,024 tokens."""
    return NodeProfile(tiny_hardware(hbm_gib=hbm_gib), tiny_model(), page_mib=page_mib)
