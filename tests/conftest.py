import fcntl
import os
import tempfile
from pathlib import Path

import pytest

from helmgr.core.profiles import HardwareProfile, ModelProfile, NodeProfile

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


# -- under pytest-xdist (one worker per core) ------------------------------------------------------
# On a fresh clone the simulator's compiled engine takes ~70 s of one core to compile, and every
# worker would compile it at once. The first worker to build a compiled run compiles every kernel
# (two tiny runs) under a lock file named by the test run; a worker that gets there meanwhile waits
# and then loads numba's on-disk cache (~3 s). The work order hands the second worker files that
# never build one (Ray Serve's, the workloads') first, so its core works while the first compiles.
FIRST_FILES = ("test_phase_oracle.py", "test_serve.py", "test_regimes_v2.py", "test_workload.py")


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    count: dict[str, int] = {}
    for item in items:
        count[item.path.name] = count.get(item.path.name, 0) + 1
    first = {name: k for k, name in enumerate(FIRST_FILES)}
    rank = {name: (first.get(name, len(first)), -n) for name, n in count.items()}   # then most tests first
    items.sort(key=lambda item: rank[item.path.name])


def _compile_once() -> None:
    from helmgr.sim import SimConfig, engine, simulate
    from helmgr.workload import default_config, synthetic_workload
    init = engine.CompiledRun.__init__
    lock = Path(tempfile.gettempdir()) / f"helmgr-tests-{os.environ['PYTEST_XDIST_TESTRUNUID']}.lock"

    def first_init(self, *args, **kwargs):
        engine.CompiledRun.__init__ = init            # every later run goes straight through
        with open(lock, "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            w = synthetic_workload(default_config("steady", duration_s=2.0, rps=100.0), 0)
            for policy, router in (("static", "prefix-aware"), ("helm", "helm")):   # both compiled variants
                simulate(SimConfig(nodes=2, policy=policy, router=router, warmup_s=0.0), w)
        init(self, *args, **kwargs)
    engine.CompiledRun.__init__ = first_init


if os.environ.get("PYTEST_XDIST_TESTRUNUID"):
    _compile_once()


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
