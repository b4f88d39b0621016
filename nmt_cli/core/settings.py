"""Range checks for the settings dataclasses, each failure naming its dotted key.

Every numeric setting is checked when its dataclass is built (`__post_init__`), so a
value outside its range (`train.max_steps = -5`, `model.dropout = 1.5`, `nan`) stops
before any work with a message that names the key. `SettingError` carries the key, so
the recipe loader can say where the value came from: the recipe file or a `--set`.
"""

from __future__ import annotations

import math


class SettingError(ValueError):
    """A setting outside its range; `key` is its dotted name, e.g. train.max_steps."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key} {message}")
        self.key = key


def _number(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SettingError(key, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise SettingError(key, f"must be a finite number, got {value!r}")
    return float(value)


def at_least(section: str, obj: object, low: float, *names: str) -> None:
    """Each named field of `obj` is a finite number >= low."""
    for name in names:
        key, value = f"{section}.{name}", getattr(obj, name)
        if _number(key, value) < low:
            raise SettingError(key, f"must be at least {low:g}, got {value!r}")


def above(section: str, obj: object, low: float, *names: str) -> None:
    """Each named field of `obj` is a finite number > low."""
    for name in names:
        key, value = f"{section}.{name}", getattr(obj, name)
        if _number(key, value) <= low:
            raise SettingError(key, f"must be greater than {low:g}, got {value!r}")


def fraction(section: str, obj: object, *names: str) -> None:
    """Each named field of `obj` is in [0, 1): a probability that leaves something."""
    for name in names:
        key, value = f"{section}.{name}", getattr(obj, name)
        if not 0.0 <= _number(key, value) < 1.0:
            raise SettingError(key, f"must be in [0, 1), got {value!r}")


def below(section: str, obj: object, high: float, *names: str) -> None:
    """Each named field of `obj` is a finite number < high."""
    for name in names:
        key, value = f"{section}.{name}", getattr(obj, name)
        if _number(key, value) >= high:
            raise SettingError(key, f"must be below {high:g}, got {value!r}")


def one_of(section: str, obj: object, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise SettingError(f"{section}.{name}", f"must be one of {choices}, got {value!r}")
