"""The backends this installation has, in order of preference, and the plan over them."""

from __future__ import annotations

from nmt_cli.backends import pytorch
from nmt_cli.backends.cpu import linear, training
from nmt_cli.backends.plan import Plan, Target, plan


def machine_plan(target: Target) -> Plan:
    """The plan over every backend, most specific first: the CPU backend's compiled
    kernels and decoding layers, then PyTorch's fused kernels, then core's references."""
    cpu = [*training.implementations(), *linear.implementations()]
    return plan(target, [*cpu, *pytorch.implementations()])
