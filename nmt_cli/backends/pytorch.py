"""PyTorch's fused attention as a backend: which of its kernels may run, by device,
precision and mask.

`fused_attention_under(policy)` is the attention of section 3.2.1 as one call to
`F.scaled_dot_product_attention`, with PyTorch's choice of kernel narrowed by `policy`
on a GPU. On recent NVIDIA GPUs it prefers cuDNN's, which builds a new execution graph
for every new (batch, length) shape. Batches grouped by length (section 5.1) make nearly
every batch a new shape, so with cuDNN's kernel the host spends milliseconds per
attention call building graphs while the GPU idles (BENCHMARKS.md, "GPU").
FlashAttention-2 and the memory-efficient kernel take any shape at no per-shape cost:
flash runs the decoder's causal self-attention (no explicit mask) in 16-bit precisions,
the memory-efficient kernel takes every mask (the source key-padding mask) and fp32. The
math kernel stays last, for shapes neither supports (head widths not a multiple of 8,
d_k != d_v in flash), so no model of Table 3 fails.

On a CPU PyTorch's own choice stands; the planner (backends/plan.py) gives CPU training
the reference or the compiled kernel instead, the fused kernel's backward pass being
the slower there, except for restricted attention's blocks (core/local_attention.py),
where the fused kernel keeps the memory linear in the length.

The policy names load without torch (the recipe's settings check them); the functions
that need torch import it when called.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch
    from torch import Tensor
    from torch.nn.attention import SDPBackend

    from nmt_cli.backends.plan import Implementation, Target
    from nmt_cli.core.attention import Attention

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


def fused_attention_under(policy: AttentionBackend) -> Attention:
    """PyTorch's fused attention, its kernels chosen among those `policy` allows for each
    call's device, dtype and mask (`sdpa_backends`)."""
    from nmt_cli.core.attention import fused_attention

    check_policy(policy)

    @functools.wraps(fused_attention)  # `__wrapped__`: what a caller may recognise
    def attend(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        allowed = sdpa_backends(policy, q.device.type, q.dtype, mask_kind(mask, causal))
        with backend_scope(allowed):
            return fused_attention(q, k, v, mask, causal, dropout_p)

    return attend


def implementations() -> list[Implementation]:
    """What this backend runs: attention (sequences and blocks) by the fused kernels,
    dropout by PyTorch's own on a GPU."""
    from nmt_cli.backends.plan import Implementation

    def attention_refuses(target: Target) -> str | None:
        cpu_training = target.training and target.device.type == "cpu"
        return "its backward pass is the slower on a CPU" if cpu_training else None

    def fused(target: Target) -> Attention:
        return fused_attention_under(target.attention_backend)

    return [
        Implementation("attention", "PyTorch's fused kernels", attention_refuses, fused),
        Implementation("blocks", "PyTorch's fused kernels", lambda target: None, fused),
        Implementation(
            "keep_mask", "PyTorch's dropout", lambda target: None, lambda target: None, "cuda"
        ),
    ]
