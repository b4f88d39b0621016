"""Choose the CPU thread count while training runs, from measured speed.

On a quiet machine all cores train fastest (BENCHMARKS.md, "The training loop around the
update"). When other processes compete for the cores, OpenMP threads spin at every
barrier waiting for a descheduled partner, and two threads can become many times slower
than one (BENCHMARKS.md, "On a loaded machine: OpenMP spin-waiting"). Which case holds
can change during a run, so now and then one update runs with the other thread count (a
probe), and the trainer keeps whichever has recently been faster by a margin.

A probe costs an update at the slower count (on a quiet machine, one update in 25 at
the slower count's speed: a few percent of the run) and oneDNN's kernels for that count,
which it builds per thread count. So probes become rarer while they keep confirming the
choice: the gap doubles after each, from `probe_every` up to `probe_most` updates. Two
things bring them back to `probe_every`: a probe that changes the choice, and the current
count's own speed moving by more than `shift` from what it was at the last probe, which
is what a load arriving or leaving looks like (a slowdown past the other count's speed
switches at once, with no probe).
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
        probe_most: int = 400,
        shift: float = 1.5,
    ) -> None:
        self.options = [most, 1] if most > 1 else [most]
        self.current = most
        self.probe_every, self.probe_most = probe_every, probe_most
        self.margin, self.shift = margin, shift
        self.rate: dict[int, float] = {}  # recent tokens/s with each thread count
        self._set = set_threads
        self._count = 0
        self._running = most
        self._gap = probe_every  # updates from one probe to the next
        self._next_probe = probe_every
        self._probing = False
        self._settled: float | None = None  # the current count's rate at the last probe

    def before_update(self) -> None:
        self._count += 1
        self._probing = len(self.options) > 1 and self._count >= self._next_probe
        wanted = self._other() if self._probing else self.current
        if wanted != self._running:
            self._set(wanted)
            self._running = wanted

    def after_update(self, tokens: int, seconds: float) -> int | None:
        """Record the update's speed; return the new thread count when it changes."""
        if self._probing:
            self._next_probe = self._count + self._gap
        if seconds <= 0 or self._count <= 2:  # the first updates warm up allocators
            return None
        rate = tokens / seconds
        old = self.rate.get(self._running)
        # A probe's rate stands alone: the last one may be hundreds of updates old, from
        # another load (a wrong one from a noisy update is undone by the updates after).
        if old is not None and not self._probing:
            rate = 0.7 * old + 0.3 * rate
        self.rate[self._running] = rate
        other = self._other()
        if other in self.rate and self.rate[other] > self.margin * self.rate[self.current]:
            self.current = other
            self._reset(self.probe_every)
            return other
        now = self.rate[self.current]
        if self._probing:  # the choice held: probe less often
            self._gap = min(self.probe_most, 2 * self._gap)
            self._next_probe = self._count + self._gap
            self._settled = now
        elif self._settled is not None and not (
            self._settled / self.shift <= now <= self._settled * self.shift
        ):
            self._reset(1)  # the load changed: look again at once
        return None

    def _reset(self, wait: int) -> None:
        """Frequent probes again, the next one `wait` updates from now."""
        self._gap = self.probe_every
        self._settled = None
        self._next_probe = self._count + wait

    def _other(self) -> int:
        return self.options[1] if self.current == self.options[0] else self.options[0]
