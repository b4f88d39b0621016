"""The thread tuner keeps the thread count that trains fastest, probing the other one
less often while the probes keep confirming the choice, and at once when the load moves."""

from __future__ import annotations

from nmt_cli.engines.train.threads import ThreadTuner

Speeds = dict[int, float]


def run(tuner: ThreadTuner, running: list[int], speed: Speeds, n: int) -> list[int]:
    """`n` updates at `speed[threads]` tokens/s; the thread count of each."""
    used: list[int] = []
    for _ in range(n):
        tuner.before_update()
        used.append(running[0])
        tuner.after_update(1000, 1000 / speed[running[0]])
    return used


def make(probe_every: int = 5, probe_most: int = 40) -> tuple[ThreadTuner, list[int]]:
    running = [2]
    tuner = ThreadTuner(
        2,
        probe_every=probe_every,
        probe_most=probe_most,
        set_threads=lambda n: running.__setitem__(0, n),
    )
    return tuner, running


QUIET: Speeds = {2: 10_000.0, 1: 5_000.0}
LOADED: Speeds = {2: 300.0, 1: 3_000.0}


def test_keeps_all_threads_and_probes_ever_less_often_on_a_quiet_machine() -> None:
    tuner, running = make()
    used = run(tuner, running, QUIET, 300)
    assert tuner.current == 2
    probes = [i + 1 for i, n in enumerate(used) if n == 1]
    # the gap doubles from 5 to at most 40 updates
    assert probes[:6] == [5, 15, 35, 75, 115, 155]
    assert len(probes) == 9


def test_drops_to_one_thread_when_two_are_slower_and_comes_back() -> None:
    tuner, running = make()
    used = run(tuner, running, LOADED, 12)
    assert tuner.current == 1 and used[-1] == 1
    run(tuner, running, QUIET, 30)  # the other processes are gone
    assert tuner.current == 2


def test_a_load_that_arrives_late_switches_without_waiting_for_a_probe() -> None:
    tuner, running = make()
    run(tuner, running, QUIET, 200)  # probes now 40 updates apart
    used = run(tuner, running, LOADED, 10)
    assert tuner.current == 1
    assert used.index(1) <= 3


def test_a_load_that_leaves_after_a_long_one_is_noticed_at_once() -> None:
    tuner, running = make()
    run(tuner, running, LOADED, 300)  # one thread; probes 40 apart
    assert tuner.current == 1
    used = run(tuner, running, QUIET, 12)
    assert tuner.current == 2
    assert used.index(2) <= 5  # within a few updates, not at the next scheduled probe


def test_only_a_probe_can_find_a_change_inside_the_band_and_then_probes_come_often() -> None:
    tuner, running = make()
    run(tuner, running, QUIET, 200)  # probes now 40 updates apart
    # Two threads a little slower (inside the band that calls for a probe at once), one
    # thread faster than they are now: only the next scheduled probe can find it.
    changed: Speeds = {2: 7_500.0, 1: 9_000.0}
    used = run(tuner, running, changed, 60)
    assert tuner.current == 1
    switched = used.index(1)
    assert switched < 41
    again = [i - switched for i, n in enumerate(used) if n == 2 and i > switched]
    assert again[:2] == [5, 15]  # probes of two threads every 5 updates, then 10, ...
