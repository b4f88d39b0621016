"""The planner: for one model on one machine, which implementation runs each operation.

Every hot operation has its reference in core (core/operations.py). A backend declares
what it implements faster as `Implementation`s, each saying for which targets it runs
(device, training or decoding, the decoding precision, the compiled module being there)
and, where it does not, why. `plan` takes, for each operation, the first implementation
in order of preference that runs the target, or the reference, and records the reasons
of those passed over: the `Plan` holds the model's `Operations` (handed to the
Transformer when it is built: nothing is set on its modules later) and its description
(`--verbose`, `nmt env`).

The same idea as PyTorch's SDPA dispatcher (each kernel checks whether it can run the
call, in a fixed order, math last) and vLLM's `CustomOp` (a native forward, one per
platform), made once per model rather than per call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import TYPE_CHECKING, Any

from nmt_cli.core.operations import REFERENCE, Operations

if TYPE_CHECKING:
    import torch

    from nmt_cli.backends.pytorch import AttentionBackend


@dataclass(frozen=True)
class Target:
    """What a plan is made for."""

    device: torch.device
    training: bool  # training (and its validation) or decoding
    attention_backend: AttentionBackend = "auto"  # the recipe's GPU kernel policy
    kernel: ModuleType | None = None  # the CPU backend's compiled module, when loaded
    no_kernel: str = "the compiled module is not loaded"  # why not, when it is not
    precision: str | None = None  # what decoding runs in (DecodePrecision); None: training


@dataclass(frozen=True)
class Implementation:
    """One backend's implementation of one operation (a field of `Operations`)."""

    operation: str
    name: str  # in words, for the plan's description
    # None where it runs `target`, else the reason it does not.
    refuses: Callable[[Target], str | None]
    make: Callable[[Target], Any]
    device: str | None = None  # the only device type it is for (None: any)
    training: bool | None = None  # for training only, decoding only (None: both)
    precision: str | None = None  # the only decoding precision it is for (None: any)


@dataclass(frozen=True)
class Choice:
    operation: str
    name: str
    passed_over: tuple[str, ...] = ()  # "<implementation>: <why not>", faster ones first

    def describe(self) -> str:
        """What runs the operation, and why nothing faster does."""
        why = f" (not {'; not '.join(self.passed_over)})" if self.passed_over else ""
        return f"{self.name}{why}"


@dataclass(frozen=True)
class Plan:
    operations: Operations
    choices: tuple[Choice, ...] = field(default=())

    def describe(self) -> list[str]:
        """One line per operation: what runs it, and why nothing faster does."""
        return [f"{choice.operation}: {choice.describe()}" for choice in self.choices]

    def choice(self, operation: str) -> Choice:
        """The choice made for `operation` (a field of `Operations`)."""
        return next(choice for choice in self.choices if choice.operation == operation)


REFERENCE_NAME = "core's reference (PyTorch operations)"


def plan(target: Target, implementations: Sequence[Implementation]) -> Plan:
    """For each operation of `Operations`, the first of `implementations` (in order of
    preference) that runs `target`, else the reference."""
    operations: Operations = REFERENCE
    choices: list[Choice] = []
    for name in Operations.__dataclass_fields__:
        passed: list[str] = []
        chosen = REFERENCE_NAME
        for implementation in (i for i in implementations if _for(i, name, target)):
            why = implementation.refuses(target)
            if why is None:
                operations = replace(operations, **{name: implementation.make(target)})
                chosen = implementation.name
                break
            passed.append(f"{implementation.name}: {why}")
        choices.append(Choice(name, chosen, tuple(passed)))
    return Plan(operations, tuple(choices))


def _for(implementation: Implementation, operation: str, target: Target) -> bool:
    """Whether `implementation` is one for `operation` on the target's kind of run at all
    (one that is not is not "passed over": it never applied)."""
    return (
        implementation.operation == operation
        and implementation.device in (None, target.device.type)
        and implementation.training in (None, target.training)
        and implementation.precision in (None, target.precision)
    )
