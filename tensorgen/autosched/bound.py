"""The automatic search's branch and bound: a staging choice is costed only if it can still win.

The search (search.py) takes the fastest fitting candidate, or one within TIE of it that moves
less DRAM. Before it costs a choice, cost_product (schedule/cost.py) works out a lower bound on
the choice's cycles from what it has already summed: the serial transfers (those of the
innermost staging level excepted when it double-buffers: they may overlap compute) plus the
band's cycles plus the fewest cycles the init and epilogue can take. The fastest candidate of the
whole search is at most the fastest costed so far (`best`), so a choice whose bound exceeds
`best * (1 + TIE)` can neither be the fastest nor come within TIE of it: it is skipped, and the
search chooses exactly what costing every candidate would (a bound equal to the threshold is
costed, so ties are broken as before).

The skipped choices, and those refused for overflowing a memory (which the search never takes),
still count (MAX_CANDIDATES, `searched N candidates`), and `Considered` costs them when
something reads them (the explanation's neighbours, the benchmarks): from the
probes the search kept, with the same figures the search would have found.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tensorgen.schedule.cost import Candidate


class Bound:
    """The fastest cycles costed so far, and whether a choice is worth costing."""

    def __init__(self, tie: float) -> None:
        self.tie = tie
        self.best: float = math.inf

    def cut(self, least: float) -> bool:
        """Whether a choice that takes at least `least` cycles cannot be chosen."""
        return least > self.best * (1 + self.tie)

    def add(self, cand: Candidate) -> None:
        self.best = min(self.best, cand.cycles)


class Considered(Sequence):
    """The candidates of a search in the order it visited them, the skipped ones (None while
    nobody reads them) costed on first read: its length does not cost them."""

    def __init__(self) -> None:
        self._items: list[Candidate | None] = []
        self._pending: list[tuple[int, Callable[[], list[Candidate]]]] = []

    def extend(self, cands: list[Candidate | None], recost: Callable[[], list[Candidate]]) -> None:
        """Append one loop nest's candidates; `recost` costs all of them, none skipped."""
        if any(c is None for c in cands):
            self._pending.append((len(self._items), recost))
        self._items.extend(cands)

    def costed(self) -> int:
        """How many of the candidates the search costed (not skipped)."""
        return sum(c is not None for c in self._items)

    def _fill(self) -> None:
        for start, recost in self._pending:
            for k, cand in enumerate(recost()):
                if self._items[start + k] is None:
                    self._items[start + k] = cand
        self._pending.clear()

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index):
        self._fill()
        return self._items[index]

    def __iter__(self) -> Iterator[Candidate]:
        self._fill()
        return iter(self._items)
