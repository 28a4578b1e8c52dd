"""The README and docs/USAGE.md say the same about the extras, and what they say is
what pyproject.toml and deploy/setup.sh do (issue 38, item 6: the README named
`dev` for the tests, USAGE `dev` and `bench`; neither said where honcho comes from)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "USAGE.md"]


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _setup_extras() -> set[str]:
    line = re.search(r'^extras="([^"]+)"', (ROOT / "deploy" / "setup.sh").read_text(), re.M)
    assert line, "deploy/setup.sh sets its extras in one line"
    return set(line.group(1).split(","))


def test_both_pages_name_the_extras_the_tests_need_as_setup_installs_them():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {"dev", "bench"} <= _setup_extras() and {"dev", "bench"} <= set(extras)
    for doc in DOCS:
        text = " ".join(doc.read_text().split())  # wrapped lines as one
        assert "`dev` and `bench` for the tests" in text, doc.name
        assert 'pip install -e ".[llama,model]"' in text, doc.name


def test_honcho_is_said_to_come_with_the_dev_extra_wherever_it_is_run():
    dev = _extras()
    assert any(d.startswith("honcho") for d in dev["dev"])
    assert not any(d.startswith("honcho") for name, ds in dev.items() if name != "dev" for d in ds)
    for doc in DOCS:
        text = " ".join(doc.read_text().split())
        if "honcho" in text:
            assert re.search(r"`dev` brings honcho|honcho: dev extra", text), doc.name
