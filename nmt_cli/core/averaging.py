"""Checkpoint averaging as arithmetic over state dicts (the paper's final models average
the last 5 or 20 checkpoints, section 6.1).

`StateAverager` keeps one running sum: the caller loads a checkpoint, adds it, and drops
it before loading the next, so averaging 20 big checkpoints needs the memory of the sum
plus one checkpoint, not of 20. Floating tensors are summed in float64 whatever their
stored precision (bf16 or fp16 checkpoints lose nothing to the sum) and the mean is
written as float32, or wider if stored wider. Integer and boolean tensors (counters,
masks) are not averaged, since a mean of counts is meaningless: they must agree across
checkpoints, or they are taken from the newest one when `integers="last"`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor


class AveragingError(ValueError):
    """The state dicts cannot be averaged: different keys, shapes or kinds of tensor."""


def differences(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Every (sorted) key whose value differs between two plain mappings, described for a
    person ("d_model: 512 vs 256"); empty when they are equal."""
    found = []
    for key in sorted(set(a) | set(b)):
        name = f"{prefix}{key}"
        if key not in a or key not in b:
            left = "missing" if key not in a else repr(a[key])
            found.append(f"{name}: {left} vs " + ("missing" if key not in b else repr(b[key])))
        elif a[key] != b[key]:
            found.append(f"{name}: {a[key]!r} vs {b[key]!r}")
    return found


def first_difference(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> str | None:
    """The first of `differences`, or None when the mappings are equal."""
    found = differences(a, b, prefix)
    return found[0] if found else None


def _is_float(t: Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def tensor_layout_difference(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> str | None:
    """The first difference in keys, shapes or kind (floating vs integer) of two state
    dicts, or None when they can be averaged."""
    for key in sorted(set(a) | set(b)):
        if key not in a:
            return f"parameter {key!r} is missing from the first"
        if key not in b:
            return f"parameter {key!r} is missing from the second"
        x, y = a[key], b[key]
        if tuple(x.shape) != tuple(y.shape):
            return f"parameter {key!r} has shape {tuple(x.shape)} vs {tuple(y.shape)}"
        if _is_float(x) != _is_float(y):
            return f"parameter {key!r} has dtype {x.dtype} vs {y.dtype}"
    return None


@dataclass
class StateAverager:
    """Running mean of state dicts, added one at a time.

    integers: "equal" refuses integer/boolean tensors that differ between state dicts;
    "last" keeps the most recently added value.
    """

    integers: Literal["equal", "last"] = "last"
    count: int = 0
    _sums: dict[str, Tensor] = field(default_factory=dict)
    _dtypes: dict[str, torch.dtype] = field(default_factory=dict)
    _first: dict[str, Tensor] = field(default_factory=dict)  # shapes/kinds to check against

    def add(self, state: Mapping[str, Tensor]) -> None:
        if self.count:
            diff = tensor_layout_difference(self._first, state)
            if diff is not None:
                raise AveragingError(diff)
        for key, value in state.items():
            value = value.detach()
            if _is_float(value):
                wide = torch.complex128 if value.is_complex() else torch.float64
                if key in self._sums:
                    self._sums[key].add_(value.to(device="cpu", dtype=wide))
                else:
                    self._sums[key] = value.to(device="cpu", dtype=wide, copy=True)
                    self._dtypes[key] = value.dtype
            else:
                if (
                    self.count
                    and self.integers == "equal"
                    and not torch.equal(self._sums[key], value.cpu())
                ):
                    raise AveragingError(f"integer tensor {key!r} differs between checkpoints")
                self._sums[key] = value.to("cpu", copy=True)
            if not self.count:
                # Only shapes and kinds are kept: an empty tensor of the same shape.
                self._first[key] = torch.empty(value.shape, dtype=value.dtype, device="meta")
        self.count += 1

    def result(self) -> dict[str, Tensor]:
        """The mean, as float32 (or the stored dtype when wider) for floating tensors."""
        if not self.count:
            raise AveragingError("nothing to average")
        out: dict[str, Tensor] = {}
        for key, total in self._sums.items():
            if key in self._dtypes:
                stored = self._dtypes[key]
                if stored.is_complex:
                    target = stored
                else:
                    target = stored if torch.finfo(stored).bits > 32 else torch.float32
                out[key] = (total / self.count).to(target)
            else:
                out[key] = total.clone()
        return out
