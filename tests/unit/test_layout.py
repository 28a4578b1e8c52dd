"""The package's shape: one import name, every room a subpackage, no import cycle."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _package_dirs() -> dict[str, Path]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = {name: ROOT / folder for name, folder in cfg["package-dir"].items()}
    out = {}
    for pkg in cfg["packages"]:
        base = max((n for n in mapping if pkg == n or pkg.startswith(n + ".")), key=len)
        out[pkg] = mapping[base].joinpath(*pkg[len(base) :].split(".")[1:])
    return out


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, folder in _package_dirs().items():
        for path in folder.glob("*.py"):
            name = pkg if path.stem == "__init__" else f"{pkg}.{path.stem}"
            mods[name] = path
    return mods


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Modules of ours that ``path`` imports, lazily or not (TYPE_CHECKING excluded)."""
    tree = ast.parse(path.read_text())
    skip = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m in known and m != name}


def test_every_folder_with_code_is_a_listed_package() -> None:
    listed = set(_package_dirs().values())
    for rooms in ("broker", "workers", "client", "common", "cli", "launcher", "bench", "tandem"):
        for init in (ROOT / rooms).rglob("__init__.py"):
            assert init.parent in listed, f"{init.parent} is missing from pyproject's packages"


def test_no_import_cycle() -> None:
    mods = _modules()
    graph = {m: _imports(p, m, set(mods)) for m, p in mods.items()}
    # a package's __init__ re-exporting its modules is not a cycle with them
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for dep in sorted(graph[m]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep) :] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, [*stack, dep])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
