"""The package's shape: one import name, every room a subpackage, rooms layered, no
import cycle."""

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


def _imports(path: Path, name: str, known: set[str], types_too: bool = False) -> set[str]:
    """Modules of ours that ``path`` imports, lazily or not (TYPE_CHECKING excluded
    unless ``types_too``)."""
    tree = ast.parse(path.read_text())
    skip = {
        id(n)
        for node in ast.walk(tree)
        if not types_too and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
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


# common < client, workers < broker, gateway, launcher < bench, twin, fleet < cli: a room
# imports only rooms of a lower layer. The package root re-exports the client, and
# ``python -m tandem`` is the command.
LAYERS = (("common",), ("client", "workers"), ("broker", "gateway", "launcher"),
          ("bench", "twin", "fleet"), ("cli",))  # fmt: skip
RANK = {room: i for i, layer in enumerate(LAYERS) for room in layer}
RANK |= {"": RANK["client"] + 0.5, "__main__": RANK["cli"] + 1}
# Imports inside one layer, each with its reason; the cycle test keeps them one-way.
WITHIN_LAYER = {
    ("twin", "bench"): "the twin replays the bench's workloads, worker specs and oracle",
}
# Known breaks of the rule, to be moved (each is listed in its issue).
PENDING: dict[tuple[str, str], str] = {}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_folder_with_code_is_a_listed_package() -> None:
    listed = set(_package_dirs().values())
    for room in [*RANK, "tandem"]:
        for init in (ROOT / room).rglob("__init__.py") if room else ():
            assert init.parent in listed, f"{init.parent} is missing from pyproject's packages"


def test_every_room_has_a_layer() -> None:
    rooms = {_room(m) for m in _package_dirs()}
    assert rooms <= set(RANK), f"rooms without a layer: {sorted(rooms - set(RANK))}"
    assert {"common", "client", "workers", "broker", "gateway", "cli", "bench", "twin"} <= rooms


def test_rooms_import_only_lower_layers() -> None:
    mods = _modules()
    broken = []
    for m, path in mods.items():
        for dep in _imports(path, m, set(mods)):
            a, b = _room(m), _room(dep)
            if a == b or m.startswith(dep + "."):  # a package's own __init__
                continue
            if RANK[b] < RANK[a] or (a, b) in WITHIN_LAYER or (a, b) in PENDING:
                continue
            broken.append(f"{m} -> {dep}")
    assert not broken, "imports against the layers:\n" + "\n".join(sorted(broken))


def test_the_listed_exceptions_are_still_needed() -> None:
    """An exception nothing uses any more goes, so the rule only tightens."""
    mods = _modules()
    used = {(_room(m), _room(d)) for m, p in mods.items() for d in _imports(p, m, set(mods))}
    unused = (set(WITHIN_LAYER) | set(PENDING)) - used
    assert not unused, f"no longer needed, remove from the lists: {sorted(unused)}"


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The import graph's strongly connected parts of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for dep in graph[m]:
            if dep not in index:
                visit(dep)
                low[m] = min(low[m], low[dep])
            elif dep in stack:
                low[m] = min(low[m], index[dep])
        if low[m] == index[m]:
            part = set()
            while (top := stack.pop()) != m:
                part.add(top)
            if part:
                out.append(part | {m})

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return out


# Loops through imports for types alone (no import at run time), each with its reason.
TYPE_ONLY_LOOPS = {
    frozenset({"tandem.common.protocol", "tandem.common.validation"}): "the checks name the "
    "message classes they check; the messages run the checks",
    frozenset({"tandem.client.stream", "tandem.client.sync"}): "a stream is typed by the "
    "client that owns it",
    frozenset(
        {
            "tandem.workers.backends.llama",
            "tandem.workers.backends.llama_state",
            "tandem.workers.backends.llama_rows",
        }
    ): "the state and row-probe helpers are typed by the backend they serve",
}


def test_types_live_where_both_sides_import_them_without_a_loop() -> None:
    """Counting imports for types too, the only loops are the listed ones: a type used
    on both sides of a loop lives in the wrong file (the workers' config, backend
    registry and device model were untangled so)."""
    mods = _modules()
    graph = {m: _imports(p, m, set(mods), types_too=True) for m, p in mods.items()}
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    loops = {frozenset(part) for part in _cycles(graph)}
    assert loops == set(TYPE_ONLY_LOOPS), sorted(sorted(x) for x in loops ^ set(TYPE_ONLY_LOOPS))


def test_every_backend_name_has_its_class() -> None:
    from tandem.workers import backends
    from tandem.workers.config import BACKENDS

    assert tuple(backends._REGISTRY) == BACKENDS


# What the driver owns and the core is handed: time, threads, sockets (STYLE.md 16).
DRIVERS_ONLY = {"time", "threading", "concurrent", "zmq"}


def test_the_router_core_reads_no_clock_owns_no_thread_and_touches_no_socket() -> None:
    """broker/core.py and every broker module it reaches import none of ``DRIVERS_ONLY``,
    lazily or not: the live loop (broker/router.py), the twin and the tests hand it the
    time, the results of its offloaded work and its peers' frames."""
    mods = _modules()
    graph = {m: _imports(p, m, set(mods)) for m, p in mods.items()}
    reached, todo = set(), ["tandem.broker.core"]
    while todo:
        m = todo.pop()
        if m not in reached:
            reached.add(m)
            todo += [d for d in graph[m] if d.startswith("tandem.broker")]
    assert {"tandem.broker.membership", "tandem.broker.routing", "tandem.broker.state"} <= reached
    found = {}
    for m in reached:
        tree = ast.parse(mods[m].read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        hit = {name.split(".")[0] for name in names} & DRIVERS_ONLY
        if hit:
            found[m] = sorted(hit)
    assert not found, found


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


RESULTS = ROOT / "docs" / "results"


def _study_plots(folder: Path) -> list[Path]:
    """A study's plots: its folder's and those of subfolders that are not studies."""
    out = list(folder.glob("*.png"))
    for sub in (p for p in folder.iterdir() if p.is_dir() and not (p / "README.md").exists()):
        out += _study_plots(sub)
    return out


def test_results_are_studies_within_their_budget() -> None:
    """docs/results holds summaries with a plot or two, not dumps: every clone carries it."""
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= 5_000_000
    assert all(p.stat().st_size < 200_000 for p in files if p.suffix == ".png")
    assert all(p.suffix in {".md", ".png", ".xz", ".json", ".jsonl", ".py"} for p in files)
    for readme in RESULTS.rglob("README.md"):
        assert len(_study_plots(readme.parent)) <= 2, readme.parent
