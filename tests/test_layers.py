"""The layers of docs/layout.md point one way: every import in the package, lazy ones inside functions
included, goes to the same layer or one below, and no two modules import each other in a cycle."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "helmgr"

# lowest first; packages on one line share a layer and must not import each other
LAYERS = [
    ("core",),
    ("memory",),
    ("workload", "history"),
    ("controller",),
    ("policy", "routing"),
    ("sim",),
    ("learn",),
    ("experiments",),
    ("real",),
    ("serve",),
    ("cli",),
]
RANK = {pkg: rank for rank, pkgs in enumerate(LAYERS) for pkg in pkgs}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every helmgr module `path` imports, anywhere in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m == "helmgr" or m.startswith("helmgr.")}


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    return {name: {m for m in imports(p) if m in modules and m != name} for name, p in modules.items()}


def package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_package_has_a_layer():
    pkgs = {package(m) for m in graph()} - {None}
    top_modules = {p.stem for p in SRC.glob("*.py")} - {"__init__"}
    assert pkgs - top_modules <= set(RANK), f"packages without a layer: {sorted(pkgs - set(RANK))}"
    assert not top_modules, f"modules outside every layer: {sorted(top_modules)}"


def test_imports_point_down():
    upward = []
    for mod, deps in graph().items():
        src = package(mod)
        if src is None:                        # helmgr/__init__: the facade over the layers
            continue
        for dep in deps:
            dst = package(dep)
            if dst is None or dst == src:
                continue
            if RANK[dst] > RANK[src] or (RANK[dst] == RANK[src]):
                upward.append(f"{mod} -> {dep}")
    assert not upward, "imports that do not point down:\n" + "\n".join(sorted(upward))


def test_no_import_cycle():
    # a package's __init__ importing its own modules (and they, it) is how packages work
    g = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph().items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(g[m]):
            if d == "helmgr":
                continue
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (cycle := visit(d)):
                return cycle
        state[m] = 2
        stack.pop()
        return None

    for m in sorted(g):
        if m not in state and (cycle := visit(m)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_the_checker_sees_a_lazy_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from helmgr.sim import simulate\n    import helmgr.cli.output\n")
    assert imports(bad) == {"helmgr.sim", "helmgr.sim.simulate", "helmgr.cli.output"}
