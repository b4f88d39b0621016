"""The attention weights of the steps that made each hypothesis of a beam search."""

from __future__ import annotations

from typing import Any

from torch import Tensor


class Trace:
    """Each step's attention weights, one row per (sentence, beam) row of that step, and
    for each row the row of the step before that it continues (its back-pointer).

    Rows move between steps (beams reorder, finished sentences leave the batch), so a
    hypothesis's weights are found by walking its back-pointers from its last step."""

    def __init__(self) -> None:
        self.weights: list[list[Tensor]] = []
        self.parents: list[Tensor | None] = []
        self.from_rows: Tensor | None = None  # per open beam: its row in the last step

    def add(self, weights: Any) -> None:
        if not isinstance(weights, list | tuple):
            raise TypeError("decode_step(need_weights=True) must return a list of tensors")
        self.weights.append([w.detach() for w in weights])
        self.parents.append(self.from_rows)

    def keep(self, rows: Tensor) -> None:
        """Open beams `rows` stay in the batch (in that order)."""
        assert self.from_rows is not None
        self.from_rows = self.from_rows.index_select(0, rows)

    def path(self, step: int, row: int) -> list[list[Tensor]]:
        """The weights of the hypothesis that ended at `row` of `step`, first step first."""
        out: list[list[Tensor]] = []
        for s in range(step, -1, -1):
            out.append([w[row] for w in self.weights[s]])
            parent = self.parents[s]
            if parent is not None:
                row = int(parent[row])
        return out[::-1]
