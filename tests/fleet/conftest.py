"""The fleet tests run inside a network namespace of their own (test_namespace.py
starts them there); outside one, every test here but that runner skips."""

from __future__ import annotations

import pytest

from tests.fleet.harness import private_netns


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="runs inside its own network namespace (test_namespace.py)")
    for item in items:
        if "/tests/fleet/" not in str(item.path):
            continue
        item.add_marker(pytest.mark.ray)
        if item.path.name != "test_namespace.py" and not private_netns():
            item.add_marker(skip)
