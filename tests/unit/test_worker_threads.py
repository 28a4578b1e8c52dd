"""A worker not told its llama.cpp threads takes the cores it may use less one (all of
``cpus`` when pinned), never fewer than 1; a number given is kept."""

from __future__ import annotations

import pytest

from tandem.workers import config as worker_config
from tandem.workers.config import WorkerConfig, default_threads


@pytest.mark.parametrize(("cores", "want"), [(1, 1), (2, 1), (3, 2), (16, 15)])
def test_the_default_leaves_one_core(monkeypatch, cores, want):
    monkeypatch.setattr(worker_config, "usable_cores", lambda: cores)
    assert default_threads() == want
    assert WorkerConfig(router="tcp://x:1").threads == want


def test_a_pinned_worker_takes_all_its_cores(monkeypatch):
    monkeypatch.setattr(worker_config, "usable_cores", lambda: 16)
    assert WorkerConfig(router="tcp://x:1", cpus=(4, 5, 6)).threads == 3


def test_a_number_given_is_kept_and_a_negative_one_refused():
    assert WorkerConfig(router="tcp://x:1", threads=5).threads == 5
    with pytest.raises(ValueError, match="threads"):
        WorkerConfig(router="tcp://x:1", threads=-1)
