"""The SlotCache and the module's attention kernel over it (core/cache.py,
csrc/attention.cpp): the kernel, at AVX-512 and AVX2 width alike, computes attention as
float64 arithmetic does on the same inputs, for any head count and head sizes; a step
over the SlotCache, with its back-pointers, growth and shared sources, gives what a step
over the reference cache gives; and beam search of a trained model decodes the same
sentences through it."""

from __future__ import annotations

import copy
import gc
import math
import weakref
from collections.abc import Callable
from types import ModuleType

import pytest
import torch
from decode_models import decode_model
from reverser import reverse_batch
from torch import Tensor

from nmt_cli.backends.cpu.decoder import CpuDecoder
from nmt_cli.backends.cpu.slot_cache import SlotCache
from nmt_cli.core.cache import DecoderCache
from nmt_cli.core.search import beam_search
from nmt_cli.core.transformer import Transformer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _needs_the_kernel(kernel: ModuleType) -> None:
    if not kernel.attention_kernel_available():
        pytest.skip("this CPU has no AVX2 and FMA")


def _reference(
    q: Tensor, keys: Tensor, values: Tensor, bias: Tensor | None
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(d_k) + bias) v in float64: q (R, h, d_k), keys (R, L, h, d_k),
    values (R, L, h, d_v), bias (R, L) -> context (R, h * d_v), weights (R, h, L)."""
    scores = torch.einsum("rhd,rlhd->rhl", q.double(), keys.double()) / math.sqrt(q.size(-1))
    if bias is not None:
        scores = scores + bias.double()[:, None, :]
    weights = scores.softmax(-1)
    ctx = torch.einsum("rhl,rlhd->rhd", weights, values.double())
    return ctx.reshape(q.size(0), -1), weights


SHAPES = [(8, 32, 32), (3, 6, 10), (12, 64, 64), (16, 20, 40), (2, 128, 16), (4, 9, 128)]
# the kernel's body at each width it is compiled for (AVX-512 where this CPU has it)
LEVELS = ["native", "avx2"]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(("heads", "d_k", "d_v"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefix_attention_reads_each_rows_ancestors(
    kernel_at: Callable[[str], ModuleType],
    heads: int,
    d_k: int,
    d_v: int,
    dtype: torch.dtype,
    level: str,
) -> None:
    kernel = kernel_at(level)
    g = torch.Generator().manual_seed(heads * d_k + d_v)
    width, steps, rows, length = 7, 9, 5, 6
    keys = torch.randn(width, steps, heads, d_k, generator=g).to(dtype)
    values = torch.randn(width, steps, heads, d_v, generator=g).to(dtype)
    slots = torch.randint(0, width, (rows, steps), generator=g)
    # q, k and v as a step has them: column slices of one projection's rows
    qkv = torch.randn(rows, heads * (2 * d_k + d_v), generator=g)
    q, k, v = qkv.split_with_sizes([heads * d_k, heads * d_k, heads * d_v], dim=-1)
    weights = torch.empty(rows, heads, length)
    scale = 1 / math.sqrt(d_k)
    got = kernel.attend_prefix(q, k, v, keys, values, slots, length, scale, weights)
    # this step's keys and values went into each row's own slot, rounded as copy_ rounds
    newest = torch.arange(rows), length - 1
    assert torch.equal(keys[newest], k.view(rows, heads, d_k).to(dtype))
    assert torch.equal(values[newest], v.view(rows, heads, d_v).to(dtype))
    # step s of row r from slot slots[r, s]; the newest step from slot r itself
    at = slots[:, :length].clone()
    at[:, -1] = torch.arange(rows)
    steps_of = torch.arange(length)
    ctx, expected_weights = _reference(
        q.view(rows, heads, d_k), keys[at, steps_of], values[at, steps_of], None
    )
    assert got.dtype == torch.float32 and got.shape == (rows, heads * d_v)
    assert torch.allclose(got.double(), ctx, atol=1e-5)
    assert torch.allclose(weights.double(), expected_weights, atol=1e-6)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(("heads", "d_k", "d_v"), [*SHAPES[:3], SHAPES[-1]])
def test_memory_attention_shares_sources_and_masks_padding(
    kernel_at: Callable[[str], ModuleType], heads: int, d_k: int, d_v: int, level: str
) -> None:
    kernel = kernel_at(level)
    g = torch.Generator().manual_seed(7)
    sources, length = 3, 5
    keys = torch.randn(sources, length, heads, d_k, generator=g).bfloat16()
    values = torch.randn(sources, length, heads, d_v, generator=g).bfloat16()
    bias = torch.zeros(sources, length)
    bias[1, 3:] = float("-inf")
    rows = torch.tensor([1, 1, 0, 2, 1])
    q = torch.randn(5, heads * d_k, generator=g).bfloat16()
    weights = torch.empty(5, heads, length)
    got = kernel.attend_memory(q, keys, values, rows, bias, 1 / math.sqrt(d_k), weights)
    ctx, expected_weights = _reference(
        q.float().view(5, heads, d_k), keys[rows], values[rows], bias[rows]
    )
    assert got.dtype == torch.bfloat16  # the query's dtype
    assert torch.allclose(got.double(), ctx, rtol=2**-7, atol=1e-3)
    assert torch.allclose(weights.double(), expected_weights, atol=1e-5)
    assert bool((weights[[0, 1, 4], :, 3:] == 0).all())  # padding of source 1 is never read


@pytest.mark.parametrize("level", LEVELS)
def test_steps_over_the_slot_cache_equal_steps_over_the_reference_cache(
    kernel_at: Callable[[str], ModuleType], level: str
) -> None:
    """Float32 slots, so that only the order of the sums differs: 40 steps (the buffers
    grow past their first 32), the rows expand from sentences to beams as beam
    search's first reorder does, beams reorder within their sentence, and a sentence
    leaves the batch."""
    kernel = kernel_at(level)
    model = decode_model("fp32", max_positions=64)
    src = torch.randint(4, 50, (2, 7), generator=torch.Generator().manual_seed(3))
    src[:, -1] = 3
    src[1, 4:] = 0
    src[1, 3] = 3
    slot = SlotCache(kernel, 4, 8, 8, 2, dtype=torch.float32)
    reference = DecoderCache.empty(2, torch.float32, 4)
    mask = model.source_mask(src)
    g = torch.Generator().manual_seed(4)
    with torch.inference_mode():
        memory = model.encode(src, mask)
        tokens = torch.tensor([2, 2])
        for position in range(40):
            want, _ = model.decode_step(tokens, memory, mask, reference)
            got, _ = model.decode_step(tokens, memory, mask, slot)
            assert torch.allclose(got, want, atol=1e-5), position
            rows = tokens.numel()
            if position == 0:
                order = torch.arange(2).repeat_interleave(3)  # 2 sentences x 3 beams
                cross = True
            elif position == 25:  # sentence 0 leaves
                order, cross = torch.arange(3, 6), True
            else:  # beams reorder within their sentence
                beams = 3
                pick = torch.randint(0, beams, (rows,), generator=g)
                order = (torch.arange(rows) // beams) * beams + pick
                cross = False
            for cache in (slot, reference):
                cache.reorder(order, cross)
            mask, memory = mask[order] if cross else mask, memory[order] if cross else memory
            tokens = want.argmax(-1)[order]
    assert slot.table.steps == 64 and slot.layers[0].self_k is not None
    assert slot.layers[0].self_k.shape == (6, 64, 4, 8)  # widened once, for the beams


def test_beam_search_of_a_trained_model_decodes_the_same_through_it(
    kernel: ModuleType, reverser: Transformer
) -> None:
    """bf16 slots, as bf16 and int8 models decode: sentences end at different steps and
    leave the batch; the trained model's choices do not change."""
    src = reverse_batch(12, torch.Generator().manual_seed(1))[0]
    expected = beam_search(reverser, src, 4)
    model = CpuDecoder(copy.deepcopy(reverser).eval(), None, kernel, compiled=False)
    model.attention_kernel = kernel  # fp32 weights over the bf16 slots
    assert isinstance(model.new_cache(), SlotCache)
    got = beam_search(model, src, 4)
    assert [[h.tokens for h in s] for s in got] == [[h.tokens for h in s] for s in expected]
    for a, b in zip(got, expected, strict=True):
        assert a[0].score == pytest.approx(b[0].score, abs=1e-2)


def test_a_finished_cache_is_freed_at_once(kernel: ModuleType) -> None:
    """No reference cycle: a batch's buffers go when its search drops the cache, not
    whenever Python's cycle collector runs (memory grew with the input when they did)."""
    model = decode_model("fp32", kernel, max_positions=64)
    model.attention_kernel = kernel
    src = torch.randint(4, 50, (2, 5), generator=torch.Generator().manual_seed(3))
    cache = model.new_cache()
    assert isinstance(cache, SlotCache)
    cache.reserve(20)
    with torch.inference_mode():
        mask = model.source_mask(src)
        model.decode_step(torch.tensor([2, 2]), model.encode(src, mask), mask, cache)
    buffer = cache.layers[0].self_k
    assert buffer is not None and buffer.shape[1] == 32  # at least 32 steps
    gone = weakref.ref(buffer)
    del buffer
    gc.disable()
    try:
        del cache
        assert gone() is None
    finally:
        gc.enable()
