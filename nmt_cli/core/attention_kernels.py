"""Which scaled dot-product attention kernels may run, by device, precision and mask.

The attention of section 3.2.1 is one call to `F.scaled_dot_product_attention`, and
PyTorch picks a kernel for it. On recent NVIDIA GPUs it prefers cuDNN's, which builds a
new execution graph for every new (batch, length) shape. Batches grouped by length
(section 5.1) make nearly every batch a new shape, so training on one H200 spent ~8 ms
of host time per attention call building graphs while the GPU idled. FlashAttention-2
and the memory-efficient kernel take any shape at no per-shape cost: flash runs the
decoder's causal self-attention (no explicit mask) in 16-bit precisions, the
memory-efficient kernel takes every mask (the source key-padding mask) and fp32. The
math kernel stays last, for shapes neither supports (head widths not a multiple of 8,
d_k != d_v in flash), so no model of Table 3 fails.

On a CPU PyTorch's own choice stands: CPU training and single-query decoding do not call
SDPA at all (the written-out form is faster there, see `transformer.py`), except
restricted self-attention's blocks (`local_attention.py`), where the fused kernel keeps
the cost linear in the length.

The policy names load without torch (the recipe's settings check them); the functions
that need torch import it when called.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch
    from torch.nn.attention import SDPBackend

AttentionBackend = Literal["auto", "flash", "efficient", "cudnn", "math"]
MaskKind = Literal["none", "causal", "padding"]

ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "flash", "efficient", "cudnn", "math")


def sdpa_backends(
    policy: AttentionBackend, device_type: str, dtype: torch.dtype, mask: MaskKind
) -> list[SDPBackend] | None:
    """The kernels SDPA may choose from; None leaves PyTorch's default (off GPUs).

    PyTorch tries the allowed kernels in its own order of preference, math last.
    'auto' never allows cuDNN (per-shape graph builds) and allows flash only where it
    can run (16-bit inputs and no explicit mask: a padding mask rules it out), then the
    memory-efficient kernel and math, which accepts everything. A named policy adds its
    kernel to the same fallbacks, so a setting that does not fit a call (flash with a
    padding mask, say) degrades instead of failing; 'math' alone is the reference.
    """
    check_policy(policy)
    if device_type != "cuda":
        return None
    import torch
    from torch.nn.attention import SDPBackend

    if policy == "math":
        return [SDPBackend.MATH]
    flash_fits = dtype in (torch.bfloat16, torch.float16) and mask != "padding"
    chosen: list[SDPBackend] = []
    if policy == "cudnn":
        chosen.append(SDPBackend.CUDNN_ATTENTION)
    if policy in ("cudnn", "flash") or (policy == "auto" and flash_fits):
        chosen.append(SDPBackend.FLASH_ATTENTION)
    return [*chosen, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def check_policy(policy: str) -> None:
    """A clear error for a policy name that is not one of ATTENTION_BACKENDS."""
    if policy not in ATTENTION_BACKENDS:
        raise ValueError(
            f"attention backend {policy!r}: use one of {', '.join(ATTENTION_BACKENDS)}"
        )


def mask_kind(key_mask: torch.Tensor | None, causal: bool) -> MaskKind:
    """How a call masks its keys: an explicit (padding) mask, the causal flag, or none."""
    if key_mask is not None:
        return "padding"
    return "causal" if causal else "none"


def backend_scope(backends: list[SDPBackend] | None) -> contextlib.AbstractContextManager[object]:
    """A context that lets SDPA choose only among `backends` (nothing when None)."""
    if backends is None:
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(backends)
