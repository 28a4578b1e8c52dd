"""--cpus: core lists parse strictly, and pinning restricts the process."""

from __future__ import annotations

import psutil
import pytest

from tandem.common.affinity import parse_cpus, pin


def test_core_lists_parse_and_bad_ones_are_named() -> None:
    assert parse_cpus("0-3,8") == (0, 1, 2, 3, 8)
    assert parse_cpus("2,1,2") == (1, 2)
    for bad in ("", "a", "3-1", "-1", "1-", "0-99999"):
        with pytest.raises(ValueError, match="cpus"):
            parse_cpus(bad)


@pytest.mark.skipif(not hasattr(psutil.Process(), "cpu_affinity"), reason="no affinity here")
def test_pin_restricts_this_process_and_refuses_missing_cores() -> None:
    proc = psutil.Process()
    before = proc.cpu_affinity()
    try:
        pin((before[0],))
        assert proc.cpu_affinity() == [before[0]]
        with pytest.raises(ValueError, match="do not exist"):
            pin((4095,))
        pin(None)  # leaves it as it is
        assert proc.cpu_affinity() == [before[0]]
    finally:
        proc.cpu_affinity(before)
