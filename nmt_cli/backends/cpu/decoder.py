"""A Transformer wrapped for decoding on a CPU: the backend's one `Searchable`.

The model's linear layers are the planner's choice (backends/cpu/linear.py's
implementations: fp32, packed bf16 or int8 layers, on the compiled module's kernels or
PyTorch's), made when the model was built. `cpu_decoders` makes the rest of the
choice of arithmetic for each model, from that one: the output projection in the same
form, whether the module's log-softmax and attention kernel (with the SlotCache) take
part, and whether the compiled step runs the whole step. The rule:
the module's own arithmetic, which differs from PyTorch's in the last bits, only where the
output projection already runs on its kernels (fp32 and int8 on CPUs with AVX2 and up,
bf16 on those with AVX-512 BF16), so models on PyTorch's products keep PyTorch's exact
scores; the model-shaped parts (compiled step, attention
kernel) only for models whose settings backends/cpu/support.py declares implemented.

`CpuDecoder.decode_step` is core's reference step (Transformer.step_hidden) followed by
the output projection and log-softmax, or the compiled step, which is tested to equal it.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any, cast

import torch
from torch import Tensor, nn

from nmt_cli.backends.cpu.build import CompileError, prepare_kernel
from nmt_cli.backends.cpu.contract import ContractError
from nmt_cli.backends.cpu.linear import DecodeLinear, DecodeLinears
from nmt_cli.backends.cpu.slot_cache import SlotCache
from nmt_cli.backends.cpu.step import CompiledStep
from nmt_cli.backends.cpu.support import unsupported
from nmt_cli.core.attention import fused_attention
from nmt_cli.core.beam_advance import Advance, BeamAdvance, decode_then_advance, torch_advance
from nmt_cli.core.cache import StepCache
from nmt_cli.core.model_config import ModelConfig
from nmt_cli.core.open_sentence import Ended, OpenSentence
from nmt_cli.core.step_linear import LinearLayer, StepLinear, linear
from nmt_cli.core.transformer import DecoderLayer, EncoderLayer, Transformer
from nmt_cli.core.vocab import BOS_ID, EOS_ID, PAD_ID
from nmt_cli.cpu_level import vector_width

_BANNED = [PAD_ID, BOS_ID]  # never chosen: search's mask_specials


def kernel_advance(kernel: ModuleType) -> BeamAdvance:
    """The compiled module's `beam_advance` (csrc/beam_topk.cpp) as a BeamAdvance: the
    same bookkeeping as search's torch_advance in one call (tested against it)."""

    def advance(lprobs: Tensor, cum: Tensor, history: Tensor, k: int) -> Advance:
        return Advance(*kernel.beam_advance(lprobs, cum, history, k, EOS_ID, _BANNED))

    return advance


class CpuDecoder(nn.Module):
    """One Transformer as search decodes it on a CPU (core.searchable.Searchable).

    `model` is decoded as it was built (its linear layers as planned); `projection` is
    the decode-only output projection (None: the tied embedding as it is); `kernel` is
    the compiled module (None: PyTorch's arithmetic only); `structural` says whether
    the model-shaped parts (compiled step, attention kernel) may decode this model, and
    `compiled=False` keeps the step in Python over the same kernels (what the compiled
    step is tested against); `open_rows_only=False` computes closed beams' rows too (what
    skipping them is tested against).
    """

    def __init__(
        self,
        model: Transformer,
        projection: StepLinear | None = None,
        kernel: ModuleType | None = None,
        structural: bool = True,
        compiled: bool = True,
        open_rows_only: bool = True,
    ) -> None:
        super().__init__()
        self.model = model
        self.projection = projection
        # The module's own arithmetic (log-softmax, attention), which differs from
        # PyTorch's in the last bits, only where the projection already runs on its
        # kernels, so that models on PyTorch's products keep PyTorch's exact scores.
        own = getattr(projection, "kernel", None) if kernel is not None else None
        self.own_arithmetic: ModuleType | None = own
        self.attention_kernel = (
            own if own is not None and structural and own.attention_kernel_available() else None
        )
        self.step: CompiledStep | None = None
        if kernel is not None and structural and compiled:
            self.step = CompiledStep(model, projection, kernel, own is not None)
        # The compiled encoder calls PyTorch's fused attention: where the encoder's is
        # another (core's reference, as in the tests), it stays in Python.
        self.compiled_encoder = self.step is not None and all(
            inspect.unwrap(cast(EncoderLayer, layer).self_attn.ops.attention) is fused_attention
            for layer in model.encoder
        )
        # Beam search's bookkeeping, from the same module as the step when there is one.
        self.advance: BeamAdvance = kernel_advance(kernel) if kernel is not None else torch_advance
        self._shape_free_rows: float | None = None  # measured on first use
        self.open_rows_only = open_rows_only

    @property
    def cfg(self) -> ModelConfig:
        return self.model.cfg

    @property
    def max_positions(self) -> int:
        return self.model.max_positions

    def source_mask(self, src: Tensor) -> Tensor:
        return self.model.source_mask(src)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """The compiled encoder where the compiled step runs: Transformer.encode's
        arithmetic without the Python between its operations."""
        if self.step is None or not self.compiled_encoder:
            return self.model.encode(src, src_mask)
        return self.step.encode(src, self.source_mask(src) if src_mask is None else src_mask)

    def encode_with_attention(
        self, src: Tensor, src_mask: Tensor | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        return self.model.encode_with_attention(src, src_mask)

    def new_cache(self) -> StepCache:
        """The SlotCache where the attention kernel decodes this model, else core's."""
        if self.attention_kernel is None:  # float32 whatever the model's dtype: oneDNN's
            return self.model.new_cache(torch.float32)  # bf16 is slow at one-query shapes
        # bf16 beside bf16 and int8 products, float32 beside fp32 ones (linear.py)
        first = cast(DecoderLayer, self.model.decoder[0]).self_attn
        layers = len(self.model.decoder)
        dtype = getattr(self.projection, "cache_dtype", torch.bfloat16)
        return SlotCache(self.attention_kernel, first.h, first.d_k, first.d_v, layers, dtype)

    def decode_step(
        self,
        last_tokens: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: Any,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor] | None]:
        """Transformer.decode_step's contract: (B,) tokens -> float32 log-probabilities
        (B, V), and with `need_weights` the step's attention weights (the reference step,
        which records them)."""
        if self.step is not None and not need_weights:
            if cache.length == 0:
                self._cache_memory(memory, src_mask, cache)
            return self.step(last_tokens, cache), None
        hidden, weights = self.model.step_hidden(last_tokens, memory, src_mask, cache, need_weights)
        return self.log_probs(self._project(hidden)), weights

    def decode_advance(
        self,
        last_tokens: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: Any,
        cum: Tensor,
        history: Tensor,
        k: int,
        at_limit: Tensor | None,
    ) -> Advance:
        """Search's beam step after the first. Where the log-softmax is the module's, the
        step's logits go straight to its fused log-softmax and choice
        (csrc/beam_choose.cpp): the reference's results bit for bit, without writing
        the log-probabilities out and reading them back."""
        if self.own_arithmetic is None:
            step = (last_tokens, memory, src_mask, cache, cum, history, k, at_limit)
            return decode_then_advance(self, *step)
        computed = self._computed_rows(cum, k, cache)
        if computed is None:
            logits = self._logits(last_tokens, memory, src_mask, cache)
            logit_rows = None
        else:  # the open beams' rows (and filler) alone through the step
            with cast(SlotCache, cache).only(computed) as logit_rows:
                logits = self._logits(last_tokens[computed], memory, src_mask, cache)
        chosen = self.own_arithmetic.beam_choose(
            logits, cum, history, k, EOS_ID, _BANNED, at_limit, logit_rows
        )
        return Advance(*chosen)

    def _computed_rows(self, cum: Tensor, k: int, cache: Any) -> Tensor | None:
        """Which beams' rows a step computes, None for all. A closed beam (search narrows
        the beam as hypotheses finish, and a finished sentence rides as filler) offers no
        candidate, so its row would be computed for nothing: 6-8% of the rows at 128
        sentences a batch (BENCHMARKS.md). Skipped where moving rows is cheap (the
        SlotCache moves a table of back-pointers, not keys; the compiled step, with the
        cross-attention already cached) and each row's result does not depend on the
        others (rows the products take as they come, `shape_free_rows`); above them the
        rows are rounded up to `slots`' shapes with closed ones, as search's filler is,
        so that no product builds a kernel for a new shape."""
        cheap = self.open_rows_only and self.step is not None and isinstance(cache, SlotCache)
        if not cheap or cache.length == 0:
            return None
        closed = cum.isneginf()
        rows = cum.numel()
        open_rows = rows - int(closed.sum())
        if open_rows == rows:
            return None
        if open_rows > self.shape_free_rows_cached():
            wanted = self.slots(-(-open_rows // k), k) * k
            if wanted >= rows:
                return None
            filler = closed.nonzero().squeeze(1)[: wanted - open_rows]
            closed[filler] = False
        return (~closed).nonzero().squeeze(1)

    def finish_sentence(
        self, sentence: OpenSentence, memory: Tensor, src_mask: Tensor, cache: Any
    ) -> list[Ended] | None:
        """The rest of a one-sentence search as one call of the compiled step, where
        decode_advance would take the fused log-softmax and choice over the slot cache:
        decode_advance's steps and search's rules with no Python between them (tested
        against search's loop); None elsewhere."""
        if not self._finishes_sentences() or not isinstance(cache, SlotCache):
            return None
        assert self.step is not None
        if sentence.step == 0:  # from the first step: the cache is still empty
            if cache.table.reserved <= sentence.limit:
                return None  # its buffers would grow on the way
            self._cache_memory(memory, src_mask, cache)
            cache.reorder(torch.zeros(sentence.beam, dtype=torch.long), cross=True)
        return self.step.finish_sentence(sentence, cache, EOS_ID, _BANNED)

    def _logits(self, last_tokens: Tensor, memory: Tensor, src_mask: Tensor, cache: Any) -> Tensor:
        """decode_step's output layer before its log-softmax, by the same step."""
        if self.step is not None:
            if cache.length == 0:
                self._cache_memory(memory, src_mask, cache)
            return self.step(last_tokens, cache, log_probs=False)
        hidden, _ = self.model.step_hidden(last_tokens, memory, src_mask, cache)
        return self._project(hidden)

    def _project(self, hidden: Tensor) -> Tensor:
        """The output projection: the decode-only one, else the tied embedding."""
        if self.projection is None:
            return self.model.logits(hidden)
        return linear(self.projection, hidden)

    def _cache_memory(self, memory: Tensor, src_mask: Tensor, cache: StepCache) -> None:
        """Every decoder layer's cross-attention keys/values of `memory` in `cache`: the
        reference step's work on its first step, done here for the compiled step, which
        expects them there already (in one call of it over a fresh SlotCache)."""
        fresh = isinstance(cache, SlotCache) and not any(m.has_memory() for m in cache.layers)
        if self.step is not None and fresh:
            self.step.cache_memory(memory, src_mask, cast(SlotCache, cache))
            return
        for layer, layer_cache in zip(self.model.decoder, cache.layers, strict=True):
            if not layer_cache.has_memory():
                attention = cast(DecoderLayer, layer).cross_attn
                layer_cache.store_memory(*attention.project_kv(memory), src_mask)

    def slots(self, open_sentences: int, beam: int) -> int:
        """Exactly the open sentences while their rows fit products that build no kernel
        per shape (`shape_free_rows`), `batch_bucket` above."""
        if open_sentences * beam <= self.shape_free_rows_cached():
            return open_sentences
        return batch_bucket(open_sentences)

    def shape_free_rows_cached(self) -> float:
        """shape_free_rows, measured on first use."""
        if self._shape_free_rows is None:
            self._shape_free_rows = self.shape_free_rows()
        return self._shape_free_rows

    def shape_free_rows(self) -> float:
        """The most rows a step takes without a product building a kernel for its shape:
        the fewest of every linear layer's and the output projection's (without a stand-in,
        the tied embedding in the model's dtype). Beam search keeps finished sentences as
        filler only above it (`slots`)."""
        layers = [m for m in self.model.modules() if isinstance(m, (nn.Linear, StepLinear))]
        rows = [_shape_free_rows(layer) for layer in layers]
        if self.projection is not None:
            rows.append(_shape_free_rows(self.projection))
        else:
            rows.append(_plain_rows(self.model.tgt_embed.tokens.weight))
        return min(rows, default=math.inf)

    def paths(self) -> dict[str, str]:
        """Which implementation each operation of a decoding step takes for this model,
        in words: what `nmt env` reports, read off the choice made above."""
        return {
            "decoder step": "the module's (C++, one call)" if self.step else "core's (Python)",
            "log-softmax": (
                "the module's passes"
                if self.own_arithmetic is not None
                and self.own_arithmetic.vectorized()["log_softmax"]
                else "PyTorch's"
            ),
            "attention": (
                f"the module's {self._attention_width()} kernel over the slot cache"
                if self.attention_kernel is not None
                else "PyTorch's operations over core's cache"
            ),
            "beam bookkeeping": (
                "PyTorch's"
                if self.advance is torch_advance
                else "the module's, fused with its log-softmax"
                if self.own_arithmetic is not None
                else "the module's"
            ),
            "one sentence's search": (
                "the module's (C++, one call for every step)"
                if self._finishes_sentences()
                else "search's loop (Python)"
            ),
        }

    def _finishes_sentences(self) -> bool:
        """Whether finish_sentence can take a one-sentence search (its cache permitting):
        the compiled step over the slot cache, whose attention kernel is there only where
        the log-softmax and choice are the module's too."""
        return self.step is not None and self.attention_kernel is not None

    def _attention_width(self) -> str:
        """The attention kernel's instructions at the module's level in force."""
        assert self.attention_kernel is not None
        return vector_width(self.attention_kernel.cpu_level())

    def log_probs(self, logits: Tensor) -> Tensor:
        """log_softmax in float32: the module's three passes where its arithmetic is this
        model's (faster; equal to PyTorch's to ~2e-6), PyTorch's otherwise."""
        if self.own_arithmetic is not None:
            return cast(Tensor, self.own_arithmetic.fast_log_softmax(logits))
        return torch.log_softmax(logits, -1, dtype=torch.float32)


def batch_bucket(n: int) -> int:
    """Sentence slots a batch keeps for `n` open sentences: 1, 2, 4, 8, then multiples of 8
    (at most 7 finished ones ride along as filler). Every new batch shape makes oneDNN build
    and cache new kernels (with a reordered copy of the weights): in bf16 that costs time
    and grows a long run's memory with its input."""
    if n <= 8:
        return 1 << max(0, (n - 1).bit_length())
    return -(-n // 8) * 8


def _shape_free_rows(layer: nn.Module) -> float:
    """Up to how many rows `layer`'s product builds no kernel for a new shape: the
    stand-ins as they say, an `nn.Linear` by its dtype, an unknown stand-in none."""
    if isinstance(layer, DecodeLinear):
        return layer.shape_free_rows()
    if isinstance(layer, nn.Linear):
        return _plain_rows(layer.weight)
    return 0.0


def _plain_rows(weight: Tensor) -> float:
    """PyTorch's own product with `weight` (`F.linear`): float32 builds no kernel per
    shape, oneDNN in other dtypes does."""
    return math.inf if weight.dtype == torch.float32 else 0.0


def decoding_kernel(
    compiled_step: bool,
    on_compile: Callable[[str], None] | None = None,
    on_fallback: Callable[[str], None] = lambda reason: None,
) -> tuple[ModuleType | None, str]:
    """The compiled module for decoding (built first if need be: `on_compile` is told how
    far the build has come, line by line; None: on stderr), or None and why not: not
    asked for (`compiled_step=False`), or it could not be built (`on_fallback` is told)."""
    if not compiled_step:
        return None, "the compiled module is not in use (the Python step)"
    try:
        return prepare_kernel(on_compile), ""
    except CompileError as exc:
        on_fallback(f"the compiled step could not be built: {exc}")
        return None, f"the compiled module could not be built: {exc}"


def cpu_decoders(
    models: list[Transformer],
    linears: LinearLayer,
    kernel: ModuleType | None,
    precision: str,
    on_fallback: Callable[[str], None] = lambda reason: None,
) -> list[CpuDecoder]:
    """Each model (on the CPU, in the precision's dtype, built with the plan's `linears`)
    wrapped for decoding, the rest of its arithmetic chosen (see the module's docstring);
    the models themselves are not changed.

    `kernel` is the compiled module (`decoding_kernel`; None: PyTorch's arithmetic and
    the reference step). Where a model has settings its step does not implement, or the
    module's names differ from this side's, `on_fallback` gets the reason and decoding
    runs the reference step (in Python) for that model."""
    decoders: list[CpuDecoder] = []
    for model in models:
        projection = output_projection(model, linears)
        gaps = unsupported(model.cfg, precision)
        if gaps and kernel is not None:
            on_fallback("the compiled step does not implement " + ", ".join(gaps))
        try:
            decoder = CpuDecoder(model, projection, kernel, structural=not gaps)
        except ContractError as exc:
            on_fallback(str(exc))
            decoder = CpuDecoder(model, projection, kernel, structural=False)
        decoders.append(decoder)
    return decoders


def output_projection(model: Transformer, linears: LinearLayer) -> DecodeLinear | None:
    """The tied output projection (the embedding matrix, and `output_bias`) in the form of
    the model's other linear layers; None where those are PyTorch's own (the embedding
    is multiplied as it is, `Transformer.logits`)."""
    if not isinstance(linears, DecodeLinears):
        return None
    return linears.of(model.output_weight, model.output_bias)
