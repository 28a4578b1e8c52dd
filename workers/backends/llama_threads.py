"""How many threads a CPU llama.cpp worker gives a prompt chunk: measured while it serves.

A worker decodes with ``threads`` (a core is left to the router, the gateway and the
client's processes: llama.cpp's threads meet at a barrier every operation, and one
descheduled stalls the rest). A prompt chunk is a larger product, and whether one more
thread speeds it up or stalls it depends on what else runs at that moment: beside
aiperf on the 2-core development machine, llama-cpp-python's own server prefilled a
burst of 12 prompts at 47-52 output tok/s with 2 batch threads and 33-36 with 1, but
its conc-1 prompts (the client streaming beside them) took 8.9 s with 2 against 2.3 s
with 1 (docs/results/peer.md). So neither count is right for every load.

``PrefillThreads`` chooses per chunk between ``threads`` and ``threads + 1`` (where a
core is spare: the worker is not pinned and the machine has one more) by the measured
seconds a token of each, an exponentially weighted mean, trying the other count every
``EXPLORE_EVERY`` chunks so that a change of load is seen. Decode calls keep
``threads``: the backend gives chunks calls of their own (llama_rows.py) only where rows
split, and only then is the choice made.
"""

from __future__ import annotations

ALPHA = 0.3  # weight of a new chunk in a count's mean cost
EXPLORE_EVERY = 12  # every this many chunks, the count not in favour is tried again
MIN_TOKENS = 32  # chunks smaller than this are timed but not counted (costlier a token)


class PrefillThreads:
    """The thread count for the next prompt chunk, from what chunks cost so far."""

    def __init__(self, choices: tuple[int, ...]) -> None:
        self.choices = choices
        self.cost_s: dict[int, float | None] = dict.fromkeys(choices)
        self.chunks = 0

    def pick(self) -> int:
        self.chunks += 1
        unknown = [k for k in self.choices if self.cost_s[k] is None]
        if unknown:
            return unknown[0]
        best = min(self.choices, key=lambda k: self.cost_s[k] or 0.0)
        if len(self.choices) > 1 and self.chunks % EXPLORE_EVERY == 0:
            others = [k for k in self.choices if k != best]
            return others[(self.chunks // EXPLORE_EVERY) % len(others)]
        return best

    def record(self, threads: int, seconds: float, tokens: int) -> None:
        if tokens < MIN_TOKENS or threads not in self.cost_s:
            return
        per = seconds / tokens
        old = self.cost_s[threads]
        self.cost_s[threads] = per if old is None else (1 - ALPHA) * old + ALPHA * per


def choices(threads: int, pinned: bool, cores: int) -> tuple[int, ...]:
    """The counts a chunk may run with: ``threads``, and one more where a core is spare."""
    return (threads, threads + 1) if not pinned and cores > threads else (threads,)
