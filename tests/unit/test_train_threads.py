"""The thread tuner keeps the thread count that trains fastest, probing the other one."""

from __future__ import annotations

from nmt_cli.engines.train.threads import ThreadTuner


def simulate(speed: dict[int, float], updates: int) -> tuple[ThreadTuner, list[int]]:
    used: list[int] = []
    running = [2]
    tuner = ThreadTuner(2, probe_every=5, set_threads=lambda n: running.__setitem__(0, n))
    for _ in range(updates):
        tuner.before_update()
        used.append(running[0])
        tuner.after_update(1000, 1000 / speed[running[0]])
    return tuner, used


def test_keeps_all_threads_on_a_quiet_machine() -> None:
    tuner, used = simulate({2: 10_000.0, 1: 5_000.0}, 40)
    assert tuner.current == 2
    assert used.count(1) == 8  # only the probes, every 5th update


def test_drops_to_one_thread_when_two_are_slower_and_comes_back() -> None:
    tuner, used = simulate({2: 300.0, 1: 3_000.0}, 12)
    assert tuner.current == 1 and used[-1] == 1
    running = [used[-1]]
    tuner._set = lambda n: running.__setitem__(0, n)
    for _ in range(30):  # the other processes are gone
        tuner.before_update()
        speed = {2: 10_000.0, 1: 5_000.0}[running[0]]
        tuner.after_update(1000, 1000 / speed)
    assert tuner.current == 2
