from importlib import resources

import pytest

from helmgr.core.errors import HelmInputError
from helmgr.core.profiles import GIB, available, load_hardware, load_model, node_profile

A100_TOML = resources.files("helmgr.core.profiles") / "hardware" / "a100-80g.toml"


def test_presets_exist():
    assert {"a100-80g", "h100-80g", "h200-141g"} <= set(available("hardware"))
    assert {"small", "large"} <= set(available("model"))


@pytest.mark.parametrize("name,kib", [("small", 6), ("large", 32)])
def test_kv_bytes_per_token_matches_spec(name, kib):
    # small ~6 KiB (3 x 4 x 256 x 2), large ~32 KiB (8 x 4 x 512 x 2)
    assert load_model(name).kv_bytes_per_token == kib * 1024


def test_pool_budget_is_hbm_minus_weights_activations_workspace():
    p = node_profile("a100-80g", "large")
    assert p.pool_budget_bytes == int((80.0 - 3.0 - 1.0 - 6.0) * GIB)
    assert p.page_bytes == 2 * 1024 * 1024


def test_derived_hardware_units():
    hw = load_hardware("h100-80g")
    assert hw.pcie_bw == 50e9
    assert hw.flops == pytest.approx(989e12 * 0.25)


@pytest.mark.parametrize("kind,name", [("hardware", "tpu-v9"), ("model", "huge")])
def test_unknown_preset_is_a_named_error(kind, name):
    with pytest.raises(HelmInputError, match=name):
        (load_hardware if kind == "hardware" else load_model)(name)


def test_profile_file_with_non_positive_value(tmp_path):
    text = A100_TOML.read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("hbm_gib = 80.0", "hbm_gib = -1.0"))
    with pytest.raises(HelmInputError, match=r"bad.toml.*hbm_gib must be in \(0, .*got -1.0"):
        load_hardware(str(bad))


def test_impossible_profiles_are_rejected(tmp_path):
    with pytest.raises(HelmInputError, match="larger than half the pool"):
        node_profile("a100-80g", "large", page_mib=40 * 1024)
    text = A100_TOML.read_text()
    small = tmp_path / "small-gpu.toml"
    small.write_text(text.replace("hbm_gib = 80.0", "hbm_gib = 8.0"))
    with pytest.raises(HelmInputError, match="leaves no pool"):
        node_profile(str(small), "large")
