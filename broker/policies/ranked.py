"""finish_time's answers kept in order between the decisions of a burst.

Between two decisions of one question shape only the workers whose view changed
get a new answer (finish.py ``FinishTime._answers``). Kept sorted, the answers
give a decision without a pass over the fleet: the exact scores by tie_break's
key (score, requests, id), so the first is the choice and the first ``KEEP`` set
the pruning limit; the bounds by (bound, position), the order in which
``FinishTime`` predicts them. A changed answer moves in O(log n) plus a
memmove, not a pass in Python over every worker.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

Entry = tuple[float, int, str, int]  # (score, requests, id, position)


class Ranked:
    """The exact answers as ``Entry``s, the bounds as (bound, position), both sorted,
    and ``scores`` (what ``Decision.scores`` shows: a pruned worker's bound)."""

    __slots__ = ("exact", "bounds", "scores")

    def __init__(
        self, gots: Sequence[float], keys: Sequence[tuple[int, str]], ids: Sequence[str]
    ) -> None:
        self.exact: list[Entry] = sorted((g, *keys[i], i) for i, g in enumerate(gots) if g > 0.0)
        self.bounds = sorted((-g, i) for i, g in enumerate(gots) if not g > 0.0)
        self.scores = dict(zip(ids, map(abs, gots), strict=True))

    @staticmethod
    def orderable(got: float) -> bool:
        """Whether ``got`` can be kept in order (NaN cannot: it compares false)."""
        return got == got

    def remove(self, got: float, key: tuple[int, str], i: int) -> None:
        """Take position ``i``'s answer ``got`` out (exactly as it was added)."""
        if got > 0.0:
            entries: list = self.exact
            at = bisect.bisect_left(entries, (got, *key, i))
        else:
            entries = self.bounds
            at = bisect.bisect_left(entries, (-got, i))
        del entries[at]

    def add(self, got: float, key: tuple[int, str], i: int) -> None:
        """Position ``i`` (worker ``key[1]``) answers ``got``."""
        if got > 0.0:
            bisect.insort(self.exact, (got, *key, i))
        else:
            bisect.insort(self.bounds, (-got, i))
        self.scores[key[1]] = abs(got)

    def limit(self, keep: int, slack: float) -> float:
        """The pruning limit: the ``keep``-th least exact score, with slack."""
        return self.exact[keep - 1][0] * slack if len(self.exact) >= keep else math.inf
