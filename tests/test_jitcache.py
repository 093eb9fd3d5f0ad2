"""A package's numba cache is cleared when any of its source files changes, and kept otherwise."""
from helmgr.core.jitcache import STAMP, clear_if_stale


def _package(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "layout.py").write_text("A = 1\n")
    return pkg


def test_cache_kept_while_sources_stay_and_cleared_when_one_changes(tmp_path):
    pkg = _package(tmp_path)
    cached = pkg / "__pycache__" / "kernel.decide-10.py311.nbi"
    clear_if_stale(str(pkg / "__init__.py"))                 # first sight: stamp written
    assert (pkg / "__pycache__" / STAMP).is_file()
    cached.write_text("index")
    clear_if_stale(str(pkg / "__init__.py"))
    assert cached.exists()                                   # nothing changed: kept
    (pkg / "layout.py").write_text("A = 2\n")                # a constant the kernel reads
    clear_if_stale(str(pkg / "__init__.py"))
    assert not cached.exists()
    other = pkg / "__pycache__" / "layout.cpython-311.pyc"
    other.write_text("bytecode")
    clear_if_stale(str(pkg / "__init__.py"))
    assert other.exists()                                    # only numba's files go


def test_cache_cleared_when_a_package_it_calls_into_changes(tmp_path):
    pkg = _package(tmp_path)
    other = tmp_path / "memory"
    other.mkdir()
    (other / "kv.py").write_text("def kv_insert(): return 1\n")
    cached = pkg / "__pycache__" / "engine.step-10.py311.nbi"
    clear_if_stale(str(pkg / "__init__.py"), "memory")
    cached.write_text("index")
    clear_if_stale(str(pkg / "__init__.py"), "memory")
    assert cached.exists()
    (other / "kv.py").write_text("def kv_insert(): return 2\n")   # compiled into pkg's functions
    clear_if_stale(str(pkg / "__init__.py"), "memory")
    assert not cached.exists()
