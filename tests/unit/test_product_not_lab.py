"""The package is a product, not a lab (issue 39): the bench room stays the size of what
a user runs, no room of the package reaches into studies/ or tests/, and every study
is listed in studies/README.md with its question, result and rerun command."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.test_layout import ROOT, _package_dirs

# `tandem bench` (workloads, runner, statistics, report, plots, oracle, trace) and what
# `tandem sim` borrows from it: 2,173 lines when the studies left (4,210 before).
BENCH_MAX_LINES = 2_500


def test_the_bench_room_holds_what_a_user_runs() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in (ROOT / "bench").glob("*.py")}
    total = sum(sizes.values())
    biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total < BENCH_MAX_LINES, (
        f"bench/ has {total} lines (largest: {biggest}): a measurement that answers one "
        "question belongs in studies/ (studies/README.md)"
    )


def _top_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    return {name.split(".")[0] for name in names}


def test_no_room_of_the_package_imports_a_study_or_a_test() -> None:
    """A study imports the installed package like any program; never the other way,
    since the wheel ships neither studies/ nor tests/."""
    found = {
        str(path.relative_to(ROOT)): sorted(hit)
        for folder in _package_dirs().values()
        for path in folder.glob("*.py")
        if (hit := _top_imports(path) & {"studies", "tests"})
    }
    assert not found, found


def test_every_study_is_listed_in_the_readme() -> None:
    studies = ROOT / "studies"
    readme = (studies / "README.md").read_text()
    entries = [p for p in studies.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()]
    entries = [p for p in entries if p.name not in {"__init__.py", "__pycache__"}]
    assert len(entries) > 10
    missing = [p.name for p in entries if f"]({p.name}" not in readme]
    assert not missing, f"studies without a line in studies/README.md: {missing}"
