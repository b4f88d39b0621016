"""nmt_cli/collector.py: the collector paused while a command starts up, then resumed."""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator

import pytest

from nmt_cli import collector


@pytest.fixture(autouse=True)
def collector_as_it_was() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    gc.unfreeze()  # this process's objects back within the collector's reach
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_paused_inside_resumed_after_with_what_exists_frozen() -> None:
    gc.enable()
    gc.unfreeze()
    with collector.paused():
        assert not gc.isenabled()
        made = [[] for _ in range(1000)]  # start-up's long-lived objects
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(made)
    within_reach = {id(x) for x in gc.get_objects()}
    assert all(gc.is_tracked(x) and id(x) not in within_reach for x in made)


def test_a_collector_the_caller_had_off_stays_off() -> None:
    gc.disable()
    with collector.paused():
        pass
    assert not gc.isenabled()


def test_a_failed_start_up_resumes_the_collector() -> None:
    gc.enable()
    with pytest.raises(RuntimeError), collector.paused():
        raise RuntimeError("no such checkpoint")
    assert gc.isenabled()


def test_what_start_up_froze_goes_back_to_the_collector_at_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its last collection then frees start-up's cycles, as without the pause: extensions
    that count their objects at exit (nanobind's) find none left over."""
    registered: list[object] = []
    monkeypatch.setattr(atexit, "register", registered.append)
    with collector.paused():
        pass
    assert registered == [gc.unfreeze]
