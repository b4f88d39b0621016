"""Which SDPA kernels run where: the selection logic, tested without a GPU."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from nmt_cli.backends import pytorch as pytorch_backend
from nmt_cli.backends.machine import machine_plan
from nmt_cli.backends.plan import Target
from nmt_cli.backends.pytorch import (
    ATTENTION_BACKENDS,
    backend_scope,
    fused_attention_under,
    mask_kind,
    sdpa_backends,
)
from nmt_cli.core.operations import Operations
from nmt_cli.core.transformer import MultiHeadAttention, Transformer

FLASH, EFFICIENT = SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION
MATH, CUDNN = SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION


def test_off_a_gpu_every_policy_leaves_pytorch_its_own_choice_but_names_are_checked() -> None:
    """The policy chooses among CUDA kernels only: on any other device, whatever the
    policy, precision or mask, SDPA keeps its own choice (None); a policy that is not
    one of ATTENTION_BACKENDS is refused there too, so a recipe's typo shows on a CPU."""
    for policy, device, dtype, mask in itertools.product(
        ATTENTION_BACKENDS,
        ("cpu", "mps"),
        (torch.float32, torch.bfloat16, torch.float16),
        ("none", "causal", "padding"),
    ):
        assert sdpa_backends(policy, device, dtype, mask) is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="use one of auto, flash"):
        sdpa_backends("fast", "cpu", torch.float32, "none")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("dtype", "mask", "expected"),
    [
        (torch.bfloat16, "causal", [FLASH, EFFICIENT, MATH]),  # decoder self-attention
        (torch.float16, "none", [FLASH, EFFICIENT, MATH]),
        (torch.bfloat16, "padding", [EFFICIENT, MATH]),  # encoder and cross-attention
        (torch.float16, "padding", [EFFICIENT, MATH]),
        (torch.float32, "causal", [EFFICIENT, MATH]),  # flash has no fp32 kernel
        (torch.float32, "padding", [EFFICIENT, MATH]),
    ],
)
def test_auto_on_a_gpu_picks_flash_where_it_runs_then_efficient(
    dtype: torch.dtype, mask: str, expected: list[SDPBackend]
) -> None:
    assert sdpa_backends("auto", "cuda", dtype, mask) == expected  # type: ignore[arg-type]


def test_auto_never_allows_cudnn_and_always_keeps_math_last() -> None:
    for dtype, mask in itertools.product(
        (torch.float32, torch.bfloat16, torch.float16), ("none", "causal", "padding")
    ):
        chosen = sdpa_backends("auto", "cuda", dtype, mask)  # type: ignore[arg-type]
        assert chosen is not None
        assert CUDNN not in chosen
        assert chosen[-1] == MATH


def test_named_policies_add_their_kernel_to_the_same_fallbacks() -> None:
    bf16 = torch.bfloat16
    assert sdpa_backends("cudnn", "cuda", bf16, "padding") == [CUDNN, FLASH, EFFICIENT, MATH]
    assert sdpa_backends("flash", "cuda", bf16, "padding") == [FLASH, EFFICIENT, MATH]
    assert sdpa_backends("efficient", "cuda", bf16, "causal") == [EFFICIENT, MATH]
    assert sdpa_backends("math", "cuda", bf16, "causal") == [MATH]
    with pytest.raises(ValueError, match="use one of auto, flash"):
        sdpa_backends("fast", "cuda", bf16, "none")  # type: ignore[arg-type]


def test_mask_kind_of_each_attention() -> None:
    key_mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    assert mask_kind(key_mask, causal=False) == "padding"
    assert mask_kind(None, causal=True) == "causal"
    assert mask_kind(None, causal=False) == "none"


def test_scope_allows_only_the_chosen_kernels_and_restores_the_rest() -> None:
    q = torch.randn(2, 2, 5, 8)
    before = torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()
    with backend_scope([MATH]):
        assert not torch.backends.cuda.flash_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    after = torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()
    assert after == before
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, q, q, is_causal=True))
    with backend_scope(None):
        assert torch.backends.cuda.flash_sdp_enabled() == before[0]


def test_a_gpu_plan_gives_every_layer_the_policys_kernels(tiny_model: Transformer) -> None:
    """The planner's choice for a GPU reaches every attention layer, once, at construction;
    a policy name outside the list is refused."""
    target = Target(torch.device("cuda"), training=True, attention_backend="efficient")
    chosen = machine_plan(target)
    assert "attention: PyTorch's fused kernels" in chosen.describe()
    assert "keep_mask: PyTorch's dropout" in chosen.describe()
    model = Transformer(tiny_model.cfg, chosen.operations)
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(layers) == 2 + 2 * 2  # encoder self; decoder self and cross
    assert {id(m.ops.attention) for m in layers} == {id(chosen.operations.attention)}
    with pytest.raises(ValueError, match="attention backend 'fast'"):
        fused_attention_under("fast")  # type: ignore[arg-type]


def test_a_restricted_kernel_set_gives_the_same_attention(
    tiny_model: Transformer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused kernels run inside the chosen scope (here forced to math on the CPU, as a
    GPU would run its choice) and give what the reference gives."""
    src = torch.randint(4, 40, (3, 7))
    src[0, 5:] = 0
    tgt = torch.randint(4, 40, (3, 6))
    fused = Transformer(tiny_model.cfg, Operations(attention=fused_attention_under("auto")))
    fused.load_state_dict(tiny_model.state_dict())
    fused.eval()
    with torch.no_grad():
        expected = tiny_model(src, tgt)
        seen: list[tuple[str, str]] = []

        def forced(policy: str, device: str, dtype: torch.dtype, mask: str) -> list[SDPBackend]:
            seen.append((policy, mask))
            return [MATH]

        monkeypatch.setattr(pytorch_backend, "sdpa_backends", forced)
        got = fused(src, tgt)
    torch.testing.assert_close(got, expected)
    assert {mask for _, mask in seen} == {"padding", "causal"}


def test_the_gpu_kernel_scope_compiles_into_one_graph() -> None:
    """What a GPU's compiled model traces: the policy, its imports and both scopes, with
    no graph break (the scope is forced as on a GPU; the CPU runs the math kernel)."""

    def attend(q: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        with backend_scope(sdpa_backends("auto", "cuda", q.dtype, mask_kind(key_mask, False))):
            a = F.scaled_dot_product_attention(q, q, q, attn_mask=key_mask)
        with backend_scope(sdpa_backends("auto", "cuda", q.dtype, mask_kind(None, True))):
            b = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return a + b

    q = torch.randn(2, 2, 8, 16)
    key_mask = torch.ones(2, 1, 1, 8, dtype=torch.bool)
    key_mask[0, ..., 6:] = False
    explained = torch._dynamo.explain(attend)(q, key_mask)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    compiled = torch.compile(attend, backend="aot_eager", dynamic=True)
    torch.testing.assert_close(compiled(q, key_mask), attend(q, key_mask))
