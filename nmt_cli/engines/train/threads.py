"""Choose the CPU thread count while training runs, from measured speed.

On a quiet machine all cores train fastest (two threads are 1.64x one in bf16 and 1.83x
in fp32 on the 2-core development machine, BENCHMARKS.md). When other
processes compete for the cores, OpenMP threads spin at every barrier waiting for a
descheduled partner, and two threads can become 10x slower than one (measured in
BENCHMARKS.md). Which case holds can change during a run, so every
`probe_every` updates one update runs with the other thread count, and the trainer keeps
whichever has recently been faster by a margin.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class ThreadTuner:
    def __init__(
        self,
        most: int,
        probe_every: int = 25,
        margin: float = 1.15,
        set_threads: Callable[[int], None] = torch.set_num_threads,
    ) -> None:
        self.options = [most, 1] if most > 1 else [most]
        self.current = most
        self.probe_every = probe_every
        self.margin = margin
        self.rate: dict[int, float] = {}  # recent tokens/s with each thread count
        self._set = set_threads
        self._count = 0
        self._running = most

    def before_update(self) -> None:
        self._count += 1
        probing = len(self.options) > 1 and self._count % self.probe_every == 0
        wanted = self._other() if probing else self.current
        if wanted != self._running:
            self._set(wanted)
            self._running = wanted

    def after_update(self, tokens: int, seconds: float) -> int | None:
        """Record the update's speed; return the new thread count when it changes."""
        if seconds <= 0 or self._count <= 2:  # the first updates warm up allocators
            return None
        rate = tokens / seconds
        old = self.rate.get(self._running)
        self.rate[self._running] = rate if old is None else 0.7 * old + 0.3 * rate
        other = self._other()
        if other in self.rate and self.rate[other] > self.margin * self.rate[self.current]:
            self.current = other
            return other
        return None

    def _other(self) -> int:
        return self.options[1] if self.current == self.options[0] else self.options[0]
