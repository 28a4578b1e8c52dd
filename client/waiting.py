"""What a request the router holds waits for, in words: a starting worker as the
CLI's waiting line, ``tandem status`` and the gateway's /health name it.

A starting worker is a row of ``StatusReply.starting`` (broker/starting.py): its
id, device, stage (``loading``, ``measuring``, ``registering``) and the seconds
it estimates are left (``eta_s``, None when it cannot tell).
"""

from __future__ import annotations

from typing import Any

# A starting worker's stage (``Starting.stage``, docs/PROTOCOL.md), in words.
STAGES = {
    "loading": "loading its model",
    "measuring": "measuring itself",
    "registering": "ready soon",
}


def stage_words(stage: Any) -> str:
    return STAGES.get(str(stage), str(stage))


def starting_label(row: dict[str, Any]) -> str:
    """``cpu0 (measuring itself, ~4 s)``; without an estimate, how long it has been
    starting: ``cpu0 (loading its model, 12 s so far)``."""
    eta = row.get("eta_s")
    if isinstance(eta, int | float):
        when = f"~{eta:.0f} s" if eta >= 0.5 else "any moment"
    else:
        when = f"{float(row.get('starting_for_s') or 0):.0f} s so far"
    return f"{row['id']} ({stage_words(row.get('stage'))}, {when})"


def waiting_for_starting(rows: list[dict[str, Any]]) -> str:
    """``waiting for worker cpu0 (measuring itself, ~4 s)``, or ``workers a (...), b
    (...)`` for several."""
    several = "s" if len(rows) > 1 else ""
    return f"waiting for worker{several} " + ", ".join(map(starting_label, rows))
